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
use common::{assert_rel_err, gpu, random_matrix, rel_l2, Rng};
use gdn_ops::ops::affine::AffineTensor;

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

/// Products (plain, and gathered by expert id with one or k rows per token) and row
/// dequantization, at every bit width and group size, against the CPU twin.
#[test]
fn affine_kernels_match_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_0002);
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32, 64, 128] {
            for scale_dtype in [DType::F32, DType::F16, DType::BF16] {
                let (experts, rows, cols) = (5, 24 + rng.below(40), 256);
                let m = random_matrix(&mut rng, bits, group, [experts, rows, cols], scale_dtype);
                let (cpu, gpu_m) = (
                    AffineTensor::upload(&m, &Device::Cpu).unwrap(),
                    AffineTensor::upload(&m, &dev).unwrap(),
                );
                let case = format!("{bits}-bit g{group} scales {scale_dtype:?}");
                for x_dtype in [DType::F32, DType::BF16] {
                    let tol = tolerance(&[x_dtype]);
                    let x = rng.tensor(&[3, cols], -1.0, 1.0).to_dtype(x_dtype).unwrap();
                    let xg = x.to_device(&dev).unwrap();
                    // Dense: stacks of one expert only; take expert 0 through a gathered product.
                    let ids: Vec<u32> = (0..3 * 2).map(|_| rng.below(experts) as u32).collect();
                    let ids = Tensor::from_vec(ids, (3, 2), &Device::Cpu).unwrap();
                    let idsg = ids.to_device(&dev).unwrap();
                    let want = cpu.gather_matmul_t(&x, &ids).unwrap();
                    let got = gpu_m.gather_matmul_t(&xg, &idsg).unwrap();
                    assert_rel_err(
                        &format!("{case}: gathered products, {x_dtype:?}, one row per token"),
                        rel_l2(&got, &want),
                        tol,
                    );
                    let x3 = rng
                        .tensor(&[3, 2, cols], -1.0, 1.0)
                        .to_dtype(x_dtype)
                        .unwrap();
                    let want = cpu.gather_matmul_t(&x3, &ids).unwrap();
                    let got = gpu_m
                        .gather_matmul_t(&x3.to_device(&dev).unwrap(), &idsg)
                        .unwrap();
                    assert_rel_err(
                        &format!("{case}: gathered products, {x_dtype:?}, a row per slot"),
                        rel_l2(&got, &want),
                        tol,
                    );
                    for out_dtype in [DType::F32, DType::BF16] {
                        let want = cpu
                            .dequantize(Some(&ids.flatten_all().unwrap()), 6, out_dtype)
                            .unwrap();
                        let got = gpu_m
                            .dequantize(Some(&idsg.flatten_all().unwrap()), 6, out_dtype)
                            .unwrap();
                        // One rounding of the same f32 value on both sides: exact.
                        assert_rel_err(
                            &format!("{case}: dequantize rows by id into {out_dtype:?}"),
                            rel_l2(&got, &want),
                            0.0,
                        );
                    }
                }
                let first = cpu.dequantize(None, rows, DType::F32).unwrap();
                let got = gpu_m.dequantize(None, rows, DType::F32).unwrap();
                assert_rel_err(
                    &format!("{case}: dequantize the first rows"),
                    rel_l2(&got, &first),
                    0.0,
                );
            }
        }
    }
    // A single matrix, decode-shaped and prefill-shaped.
    let m = random_matrix(&mut rng, 4, 64, [1, 96, 512], DType::BF16);
    let (cpu, gpu_m) = (
        AffineTensor::upload(&m, &Device::Cpu).unwrap(),
        AffineTensor::upload(&m, &dev).unwrap(),
    );
    for n in [1, 3, 17] {
        let x = rng.tensor(&[n, 512], -1.0, 1.0);
        let want = cpu.matmul_t(&x).unwrap();
        let got = gpu_m.matmul_t(&x.to_device(&dev).unwrap()).unwrap();
        assert_rel_err(
            &format!("4-bit matmul, {n} rows, f32"),
            rel_l2(&got, &want),
            tolerance(&[DType::F32]),
        );
    }
}
