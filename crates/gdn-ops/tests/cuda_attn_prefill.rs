//! The CUDA `attn_prefill_{f16,bf16}` kernel (`kernels/attn_prefill.cu`) against the CPU twin
//! and against the composed path it replaces ([`composed_causal_attention`], candle's ops on
//! the GPU), at Qwen3-Next's shapes and odd ones. Built only with the `cuda` feature and run on
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
use common::{close, composed_causal_attention, gpu, tensor, values, Rng, Ty};
use gdn_ops::launches;
use gdn_ops::ops::attn_prefill::attn_prefill;
use std::time::Instant;

/// (B, Nq, Nkv, Dh, S, offset, cap).
type Shape = (usize, usize, usize, usize, usize, usize, usize);

fn relative_allowance(ty: Ty) -> f32 {
    if ty == Ty::Bf16 {
        4e-3
    } else {
        1e-3
    }
}

/// q `[B, Nq, S, Dh]` and k, v `[B, Nkv, offset + S, Dh]` views of `[B, Nkv, cap, Dh]`
/// buffers, on `device` (the buffers are made on the CPU, moved whole, then narrowed there).
fn inputs(
    seed: u64,
    ty: Ty,
    (b, nq, nkv, dh, s, offset, cap): Shape,
    device: &Device,
) -> [Tensor; 3] {
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
    let view = |x: Tensor| {
        x.to_device(device)
            .unwrap()
            .narrow(2, 0, offset + s)
            .unwrap()
    };
    [q.to_device(device).unwrap(), view(k), view(v)]
}

#[test]
fn cuda_attn_prefill_matches_the_cpu_twin() {
    let gpu = gpu();
    let mut failures = vec![];
    let shapes: [Shape; 9] = [
        // Qwen3-Next's heads on short chunks: a first chunk, a later one.
        (1, 16, 2, 256, 200, 0, 200),
        (1, 16, 2, 256, 130, 300, 512),
        // One query; fewer than a tile; GQA 1; Dh 64, 128 (its scale rounds), 16; batches.
        (1, 16, 2, 256, 1, 77, 128),
        (2, 4, 2, 64, 100, 37, 140),
        (1, 4, 4, 64, 65, 64, 129),
        (2, 8, 2, 128, 129, 3, 200),
        (1, 2, 1, 16, 33, 130, 200),
        // Tile-exact: S and T multiples of 64.
        (1, 8, 1, 256, 128, 128, 256),
        (3, 2, 1, 256, 64, 0, 64),
    ];
    for (i, &shape) in shapes.iter().enumerate() {
        for ty in [Ty::F16, Ty::Bf16] {
            let seed = i as u64 * 101 + ty.code() as u64;
            let cpu = inputs(seed, ty, shape, &Device::Cpu);
            let [q, k, v] = inputs(seed, ty, shape, &gpu);
            let offset = shape.5;
            let got = attn_prefill(&q, &k, &v, offset).unwrap();
            let want = attn_prefill(&cpu[0], &cpu[1], &cpu[2], offset).unwrap();
            assert_eq!(got.dims(), want.dims());
            if let Some(e) = close(
                "out",
                &values(&got),
                &values(&want),
                ty,
                2.0,
                relative_allowance(ty),
            ) {
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
        let shape: Shape = (1, 16, 2, 256, 2048, offset, 8192);
        let cpu = inputs(offset as u64 + 5, ty, shape, &Device::Cpu);
        let [q, k, v] = inputs(offset as u64 + 5, ty, shape, &gpu);
        launches::take();
        let got = attn_prefill(&q, &k, &v, offset).unwrap();
        assert_eq!(launches::take(), 1, "one launch");
        let composed = composed_causal_attention(&q, &k, &v, offset);
        if let Some(e) = close(
            "out",
            &values(&got),
            &values(&composed),
            ty,
            2.0,
            relative_allowance(ty),
        ) {
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
            if let Some(e) = close(
                "out",
                &values(&rows),
                &values(&want),
                ty,
                2.0,
                relative_allowance(ty),
            ) {
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
