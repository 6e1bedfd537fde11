//! The CPU twin of `attn_prefill` against the composed path it replaces in the model
//! (`attend_dense` of crates/qwen-gdn-model's attention layer, [`composed_causal_attention`])
//! on views of KV buffers longer than the context, and its input checks: empty chunks, shapes
//! that do not match, the devices it supports.
//!
//! Gate: every output within 2 ulp of InT of the composed path's plus a share of max
//! |composed| (4e-3 in bf16, 1e-3 in f16, 1e-5 in f32; seen: 2.9e-3 in bf16): the two round the scores at the same
//! points, but the composed path rounds the normalized probabilities to InT where the twin
//! rounds the unnormalized ones, and both round the output.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{close, composed_causal_attention, tensor, values, Rng, Ty, TYPES};
use gdn_ops::launches;
use gdn_ops::ops::attn_prefill::{attn_prefill, supports};

/// (B, Nq, Nkv, Dh, S, offset, cap): a first chunk, later chunks over cached keys, GQA 1, 2
/// and 8, Dh 64, 128 and 256, one query.
const SHAPES: [(usize, usize, usize, usize, usize, usize, usize); 6] = [
    (1, 8, 1, 256, 70, 0, 70),
    (1, 8, 1, 256, 33, 100, 160),
    (2, 4, 2, 64, 100, 37, 140),
    (1, 4, 4, 64, 65, 64, 129),
    (1, 4, 2, 128, 1, 90, 96),
    (1, 2, 1, 16, 17, 5, 22),
];

fn inputs(
    seed: u64,
    ty: Ty,
    shape: (usize, usize, usize, usize, usize, usize, usize),
) -> [Tensor; 3] {
    let (b, nq, nkv, dh, s, offset, cap) = shape;
    let mut rng = Rng::new(seed);
    let spread = 3.0 / (dh as f32).powf(0.25);
    let q = tensor(
        &rng.values(b * nq * s * dh, -spread, spread, ty),
        &[b, nq, s, dh],
        ty,
    );
    let kv_shape = [b, nkv, cap, dh];
    let kv_len: usize = kv_shape.iter().product();
    let k = tensor(&rng.values(kv_len, -spread, spread, ty), &kv_shape, ty);
    let v = tensor(&rng.values(kv_len, -2.0, 2.0, ty), &kv_shape, ty);
    let t = offset + s;
    [q, k.narrow(2, 0, t).unwrap(), v.narrow(2, 0, t).unwrap()]
}

/// The gate's share of max |composed| (see the module doc).
fn relative_allowance(ty: Ty) -> f32 {
    match ty {
        Ty::Bf16 => 4e-3,
        Ty::F16 => 1e-3,
        Ty::F32 => 1e-5,
    }
}

#[test]
fn twin_matches_the_composed_path() {
    let mut failures = vec![];
    for (i, &shape) in SHAPES.iter().enumerate() {
        for ty in TYPES {
            let [q, k, v] = inputs(i as u64 * 17 + ty.code() as u64, ty, shape);
            let offset = shape.5;
            let got = attn_prefill(&q, &k, &v, offset).unwrap();
            let want = composed_causal_attention(&q, &k, &v, offset);
            if let Some(e) = close(
                "out",
                &values(&got),
                &values(&want),
                ty,
                2.0,
                relative_allowance(ty),
            ) {
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
