//! The CUDA kernels (`kernels/*.cu`) against the CPU reference, on fresh random inputs for
//! every dtype combination they are instantiated for. Built only with the `cuda` feature and
//! run on the GPU machine (scripts/gpu/test-cuda.sh); without a CUDA device every test fails.
//!
//! Measure: ‖got − want‖ / ‖want‖ over all elements (NaN fails). f32 throughout is held to
//! 2e-5 (summation order only); a bf16 or f16 output or state, rounded once on each side
//! from nearby f32 values, to 8e-3 and 1e-3.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::affine::{self, Kind};
use common::{assert_rel_err, gpu, rel_l2, Rng};

fn tolerance(dtypes: &[DType]) -> f32 {
    if dtypes.contains(&DType::BF16) {
        8e-3
    } else if dtypes.contains(&DType::F16) {
        1e-3
    } else {
        2e-5
    }
}

/// Every InT/StT entry point, with and without a padding mask, against the CPU recurrence
/// run on the same rounded inputs; both outputs and the advanced state are compared.
#[test]
fn gated_delta_matches_the_cpu_reference() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_0001);
    // (B, T, Hk, Hv, Dk, Dv): decode, prefill, GQA 1 and 2, the head sizes of both families.
    let shapes = [
        (1, 1, 16, 32, 128, 128),
        (2, 1, 2, 4, 64, 32),
        (1, 37, 4, 8, 128, 128),
        (2, 9, 1, 1, 32, 96),
        (1, 5, 2, 2, 256, 64),
    ];
    for &(b, t, hk, hv, dk, dv) in &shapes {
        for in_dtype in [DType::F32, DType::F16, DType::BF16] {
            for st_dtype in [DType::F32, DType::BF16] {
                for masked in [false, true] {
                    let seed = rng.next();
                    let mut r = Rng::xorshift(seed | 1);
                    let scale = 1.0 / (dk as f32).sqrt();
                    let q = (r.tensor(&[b, t, hk, dk], -1.0, 1.0) * scale as f64).unwrap();
                    let k = (r.tensor(&[b, t, hk, dk], -1.0, 1.0) * scale as f64).unwrap();
                    let v = r.tensor(&[b, t, hv, dv], -1.0, 1.0);
                    let g = r.tensor(&[b, t, hv], 0.85, 1.0);
                    let beta = r.tensor(&[b, t, hv], 0.0, 1.0);
                    let state = r.tensor(&[b, hv, dv, dk], -0.5, 0.5);
                    let mask = masked.then(|| {
                        let m: Vec<f32> = (0..b * t)
                            .map(|i| if i % 3 == 1 { 0.0 } else { 1.0 })
                            .collect();
                        Tensor::from_vec(m, (b, t), &Device::Cpu).unwrap()
                    });
                    let cast = |x: &Tensor, d: DType| x.to_dtype(d).unwrap();
                    let (q, k, v) = (cast(&q, in_dtype), cast(&k, in_dtype), cast(&v, in_dtype));
                    let state = cast(&state, st_dtype);
                    let cpu_state = state.copy().unwrap();
                    let want = gdn_ops::gated_delta_update_masked(
                        &q,
                        &k,
                        &v,
                        &g,
                        &beta,
                        &cpu_state,
                        mask.as_ref(),
                    )
                    .unwrap();
                    let up = |x: &Tensor| x.to_device(&dev).unwrap();
                    let gpu_state = up(&state);
                    let got = gdn_ops::gated_delta_update_masked(
                        &up(&q),
                        &up(&k),
                        &up(&v),
                        &up(&g),
                        &up(&beta),
                        &gpu_state,
                        mask.as_ref().map(up).as_ref(),
                    )
                    .unwrap();
                    let what = format!(
                        "gated_delta B{b} T{t} Hk{hk} Hv{hv} Dk{dk} Dv{dv} {in_dtype:?}/{st_dtype:?} mask {masked} (seed {seed:#x})"
                    );
                    assert_rel_err(
                        &format!("{what}: y"),
                        rel_l2(&got, &want),
                        tolerance(&[in_dtype]),
                    );
                    assert_rel_err(
                        &format!("{what}: state"),
                        rel_l2(&gpu_state, &cpu_state),
                        tolerance(&[st_dtype]),
                    );
                }
            }
        }
    }
}

/// The affine family's products (tests/common/affine.rs: plain, and gathered by expert id with
/// one or k rows per token, at every bit width, group size and type pair), and row
/// dequantization of each case's matrix, against the CPU twin.
#[test]
fn affine_kernels_match_the_cpu_twin() {
    let dev = gpu();
    for (i, c) in affine::cases_of(Kind::Products) {
        let ([cpu, gpu_m], [want, got]) = affine::on_cpu_and(&dev, i, &c);
        let x_dtype = c.x.dtype();
        let what = c.label();
        assert_rel_err(
            &format!("{what}: products"),
            rel_l2(&got, &want),
            tolerance(&[x_dtype]),
        );
        let rows = c.experts * c.rows;
        let ids: Vec<u32> = (0..6).map(|j| ((j * 7 + i) % rows) as u32).collect();
        let ids = Tensor::from_vec(ids, 6, &Device::Cpu).unwrap();
        let idsg = ids.to_device(&dev).unwrap();
        for out_dtype in [DType::F32, DType::BF16] {
            let want = cpu.dequantize(Some(&ids), 6, out_dtype).unwrap();
            let got = gpu_m.dequantize(Some(&idsg), 6, out_dtype).unwrap();
            // One rounding of the same f32 value on both sides: exact.
            assert_rel_err(
                &format!("{what}: dequantize rows by id into {out_dtype:?}"),
                rel_l2(&got, &want),
                0.0,
            );
        }
        let first = cpu.dequantize(None, c.rows, DType::F32).unwrap();
        let got = gpu_m.dequantize(None, c.rows, DType::F32).unwrap();
        assert_rel_err(
            &format!("{what}: dequantize the first rows"),
            rel_l2(&got, &first),
            0.0,
        );
    }
}
