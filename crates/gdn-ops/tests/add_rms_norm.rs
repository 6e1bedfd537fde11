//! The CPU twin of `add_rms_norm` against the composed path it replaces in the model
//! (`(&h + delta)` then `candle_nn::ops::rms_norm`, as crates/qwen-gdn-model's layers do),
//! and its input checks.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{tensor, values, Rng, Ty};
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

fn max_rel(got: &Tensor, want: &Tensor) -> f32 {
    let (g, w) = (values(got), values(want));
    let scale = w.iter().fold(0f32, |m, x| m.max(x.abs()));
    g.iter()
        .zip(&w)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

fn compare(ty: Ty, shape: &[usize], with_delta: bool, tol: f32) {
    let mut rng = Rng::new(shape.iter().product::<usize>() as u64 + ty.code() as u64);
    let n: usize = shape.iter().product();
    let cols = *shape.last().unwrap();
    let h = tensor(&rng.values(n, -3.0, 3.0, ty), shape, ty);
    let d = tensor(&rng.values(n, -3.0, 3.0, ty), shape, ty);
    let w = tensor(&rng.values(cols, 0.5, 1.5, ty), &[cols], ty);
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
    for shape in [&[1, 1, 2048][..], &[3, 200], &[2, 8192], &[5, 1]] {
        for delta in [true, false] {
            compare(Ty::F32, shape, delta, 1e-5);
        }
    }
}

#[test]
fn twin_matches_the_composed_path_in_bf16_and_f16() {
    for ty in [Ty::Bf16, Ty::F16] {
        for shape in [&[1, 1, 2048][..], &[3, 200]] {
            for delta in [true, false] {
                compare(ty, shape, delta, 2e-2);
            }
        }
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
    let t = |shape: &[usize], dtype| Tensor::zeros(shape, dtype, &Device::Cpu).unwrap();
    assert!(supports(&t(&[1, 2048], DType::BF16)));
    assert!(supports(&t(&[2, 8192], DType::F16)));
    assert!(!supports(&t(&[1, 8193], DType::F32)));
    assert!(!supports(&t(&[1, 64], DType::F64)));
}

fn error(h: &Tensor, d: Option<&Tensor>, w: &Tensor, eps: f32) -> String {
    add_rms_norm(h, d, w, eps).unwrap_err().to_string()
}

#[test]
fn input_checks() {
    let dev = &Device::Cpu;
    let h = Tensor::zeros((2, 64), DType::F32, dev).unwrap();
    let w = Tensor::ones(64, DType::F32, dev).unwrap();
    let e = error(
        &h,
        Some(&Tensor::zeros((2, 32), DType::F32, dev).unwrap()),
        &w,
        1e-6,
    );
    assert!(e.contains("delta [2, 32] must match"), "{e}");
    let e = error(
        &h,
        Some(&Tensor::zeros((2, 64), DType::BF16, dev).unwrap()),
        &w,
        1e-6,
    );
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
