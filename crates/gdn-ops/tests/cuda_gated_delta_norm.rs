//! The CUDA kernels `kernels/gated_delta_norm.cu` (the recurrence with the gated RMSNorm folded
//! in) against the CPU twin, for every InT/StT instantiation, on fresh random inputs: decode
//! and prefill at the real head sizes and edge sizes, z a slice of a merged projection. Built
//! only with the `cuda` feature and run on the GPU machine; without a CUDA device every test
//! fails.
//!
//! Measure: max |got − want| / max |want| (NaN fails): f32 to 2e-5; an f16 or bf16 output or
//! state, rounded on each side from nearby f32 values, to 1e-3 and 8e-3 (the output is
//! rounded three times on the way, so it gets twice that).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::{gpu, rel_max, tolerance, Rng};
use gdn_ops::ops::gated_delta_norm::gated_delta_update_norm;

#[test]
fn gated_delta_norm_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_D17A);
    // (B, T, Hk, Hv, Dk, Dv)
    let shapes = [
        (1, 1, 16, 32, 128, 128),
        (4, 1, 16, 64, 128, 128),
        (1, 37, 4, 8, 128, 128),
        (2, 9, 1, 1, 32, 96),
        (1, 5, 2, 2, 256, 256),
        (2, 3, 1, 3, 64, 20),
    ];
    for &(b, t, hk, hv, dk, dv) in &shapes {
        for in_dtype in [DType::F32, DType::F16, DType::BF16] {
            for st_dtype in [DType::F32, DType::BF16] {
                let seed = rng.next();
                let mut r = Rng::xorshift(seed | 1);
                let scale = 1.0 / (dk as f64).sqrt();
                let c = |x: Tensor| x.to_dtype(in_dtype).unwrap();
                let q = c((r.tensor(&[b, t, hk, dk], -1.0, 1.0) * scale).unwrap());
                let k = c((r.tensor(&[b, t, hk, dk], -1.0, 1.0) * scale).unwrap());
                let v = c(r.tensor(&[b, t, hv, dv], -1.0, 1.0));
                let g = r.tensor(&[b, t, hv], 0.85, 1.0);
                let beta = r.tensor(&[b, t, hv], 0.0, 1.0);
                let state = r
                    .tensor(&[b, hv, dv, dk], -0.5, 0.5)
                    .to_dtype(st_dtype)
                    .unwrap();
                let proj = c(r.tensor(&[b, t, 2 * hv * dv + 5], -6.0, 6.0));
                let w = c(r.tensor(&[dv], 0.5, 1.5));
                let run = |dev: &Device| {
                    let up = |x: &Tensor| x.to_device(dev).unwrap();
                    // A copy: on the CPU `to_device` shares storage, and the twin advances
                    // the state in place before the GPU's run would read it.
                    let st = state.to_device(dev).unwrap().copy().unwrap();
                    let proj = up(&proj);
                    let z = proj.narrow(2, hv * dv + 5, hv * dv).unwrap();
                    let out = gated_delta_update_norm(
                        &up(&q),
                        &up(&k),
                        &up(&v),
                        &up(&g),
                        &up(&beta),
                        &st,
                        &z,
                        &up(&w),
                        1e-6,
                    )
                    .unwrap();
                    (out, st)
                };
                let (want, want_state) = run(&Device::Cpu);
                let (got, got_state) = run(&dev);
                let what = format!(
                    "gated_delta_norm B{b} T{t} Hk{hk} Hv{hv} Dk{dk} Dv{dv} {in_dtype:?}/{st_dtype:?} (seed {seed:#x})"
                );
                for (name, e, tol) in [
                    ("out", rel_max(&got, &want), 2.0 * tolerance(in_dtype)),
                    (
                        "state",
                        rel_max(&got_state, &want_state),
                        tolerance(st_dtype),
                    ),
                ] {
                    eprintln!("{what}: {name} rel err {e:.2e} (tol {tol:.0e})");
                    assert!(e <= tol, "{what}: {name} rel err {e:e} > {tol:e}");
                }
            }
        }
    }
}
