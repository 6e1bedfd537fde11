//! The CUDA kernels `kernels/gated_rms_norm.cu` against the CPU twin, for every instantiation
//! (f32, f16, bf16), on fresh random inputs over the op's cases (tests/common/gated_rms_norm.rs),
//! with z as a slice of a merged projection output. Built only with the `cuda`
//! feature and run on the GPU machine; without a CUDA device every test fails.
//!
//! Measure: max |got − want| / max |want| (NaN fails): f32 to 2e-5, f16 and bf16 (rounded on
//! each side from nearby f32 values) to 1e-3 and 8e-3.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::gated_rms_norm::{cases, projection_inputs};
use common::{gpu, rel_max, Rng};
use gdn_ops::ops::gated_rms_norm::gated_rms_norm;

#[test]
fn gated_rms_norm_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_6A7E);
    for s in cases() {
        let (b, t, hv, dv) = s.dims();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let seed = rng.next();
            let [y, z, w] = projection_inputs(&mut Rng::xorshift(seed | 1), s.dims(), dtype);
            let run = |dev: &Device| {
                let up = |x: &Tensor| x.to_device(dev).unwrap();
                gated_rms_norm(&up(&y), &up(&z), &up(&w), 1e-6).unwrap()
            };
            let (want, got) = (run(&Device::Cpu), run(&dev));
            let tol = match dtype {
                DType::BF16 => 8e-3,
                DType::F16 => 1e-3,
                _ => 2e-5,
            };
            let e = rel_max(&got, &want);
            let what = format!("gated_rms_norm B{b} T{t} Hv{hv} Dv{dv} {dtype:?} (seed {seed:#x})");
            eprintln!("{what}: rel err {e:.2e} (tol {tol:.0e})");
            assert!(e <= tol, "{what}: rel err {e:e} > {tol:e}");
        }
    }
}
