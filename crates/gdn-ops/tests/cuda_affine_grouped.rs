//! The grouped quantized GEMM on CUDA (`kernels/affine_grouped.cu` through
//! [`AffineTensor::grouped_matmul_t`]) against its CPU twin: every (x, scale) dtype pair, the
//! bit widths and group sizes, experts without pairs, with one pair, with counts crossing the
//! 64-pair tiles, and the Qwen3-Next-80B expert shapes (gate/up `[1024, 2048]`, down
//! `[2048, 512]`, 4 bits, group 64, bf16) with 512 tokens' pairs routed over the experts. Built
//! only with the `cuda` feature and run on the GPU machine (scripts/gpu/test-cuda.sh); without
//! a CUDA device every test fails.
//!
//! Measure: ‖got − want‖ / ‖want‖ over all elements (NaN fails): f32 2e-5, f16 1e-3, bf16
//! 8e-3 (both round the same weights once and sum in f32 in different orders).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::{assert_rel_err, gpu, random_matrix, rel_l2, tolerance, Rng};
use gdn_ops::launches;
use gdn_ops::ops::affine::AffineTensor;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// One case on the GPU and the CPU; also checks that the GPU ran one launch.
#[allow(clippy::too_many_arguments)]
fn check(
    rng: &mut Rng,
    dev: &Device,
    bits: usize,
    group: usize,
    [rows, cols]: [usize; 2],
    counts: &[usize],
    x_dtype: DType,
    scale_dtype: DType,
) {
    let m = random_matrix(rng, bits, group, [counts.len(), rows, cols], scale_dtype);
    let offsets = common::row_offsets(counts);
    let pairs = *offsets.last().unwrap() as usize;
    let x = rng.tensor_as(&[pairs, cols], -1.0, 1.0, x_dtype);
    let cpu = AffineTensor::upload(&m, &Device::Cpu).unwrap();
    let want = cpu.grouped_matmul_t(&x, &offsets).unwrap();
    let on_gpu = AffineTensor::upload(&m, dev).unwrap();
    let x_gpu = x.to_device(dev).unwrap();
    launches::take();
    let got = on_gpu.grouped_matmul_t(&x_gpu, &offsets).unwrap();
    let launched = launches::take();
    let kernel = on_gpu.supports_grouped_kernel(x_dtype);
    let nonzero = counts.iter().filter(|&&c| c > 0).count();
    let what = format!(
        "grouped {bits}-bit g{group} x {x_dtype:?} scales {scale_dtype:?} [{rows}, {cols}] × {} experts, {pairs} pairs",
        counts.len()
    );
    if kernel {
        assert_eq!(launched, 1, "{what}: one launch for every expert");
    } else {
        assert!(launched >= nonzero, "{what}: the per-expert path");
    }
    assert_eq!(got.dims(), [pairs, rows]);
    assert_eq!(got.dtype(), x_dtype);
    assert_rel_err(&what, rel_l2(&got, &want), tolerance(x_dtype));
}

#[test]
fn every_instantiation_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_A700);
    for x_dtype in DTYPES {
        for scale_dtype in DTYPES {
            // Experts without pairs (first, middle, last), one pair, 64, 65 and 130 pairs.
            let counts = [0, 1, 64, 0, 65, 3, 130, 0];
            check(
                &mut rng,
                &dev,
                4,
                64,
                [96, 256],
                &counts,
                x_dtype,
                scale_dtype,
            );
        }
    }
}

#[test]
fn bit_widths_and_group_sizes_match_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_A701);
    for bits in [2, 3, 4, 8] {
        for group in [32, 64, 128] {
            // 3 bits: no kernel, the per-expert path.
            let counts = [5, 0, 70, 1];
            check(
                &mut rng,
                &dev,
                bits,
                group,
                [128, 256],
                &counts,
                DType::BF16,
                DType::BF16,
            );
        }
    }
}

/// Qwen3-Next-80B's expert shapes, 512 tokens × 11 slots routed at random over 64 experts
/// (some left without pairs).
#[test]
fn model_shapes_match_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_A702);
    let experts = 64;
    let mut counts = vec![0usize; experts];
    for _ in 0..512 * 11 {
        // Skewed: a few experts take many pairs, several none.
        let e = (rng.below(experts) * rng.below(experts)) / experts;
        counts[e] += 1;
    }
    eprintln!("pairs per expert: {counts:?}");
    for (rows, cols) in [(1024, 2048), (2048, 512)] {
        check(
            &mut rng,
            &dev,
            4,
            64,
            [rows, cols],
            &counts,
            DType::BF16,
            DType::BF16,
        );
    }
}

#[test]
fn bad_offsets_are_one_line_errors() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_A703);
    let m = random_matrix(&mut rng, 4, 64, [3, 64, 128], DType::BF16);
    let m = AffineTensor::upload(&m, &dev).unwrap();
    let x = Tensor::zeros((4, 128), DType::BF16, &dev).unwrap();
    for bad in [
        vec![0, 1, 4],
        vec![0, 2, 1, 4],
        vec![1, 2, 3, 4],
        vec![0, 1, 2, 5],
    ] {
        let err = m.grouped_matmul_t(&x, &bad).unwrap_err().to_string();
        assert!(
            err.starts_with("grouped matmul:") && !err.contains('\n'),
            "{bad:?}: {err}"
        );
    }
}
