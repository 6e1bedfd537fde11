//! The CUDA kernels `kernels/gated_delta_norm.cu` (the recurrence with the gated RMSNorm folded
//! in) against the CPU twin, for every InT/StT instantiation, on fresh random inputs over the
//! op's cases (tests/common/gated_delta_norm.rs), z a slice of a merged projection, the
//! output gate silu and sigmoid on alternate instantiations. Built
//! only with the `cuda` feature and run on the GPU machine; without a CUDA device every test
//! fails.
//!
//! Measure: max |got − want| / max |want| (NaN fails): f32 to 2e-5; an f16 or bf16 output or
//! state, rounded on each side from nearby f32 values, to 1e-3 and 8e-3 (the output is
//! rounded three times on the way, so it gets twice that).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::gated_delta_norm::{cases, norm_tensors, z_of};
use common::{gpu, rel_max, tolerance, Rng};
use gdn_ops::ops::gated_delta_norm::{gated_delta_update_norm, Gate};

#[test]
fn gated_delta_norm_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_D17A);
    for (i, c) in cases().into_iter().enumerate() {
        let (b, t, hk, hv, dk, dv) = c.d.tuple();
        for (j, in_dtype) in [DType::F32, DType::F16, DType::BF16]
            .into_iter()
            .enumerate()
        {
            for (l, st_dtype) in [DType::F32, DType::BF16].into_iter().enumerate() {
                let gate = [Gate::Silu, Gate::Sigmoid][(i + j + l) % 2];
                let seed = rng.next();
                let [q, k, v, g, beta, state, proj, w] =
                    norm_tensors(&mut Rng::xorshift(seed | 1), c.d, in_dtype, st_dtype);
                let run = |dev: &Device| {
                    let up = |x: &Tensor| x.to_device(dev).unwrap();
                    // A copy: on the CPU `to_device` shares storage, and the twin advances
                    // the state in place before the GPU's run would read it.
                    let st = state.to_device(dev).unwrap().copy().unwrap();
                    let z = z_of(&up(&proj), c.d);
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
                        gate,
                    )
                    .unwrap();
                    (out, st)
                };
                let (want, want_state) = run(&Device::Cpu);
                let (got, got_state) = run(&dev);
                let what = format!(
                    "gated_delta_norm B{b} T{t} Hk{hk} Hv{hv} Dk{dk} Dv{dv} {in_dtype:?}/{st_dtype:?} {gate:?} (seed {seed:#x})"
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
