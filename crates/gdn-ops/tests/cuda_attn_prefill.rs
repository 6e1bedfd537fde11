//! The CUDA `attn_prefill_{f16,bf16}` kernel (`kernels/attn_prefill.cu`) against the CPU twin
//! and against the composed path it replaces ([`composed_causal_attention`], candle's ops on
//! the GPU), over the op's cases (tests/common/attn_prefill.rs) and at Qwen3-Next's real
//! shapes. Built only with the `cuda` feature and run on
//! the GPU machine (scripts/gpu/test-cuda.sh); without a CUDA device every test fails.
//!
//! K and V are views of longer buffers narrowed to T, as the KV cache passes them.
//!
//! Gates: against the twin, every output within 2 ulp of InT plus 4e-3 of max |twin| in bf16,
//! 1e-3 in f16 (as tests/attn_prefill_cuda_emulation.rs: the same roundings from f32 sums in
//! other orders); against the composed path, the same (as tests/attn_prefill.rs: the composed
//! path rounds the normalized probabilities).
//!
//! `cuda_attn_prefill_real_shapes` prints the kernel's time per call (and the dense composed
//! path's, one unblocked block: the model's blocked path differs a little): run it with
//! `--nocapture`.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::attn_prefill::{cases, compare, inputs, seed, shape, Shape};
use common::{composed_causal_attention, gpu, values, Ty};
use gdn_ops::launches;
use gdn_ops::ops::attn_prefill::attn_prefill;
use std::time::Instant;

/// q, k and v of a case on the CPU and on `gpu`, the same values.
fn on_both(s: Shape, ty: Ty, seed: u64, gpu: &Device) -> ([Tensor; 3], [Tensor; 3]) {
    let x = inputs(s, ty, seed);
    (x.tensors(s, ty, &Device::Cpu), x.tensors(s, ty, gpu))
}

