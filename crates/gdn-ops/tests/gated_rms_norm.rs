//! The CPU twin of `gated_rms_norm` against the composed path it replaces: the model's
//! `GatedRmsNorm::forward` (crates/qwen-gdn-model/src/layers/norm.rs) written with plain
//! candle ops, over the op's cases (tests/common/gated_rms_norm.rs) on random inputs, with z as a slice of a merged projection output (as the
//! model will pass it). Plus one test per input check.

mod common;

use candle_core::{DType, Device, Tensor};
use common::gated_rms_norm::{cases, projection_inputs};
use common::{candle_nn_rms_norm, rel_max, values, Rng};
use gdn_ops::ops::gated_rms_norm::{gated_rms_norm, supports};

/// `GatedRmsNorm::forward`, after `GatedDeltaNet::forward`'s `contiguous(&z)?.reshape(..)`.
fn composed(y: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Tensor {
    let (b, s, hv, dv) = y.dims4().unwrap();
    let z = z.contiguous().unwrap().reshape((b, s, hv, dv)).unwrap();
    let n = candle_nn_rms_norm(y, &weight.to_dtype(y.dtype()).unwrap(), eps)
        .to_dtype(DType::F32)
        .unwrap();
    let gate = z.to_dtype(DType::F32).unwrap().silu().unwrap();
    (gate * n).unwrap().to_dtype(y.dtype()).unwrap()
}

fn inputs(shape: (usize, usize, usize, usize), dtype: DType, seed: u64) -> [Tensor; 3] {
    projection_inputs(&mut Rng::new(seed), shape, dtype)
}

fn compare(shape: (usize, usize, usize, usize), dtype: DType, tol: f32, seed: u64) {
    let [y, z, w] = inputs(shape, dtype, seed);
    assert!(
        shape.0 * shape.1 == 1 || !z.is_contiguous(),
        "the test means to pass a view"
    );
    let got = gated_rms_norm(&y, &z, &w, 1e-6).unwrap();
    let want = composed(&y, &z, &w, 1e-6);
    assert_eq!(got.dtype(), dtype);
    assert_eq!(got.dims(), y.dims());
    let e = rel_max(&got, &want);
    assert!(
        e <= tol,
        "{shape:?} {dtype:?}: off by {e:e} of max|ref| (tol {tol:e})"
    );
}

#[test]
fn twin_matches_the_composed_path_in_f32() {
    for (i, s) in cases().iter().enumerate() {
        compare(s.dims(), DType::F32, 1e-5, 1 + i as u64);
    }
}

#[test]
fn twin_matches_the_composed_path_in_bf16() {
    for (i, s) in cases().iter().enumerate() {
        compare(s.dims(), DType::BF16, 2e-2, 100 + i as u64);
    }
}

#[test]
fn twin_takes_a_four_dim_contiguous_z_alike() {
    let [y, z, w] = inputs((2, 3, 4, 32), DType::F32, 6);
    let z4 = z.contiguous().unwrap().reshape((2, 3, 4, 32)).unwrap();
    let a = gated_rms_norm(&y, &z, &w, 1e-6).unwrap();
    let b = gated_rms_norm(&y, &z4, &w, 1e-6).unwrap();
    assert_eq!(values(&a), values(&b));
}

#[test]
fn supports_float_activations() {
    assert!(supports(DType::F32) && supports(DType::F16) && supports(DType::BF16));
    assert!(!supports(DType::F64));
}

fn assert_error(result: anyhow::Result<Tensor>, needle: &str) {
    let e = result.expect_err("the op must reject this").to_string();
    assert!(e.contains(needle), "error `{e}` should mention `{needle}`");
    assert!(!e.contains('\n'), "one-line errors: `{e}`");
}

#[test]
fn rejects_y_that_is_not_four_dim() {
    let [y, z, w] = inputs((1, 1, 4, 32), DType::F32, 7);
    assert_error(
        gated_rms_norm(&y.squeeze(1).unwrap(), &z, &w, 1e-6),
        "must be [B, T, Hv, Dv]",
    );
}

#[test]
fn rejects_a_strided_y() {
    let [y, z, w] = inputs((1, 2, 4, 32), DType::F32, 8);
    let y = y
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    assert_error(gated_rms_norm(&y, &z, &w, 1e-6), "y must be contiguous");
}

#[test]
fn rejects_a_weight_of_the_wrong_length() {
    let [y, z, w] = inputs((1, 1, 4, 32), DType::F32, 9);
    assert_error(
        gated_rms_norm(&y, &z, &w.narrow(0, 0, 16).unwrap(), 1e-6),
        "weight [16]",
    );
}

#[test]
fn rejects_mixed_dtypes() {
    let [y, z, w] = inputs((1, 1, 4, 32), DType::F32, 10);
    assert_error(
        gated_rms_norm(&y, &z.to_dtype(DType::BF16).unwrap(), &w, 1e-6),
        "z is BF16",
    );
    assert_error(
        gated_rms_norm(&y, &z, &w.to_dtype(DType::F16).unwrap(), 1e-6),
        "weight is F16",
    );
}

#[test]
fn rejects_unsupported_dtypes() {
    let [y, z, w] = inputs((1, 1, 4, 32), DType::F64, 11);
    assert_error(gated_rms_norm(&y, &z, &w, 1e-6), "must be f32, f16 or bf16");
}

#[test]
fn rejects_z_of_another_shape() {
    let [y, z, w] = inputs((2, 1, 4, 32), DType::F32, 12);
    assert_error(
        gated_rms_norm(&y, &z.narrow(2, 0, 64).unwrap(), &w, 1e-6),
        "z [2, 1, 64]",
    );
}

#[test]
fn rejects_z_rows_that_are_not_contiguous() {
    let [y, _, w] = inputs((1, 2, 4, 32), DType::F32, 13);
    let z = Tensor::zeros((1, 2, 4 * 32, 2), DType::F32, &Device::Cpu)
        .unwrap()
        .narrow(3, 0, 1)
        .unwrap()
        .squeeze(3)
        .unwrap();
    assert_error(gated_rms_norm(&y, &z, &w, 1e-6), "must be contiguous");
}

#[test]
fn rejects_a_negative_eps() {
    let [y, z, w] = inputs((1, 1, 4, 32), DType::F32, 14);
    assert_error(gated_rms_norm(&y, &z, &w, -1.0), "eps must be finite");
}
