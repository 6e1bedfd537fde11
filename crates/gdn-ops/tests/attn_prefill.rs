//! The CPU twin of `attn_prefill` against the composed path it replaces in the model
//! (`attend_dense` of crates/qwen-gdn-model's attention layer, [`composed_causal_attention`])
//! on views of KV buffers longer than the context, over the op's cases (tests/common/attn_prefill.rs),
//! and its input checks: empty chunks, shapes
//! that do not match, the devices it supports.
//!
//! Gate: every output within 2 ulp of InT of the composed path's plus a share of max
//! |composed| (4e-3 in bf16, 1e-3 in f16, 1e-5 in f32; seen: 2.9e-3 in bf16): the two round the scores at the same
//! points, but the composed path rounds the normalized probabilities to InT where the twin
//! rounds the unnormalized ones, and both round the output.

mod common;

use candle_core::{DType, Device, Tensor};
use common::attn_prefill::{cases, compare, inputs, seed};
use common::{composed_causal_attention, values, TYPES};
use gdn_ops::launches;
use gdn_ops::ops::attn_prefill::{attn_prefill, supports};

#[test]
fn twin_matches_the_composed_path() {
    let mut failures = vec![];
    for (i, shape) in cases().into_iter().enumerate() {
        for ty in TYPES {
            let [q, k, v] = inputs(shape, ty, seed(i, ty)).tensors(shape, ty, &Device::Cpu);
            let got = attn_prefill(&q, &k, &v, shape.offset).unwrap();
            let want = composed_causal_attention(&q, &k, &v, shape.offset);
            if let Some(e) = compare(&values(&got), &want, ty) {
                failures.push(format!("{} {shape:?}: {e}", ty.name()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn empty_chunks_launch_nothing() {
    let cpu = Device::Cpu;
    let z = |dims: &[usize]| Tensor::zeros(dims, DType::BF16, &cpu).unwrap();
    launches::take();
    // No queries: an empty result.
    let out = attn_prefill(
        &z(&[1, 4, 0, 64]),
        &z(&[1, 2, 10, 64]),
        &z(&[1, 2, 10, 64]),
        10,
    )
    .unwrap();
    assert_eq!(out.dims(), [1, 4, 0, 64]);
    // No keys: nothing attended, zeros.
    let out = attn_prefill(
        &z(&[1, 4, 3, 64]),
        &z(&[1, 2, 0, 64]),
        &z(&[1, 2, 0, 64]),
        0,
    )
    .unwrap();
    assert_eq!(out.dims(), [1, 4, 3, 64]);
    assert_eq!(launches::take(), 0, "an empty chunk launches nothing");
}

#[test]
fn shapes_that_do_not_match_give_a_one_line_error() {
    let cpu = Device::Cpu;
    let z = |dims: &[usize]| Tensor::zeros(dims, DType::BF16, &cpu).unwrap();
    let q = z(&[1, 4, 3, 64]);
    let cases = [
        (z(&[1, 4, 64]), z(&[1, 2, 3, 64]), z(&[1, 2, 3, 64]), "q"),
        (q.clone(), z(&[1, 2, 3, 32]), z(&[1, 2, 3, 32]), "k"),
        (q.clone(), z(&[1, 2, 3, 64]), z(&[1, 2, 4, 64]), "v"),
        (
            q.clone(),
            z(&[1, 3, 3, 64]),
            z(&[1, 3, 3, 64]),
            "query heads",
        ),
        (q.clone(), z(&[2, 2, 3, 64]), z(&[2, 2, 3, 64]), "k"),
        (
            q.clone(),
            z(&[1, 2, 3, 64]).to_dtype(DType::F16).unwrap(),
            z(&[1, 2, 3, 64]).to_dtype(DType::F16).unwrap(),
            "F16",
        ),
    ];
    for (q, k, v, what) in cases {
        let e = attn_prefill(&q, &k, &v, 0).unwrap_err().to_string();
        assert!(
            e.starts_with("attn_prefill: ") && !e.contains('\n') && e.contains(what),
            "{q:?} {k:?} {v:?}: {e}"
        );
    }
}

#[test]
fn supports_only_cuda_f16_bf16_head_dims_multiple_of_16() {
    // The CPU keeps its own path in the model (the twin is for tests).
    assert!(!supports(&Device::Cpu, 256, 16, 2, DType::BF16));
    #[cfg(feature = "cuda")]
    if let Ok(gpu) = Device::new_cuda(0) {
        assert!(supports(&gpu, 256, 16, 2, DType::BF16));
        assert!(supports(&gpu, 64, 8, 8, DType::F16));
        assert!(supports(&gpu, 16, 1, 1, DType::BF16));
        assert!(!supports(&gpu, 256, 16, 2, DType::F32));
        assert!(!supports(&gpu, 272, 16, 2, DType::BF16));
        assert!(!supports(&gpu, 72, 16, 2, DType::BF16));
        assert!(!supports(&gpu, 256, 16, 3, DType::BF16));
    }
}
