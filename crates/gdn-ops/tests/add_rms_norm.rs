//! The CPU twin of `add_rms_norm` against the composed path it replaces in the model
//! (`(&h + delta)` then `candle_nn::ops::rms_norm`, as crates/qwen-gdn-model's layers do),
//! over the op's cases (tests/common/add_rms_norm.rs), and its input checks.

mod common;

use candle_core::{DType, Device, Tensor};
use common::add_rms_norm::{inputs, runs, seed};
use common::{max_rel, tensor, Ty};
use gdn_ops::ops::add_rms_norm::{add_rms_norm, supports};

/// The model's composed path: the residual add, then the RMSNorm.
fn composed(h: &Tensor, delta: Option<&Tensor>, w: &Tensor, eps: f32) -> (Tensor, Tensor) {
    let sum = match delta {
        Some(d) => (h + d).unwrap(),
        None => h.clone(),
    };
    let normed = candle_nn::ops::rms_norm(&sum, w, eps).unwrap();
    (sum, normed)
}

fn compare(i: usize, shape: &[usize], ty: Ty, with_delta: bool, tol: f32) {
    let x = inputs(shape, ty, seed(i, ty));
    let cols = *shape.last().unwrap();
    let h = tensor(&x.residual, shape, ty);
    let d = tensor(&x.delta, shape, ty);
    let w = tensor(&x.weight, &[cols], ty);
    let delta = with_delta.then_some(&d);
    let (sum, normed) = add_rms_norm(&h, delta, &w, 1e-6).unwrap();
    let (want_sum, want_normed) = composed(&h, delta, &w, 1e-6);
    assert_eq!(sum.dims(), shape);
    assert_eq!(normed.dims(), shape);
    assert_eq!(max_rel(&sum, &want_sum), 0.0, "{ty:?} {shape:?}: sum");
    let err = max_rel(&normed, &want_normed);
    assert!(
        err <= tol,
        "{ty:?} {shape:?} delta={with_delta}: normed off by {err}"
    );
}

#[test]
fn twin_matches_the_composed_path_in_f32() {
    for (i, shape, ty, delta) in runs(&[Ty::F32]) {
        compare(i, shape, ty, delta, 1e-5);
    }
}

#[test]
fn twin_matches_the_composed_path_in_bf16_and_f16() {
    for (i, shape, ty, delta) in runs(&[Ty::Bf16, Ty::F16]) {
        compare(i, shape, ty, delta, 2e-2);
    }
}

#[test]
fn without_a_delta_the_sum_is_the_residual_itself() {
    let h = Tensor::ones((2, 64), DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::ones(64, DType::F32, &Device::Cpu).unwrap();
    let (sum, _) = add_rms_norm(&h, None, &w, 1e-6).unwrap();
    assert_eq!(sum.id(), h.id());
}

#[test]
fn supports_covers_the_kernels() {
    assert!(supports(&zeros(&[1, 2048], DType::BF16)));
    assert!(supports(&zeros(&[2, 8192], DType::F16)));
    assert!(!supports(&zeros(&[1, 8193], DType::F32)));
    assert!(!supports(&zeros(&[1, 64], DType::F64)));
}

fn zeros(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype, &Device::Cpu).unwrap()
}

fn error(h: &Tensor, d: Option<&Tensor>, w: &Tensor, eps: f32) -> String {
    add_rms_norm(h, d, w, eps).unwrap_err().to_string()
}

#[test]
fn input_checks() {
    let dev = &Device::Cpu;
    let h = Tensor::zeros((2, 64), DType::F32, dev).unwrap();
    let w = Tensor::ones(64, DType::F32, dev).unwrap();
    let e = error(&h, Some(&zeros(&[2, 32], DType::F32)), &w, 1e-6);
    assert!(e.contains("delta [2, 32] must match"), "{e}");
    let e = error(&h, Some(&zeros(&[2, 64], DType::BF16)), &w, 1e-6);
    assert!(e.contains("delta is BF16"), "{e}");
    let e = error(&h, None, &Tensor::ones(32, DType::F32, dev).unwrap(), 1e-6);
    assert!(e.contains("weight [32], expected [64]"), "{e}");
    let e = error(&h, None, &Tensor::ones(64, DType::F16, dev).unwrap(), 1e-6);
    assert!(e.contains("weight is F16"), "{e}");
    let e = error(&h, None, &w, -1.0);
    assert!(e.contains("eps"), "{e}");
    let wide = Tensor::zeros((1, 8193), DType::F32, dev).unwrap();
    let e = error(
        &wide,
        None,
        &Tensor::ones(8193, DType::F32, dev).unwrap(),
        1e-6,
    );
    assert!(e.contains("no kernel"), "{e}");
    let empty = Tensor::zeros((0, 64), DType::F32, dev).unwrap();
    let e = error(&empty, None, &w, 1e-6);
    assert!(e.contains("no rows"), "{e}");
}