#[test]
fn cuda_attn_prefill_matches_the_cpu_twin() {
    let gpu = gpu();
    let mut failures = vec![];
    for (i, shape) in cases().into_iter().enumerate() {
        for ty in [Ty::F16, Ty::Bf16] {
            let (cpu, [q, k, v]) = on_both(shape, ty, seed(i, ty), &gpu);
            let got = attn_prefill(&q, &k, &v, shape.offset).unwrap();
            let want = attn_prefill(&cpu[0], &cpu[1], &cpu[2], shape.offset).unwrap();
            assert_eq!(got.dims(), want.dims());
            if let Some(e) = compare(&values(&got), &want, ty) {
                failures.push(format!("attn_prefill_{} {shape:?}: {e}", ty.name()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Qwen3-Next-80B's attention (Nq 16, Nkv 2, Dh 256, bf16) on 2048-token chunks: the first
/// (T 2048) and the second (offset 2048, T 4096), K and V views of 8192-position buffers.
/// The whole output against the composed path on the GPU; rows at the start, across a tile
/// boundary and at the end against the twin (a chunk of rows i0..i0+n is the same attention at
/// offset + i0 over keys up to offset + i0 + n).
#[test]
fn cuda_attn_prefill_real_shapes() {
    let gpu = gpu();
    let ty = Ty::Bf16;
    let mut failures = vec![];
    for offset in [0, 2048] {
        let (cpu, [q, k, v]) = on_both(
            shape(1, 16, 2, 256, 2048, offset, 8192),
            ty,
            offset as u64 + 5,
            &gpu,
        );
        launches::take();
        let got = attn_prefill(&q, &k, &v, offset).unwrap();
        assert_eq!(launches::take(), 1, "one launch");
        let composed = composed_causal_attention(&q, &k, &v, offset);
        if let Some(e) = compare(&values(&got), &composed, ty) {
            failures.push(format!("against the composed path, offset {offset}: {e}"));
        }
        for (i0, n) in [(0, 64), (1000, 100), (1984, 64)] {
            let t = offset + i0 + n;
            let want = attn_prefill(
                &cpu[0].narrow(2, i0, n).unwrap(),
                &cpu[1].narrow(2, 0, t).unwrap(),
                &cpu[2].narrow(2, 0, t).unwrap(),
                offset + i0,
            )
            .unwrap();
            let rows = got.narrow(2, i0, n).unwrap();
            if let Some(e) = compare(&values(&rows), &want, ty) {
                failures.push(format!(
                    "against the twin, offset {offset}, rows {i0}..{}: {e}",
                    i0 + n
                ));
            }
        }
        // Time per call, after a warm-up.
        let time = |f: &dyn Fn() -> Tensor| {
            let _ = f();
            gpu.synchronize().unwrap();
            let start = Instant::now();
            let reps = 20;
            for _ in 0..reps {
                let _ = f();
            }
            gpu.synchronize().unwrap();
            start.elapsed().as_secs_f64() * 1e3 / reps as f64
        };
        let kernel_ms = time(&|| attn_prefill(&q, &k, &v, offset).unwrap());
        let composed_ms = time(&|| composed_causal_attention(&q, &k, &v, offset));
        let t = offset + 2048;
        // Causal FLOPs: 2 products of 2·Dh per visible (query, key) pair, 16 heads.
        let pairs: f64 = (0..2048).map(|i| (offset + i + 1).min(t) as f64).sum();
        let tflops = 16.0 * pairs * 4.0 * 256.0 / (kernel_ms * 1e-3) / 1e12;
        eprintln!(
            "attn_prefill S 2048 T {t}: kernel {kernel_ms:.3} ms ({tflops:.0} TFLOPS), dense composed {composed_ms:.3} ms"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cuda_attn_prefill_empty_and_bad_inputs() {
    let gpu = gpu();
    let z = |dims: &[usize], dtype: DType| Tensor::zeros(dims, dtype, &gpu).unwrap();
    let bf = DType::BF16;
    launches::take();
    let out = attn_prefill(
        &z(&[1, 16, 0, 256], bf),
        &z(&[1, 2, 8, 256], bf),
        &z(&[1, 2, 8, 256], bf),
        8,
    )
    .unwrap();
    assert_eq!(out.dims(), [1, 16, 0, 256]);
    let out = attn_prefill(
        &z(&[1, 16, 4, 256], bf),
        &z(&[1, 2, 0, 256], bf),
        &z(&[1, 2, 0, 256], bf),
        0,
    )
    .unwrap();
    assert_eq!(out.dims(), [1, 16, 4, 256]);
    assert_eq!(launches::take(), 0, "an empty chunk launches nothing");
    let bad = [
        (
            z(&[1, 16, 4, 256], bf),
            z(&[1, 2, 4, 128], bf),
            z(&[1, 2, 4, 128], bf),
        ),
        (
            z(&[1, 16, 4, 256], bf),
            z(&[1, 3, 4, 256], bf),
            z(&[1, 3, 4, 256], bf),
        ),
        (
            z(&[1, 16, 4, 256], bf),
            z(&[1, 2, 4, 256], bf),
            z(&[1, 2, 5, 256], bf),
        ),
        // No kernel: f32, a head dim not a multiple of 16, one past 256.
        (
            z(&[1, 4, 4, 64], DType::F32),
            z(&[1, 2, 4, 64], DType::F32),
            z(&[1, 2, 4, 64], DType::F32),
        ),
        (
            z(&[1, 4, 4, 72], bf),
            z(&[1, 2, 4, 72], bf),
            z(&[1, 2, 4, 72], bf),
        ),
        (
            z(&[1, 4, 4, 272], bf),
            z(&[1, 2, 4, 272], bf),
            z(&[1, 2, 4, 272], bf),
        ),
    ];
    for (q, k, v) in bad {
        let e = attn_prefill(&q, &k, &v, 0).unwrap_err().to_string();
        assert!(
            e.starts_with("attn_prefill: ") && !e.contains('\n'),
            "{q:?}: {e}"
        );
    }
}
