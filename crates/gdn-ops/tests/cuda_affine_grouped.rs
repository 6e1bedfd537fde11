//! The grouped quantized GEMM on CUDA (`kernels/affine_grouped.cu` through
//! [`AffineTensor::grouped_matmul_t`]) against its CPU twin: every (x, scale) dtype pair, the
//! bit widths and group sizes, experts without pairs, with one pair, with counts crossing the
//! 64-pair tiles, and the Qwen3-Next-80B expert shapes (gate/up `[1024, 2048]`, down
//! `[2048, 512]`, 4 bits, group 64, bf16) with 512 tokens' pairs routed over the experts: the
//! op's cases (tests/common/affine_grouped.rs). Built only with the `cuda` feature and run on
//! the GPU machine (scripts/gpu/test-cuda.sh); without a CUDA device every test fails.
//!
//! Measure: ‖got − want‖ / ‖want‖ over all elements (NaN fails): f32 2e-5, f16 1e-3, bf16
//! 8e-3 (both round the same weights once and sum in f32 in different orders).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::affine_grouped::{cases, inputs, seed, Case};
use common::{assert_rel_err, gpu, random_matrix, rel_l2, tolerance, Rng};
use gdn_ops::launches;
use gdn_ops::ops::affine::AffineTensor;

/// Case `i` of the op's cases on the GPU and the CPU; also checks that the GPU ran one launch.
fn check(dev: &Device, i: usize, c: &Case) {
    let inputs = inputs(c, seed(i));
    let (x_dtype, offsets, pairs) = (c.x.dtype(), &inputs.offsets, c.pairs());
    let x = inputs.x_tensor(c);
    let cpu = AffineTensor::upload(&inputs.m, &Device::Cpu).unwrap();
    let want = cpu.grouped_matmul_t(&x, offsets).unwrap();
    let on_gpu = AffineTensor::upload(&inputs.m, dev).unwrap();
    let x_gpu = x.to_device(dev).unwrap();
    launches::take();
    let got = on_gpu.grouped_matmul_t(&x_gpu, offsets).unwrap();
    let launched = launches::take();
    let kernel = on_gpu.supports_grouped_kernel(x_dtype);
    let nonzero = c.counts.iter().filter(|&&n| n > 0).count();
    let what = format!(
        "grouped {} × {} experts, {pairs} pairs",
        c.label(),
        c.counts.len()
    );
    if kernel {
        assert_eq!(launched, 1, "{what}: one launch for every expert");
    } else {
        assert!(launched >= nonzero, "{what}: the per-expert path");
    }
    assert_eq!(got.dims(), [pairs, c.rows]);
    assert_eq!(got.dtype(), x_dtype);
    assert_rel_err(&what, rel_l2(&got, &want), tolerance(x_dtype));
}

/// The op's cases (tests/common/affine_grouped.rs) that `pick` takes.
fn check_cases(pick: impl Fn(&Case) -> bool) {
    let dev = gpu();
    for (i, c) in cases().iter().enumerate() {
        if pick(c) {
            check(&dev, i, c);
        }
    }
}

/// Qwen3-Next-80B's expert shapes routed over its 64 experts.
fn model_shape(c: &Case) -> bool {
    c.counts.len() == 64
}

/// The 4-bit cases: every (x, scale) instantiation, experts without pairs (first, middle,
/// last), one pair, counts around the 64-pair tiles.
#[test]
fn every_instantiation_matches_the_cpu_twin() {
    check_cases(|c| c.bits == 4 && !model_shape(c));
}

/// The other bit widths (3, 5 and 6 bits: no kernel, the per-expert path) and group sizes.
#[test]
fn bit_widths_and_group_sizes_match_the_cpu_twin() {
    check_cases(|c| c.bits != 4);
}

/// Qwen3-Next-80B's expert shapes, 512 tokens × 11 slots routed at random over 64 experts
/// (some left without pairs).
#[test]
fn model_shapes_match_the_cpu_twin() {
    check_cases(model_shape);
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
