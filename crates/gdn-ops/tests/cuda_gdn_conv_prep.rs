//! The CUDA kernels `kernels/gdn_conv_prep.cu` against the CPU twin, for every instantiation
//! (f32, f16, bf16), on fresh random inputs: the real Qwen3-Next-80B-A3B and Qwen3.5 shapes
//! and edge sizes, with qkv, b and a as slices of one merged projection output. Built only
//! with the `cuda` feature and run on the GPU machine; without a CUDA device every test
//! fails.
//!
//! Measure: max |got − want| / max |want| per output (NaN fails). The conv state is only
//! moved: bit for bit. f32 outputs to 2e-5 (summation order, rsqrtf); f16 and bf16 outputs,
//! rounded once on each side from nearby f32 values, to one ulp of the dtype at the largest
//! value (1e-3 and 8e-3).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::{gpu, rel_max, tolerance, values, Rng};
use gdn_ops::ops::gdn_conv_prep::{gdn_conv_prep, ConvPrepDims};

#[test]
fn gdn_conv_prep_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_C0DE);
    // (Hk, Dk, Hv, Dv, K, B)
    let shapes = [
        (16, 128, 32, 128, 4, 1),
        (16, 128, 32, 128, 4, 3),
        (16, 128, 64, 128, 4, 2),
        (1, 256, 3, 96, 8, 2),
        (2, 32, 4, 64, 2, 5),
    ];
    for &(hk, dk, hv, dv, kk, batch) in &shapes {
        let d = ConvPrepDims {
            key_heads: hk,
            key_dim: dk,
            value_heads: hv,
            value_dim: dv,
            kernel_size: kk,
        };
        let (c, z) = (d.channels(), hv * dv);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let seed = rng.next();
            let mut r = Rng::xorshift(seed | 1);
            let proj = Tensor::cat(
                &[
                    r.tensor(&[batch, 1, c + z], -2.0, 2.0),
                    r.tensor(&[batch, 1, 2 * hv], -10.0, 10.0),
                ],
                2,
            )
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
            let state = r
                .tensor(&[batch, kk - 1, c], -2.0, 2.0)
                .to_dtype(dtype)
                .unwrap();
            let taps = r.tensor(&[kk, c], -0.6, 0.6).to_dtype(dtype).unwrap();
            let dt_bias = r.tensor(&[hv], -1.0, 1.0);
            let neg_a_exp = r.tensor(&[hv], -3.0, 2.5).exp().unwrap().neg().unwrap();
            let run = |dev: &Device| {
                let up = |t: &Tensor| t.to_device(dev).unwrap();
                // A copy of the state: on the CPU `to_device` shares storage, and the twin
                // shifts the conv window in place before the GPU's run would read it.
                let (proj, st) = (up(&proj), state.to_device(dev).unwrap().copy().unwrap());
                let out = gdn_conv_prep(
                    &proj.narrow(2, 0, c).unwrap(),
                    &proj.narrow(2, c + z, hv).unwrap(),
                    &proj.narrow(2, c + z + hv, hv).unwrap(),
                    &st,
                    &up(&taps),
                    &up(&dt_bias),
                    &up(&neg_a_exp),
                    d,
                )
                .unwrap();
                (out, st)
            };
            let (want, want_state) = run(&Device::Cpu);
            let (got, got_state) = run(&dev);
            let what = format!("gdn_conv_prep {d:?} B{batch} {dtype:?} (seed {seed:#x})");
            assert_eq!(
                values(&got_state),
                values(&want_state),
                "{what}: conv state"
            );
            for (name, g, w, tol) in [
                ("q", &got.q, &want.q, tolerance(dtype)),
                ("k", &got.k, &want.k, tolerance(dtype)),
                ("v", &got.v, &want.v, tolerance(dtype)),
                ("g", &got.g, &want.g, tolerance(DType::F32)),
                ("beta", &got.beta, &want.beta, tolerance(DType::F32)),
            ] {
                let e = rel_max(g, w);
                eprintln!("{what}: {name} rel err {e:.2e} (tol {tol:.0e})");
                assert!(e <= tol, "{what}: {name} rel err {e:e} > {tol:e}");
            }
        }
    }
}
