//! The MoE combine's CPU twin (`gdn_ops::ops::moe_combine`) against the composed path of the
//! model's device plan, written here with plain candle ops: moe.rs `routed_on_device`'s
//! weighted sum (every slot, the shared expert included, as a routed one), the residual add
//! of model.rs, and RMSNorm (candle_nn's rms_norm maths), over the op's cases
//! (tests/common/moe_combine.rs); plus one test per input check.

mod common;

use candle_core::{DType, Device, Tensor, D};
use common::max_rel;
use common::moe_combine::{cases, Form};
use gdn_ops::ops::moe_combine::{moe_combine, moe_combine_rows, supports};

/// The composed path: the weighted sum in f32 cast back, the residual added in the activation
/// dtype, then `x · rsqrt(mean(x²) + eps) · w` in f32, rounded once.
fn composed(
    down: &Tensor,
    weights: &Tensor,
    residual: &Tensor,
    norm: &Tensor,
    eps: f32,
) -> (Tensor, Tensor) {
    let dtype = down.dtype();
    let weighted = down
        .to_dtype(DType::F32)
        .unwrap()
        .broadcast_mul(&weights.unsqueeze(D::Minus1).unwrap())
        .unwrap();
    let ffn = weighted.sum(1).unwrap().to_dtype(dtype).unwrap();
    let sum = (residual + ffn).unwrap();
    let x = sum.to_dtype(DType::F32).unwrap();
    let ms = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
    let normed = x
        .broadcast_div(&(ms + eps as f64).unwrap().sqrt().unwrap())
        .unwrap()
        .broadcast_mul(&norm.to_dtype(DType::F32).unwrap())
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    (sum, normed)
}

/// The op's decode cases with a norm (each also run without it, on the same inputs).
#[test]
fn twin_matches_the_composed_path() {
    for dtype in [DType::F32, DType::BF16] {
        let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
        for (i, c) in cases().into_iter().enumerate() {
            if c.form != (Form::Decode { norm: true }) {
                continue;
            }
            let (n, s, h) = (c.tokens, c.slots, c.hidden);
            let x = c.inputs(i, dtype);
            let (down, weights) = (&x.down, &x.weights);
            let (residual, norm) = (x.residual.unwrap(), x.norm_weight.unwrap());
            let (sum, normed) = moe_combine(down, weights, &residual, Some((&norm, 1e-6))).unwrap();
            let normed = normed.expect("a norm was asked for");
            assert_eq!((sum.dims(), sum.dtype()), (residual.dims(), dtype));
            let (want_sum, want_normed) = composed(down, weights, &residual, &norm, 1e-6);
            let (e1, e2) = (max_rel(&sum, &want_sum), max_rel(&normed, &want_normed));
            assert!(
                e1 <= tol && e2 <= tol,
                "{dtype:?} {n}x{s}x{h}: sum {e1:e}, normed {e2:e}"
            );
            // Without the norm: the same sum, no normed.
            let (plain, none) = moe_combine(down, weights, &residual, None).unwrap();
            assert!(none.is_none());
            assert_eq!(max_rel(&plain, &sum), 0.0);
        }
    }
}

/// The prefill form against the model's composed combine of grouped products
/// (`layers/moe/grouped.rs`): the outputs put back in pair order by `index_select`, then the
/// weighted sum in f32 cast back. `rows` holds the row of `down` of each pair (the op's
/// `Form::Rows` cases: a random grouped order).
#[test]
fn rows_form_matches_the_composed_scatter_and_sum() {
    for dtype in [DType::F32, DType::BF16] {
        let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
        for (i, c) in cases().into_iter().enumerate() {
            if !matches!(c.form, Form::Rows { .. }) {
                continue;
            }
            let (n, s, h) = (c.tokens, c.slots, c.hidden);
            let x = c.inputs(i, dtype);
            let (down, weights, rows) = (&x.down, &x.weights, x.rows.unwrap());
            let got = moe_combine_rows(down, &rows, weights).unwrap();
            assert_eq!((got.dims(), got.dtype()), (&[n, h][..], dtype));
            let index = rows.flatten_all().unwrap();
            let in_pair_order = down
                .index_select(&index, 0)
                .unwrap()
                .reshape((n, s, h))
                .unwrap();
            let want = in_pair_order
                .to_dtype(DType::F32)
                .unwrap()
                .broadcast_mul(&weights.unsqueeze(D::Minus1).unwrap())
                .unwrap()
                .sum(1)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let e = max_rel(&got, &want);
            assert!(e <= tol, "{dtype:?} {n}x{s}x{h}: {e:e}");
            // Read in place (rows in pair order), the same as the decode form without the
            // residual: a zero residual adds nothing.
            let (sum, _) = moe_combine(
                &in_pair_order,
                weights,
                &Tensor::zeros((n, h), dtype, &Device::Cpu).unwrap(),
                None,
            )
            .unwrap();
            assert_eq!(max_rel(&sum, &got), 0.0, "{dtype:?} {n}x{s}x{h}");
        }
    }
}

#[test]
fn rows_form_checks_its_inputs() {
    let (d, w) = (zeros(&[6, 8], DType::F32), zeros(&[2, 3], DType::F32));
    let rows = |shape: &[usize], dtype| zeros(shape, dtype);
    let e = |r: anyhow::Result<Tensor>| r.expect_err("an error").to_string();
    assert!(e(moe_combine_rows(
        &zeros(&[2, 3, 8], DType::F32),
        &rows(&[2, 3], DType::U32),
        &w
    ))
    .contains("must be [P, H]"));
    assert!(e(moe_combine_rows(&d, &rows(&[6], DType::U32), &w)).contains("must be [N, S]"));
    assert!(e(moe_combine_rows(&d, &rows(&[2, 3], DType::F32), &w)).contains("u32"));
    assert!(e(moe_combine_rows(&d, &rows(&[2, 4], DType::U32), &w)).contains("weights"));
    // No tokens: an empty result, no work.
    let empty = moe_combine_rows(&d, &rows(&[0, 3], DType::U32), &zeros(&[0, 3], DType::F32));
    assert_eq!(empty.unwrap().dims(), [0, 8]);
}

#[test]
fn outputs_take_the_residual_shape() {
    let down = Tensor::zeros((2, 3, 8), DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
    let residual = Tensor::ones((2, 1, 8), DType::F32, &Device::Cpu).unwrap();
    let (sum, _) = moe_combine(&down, &w, &residual, None).unwrap();
    assert_eq!(sum.dims(), [2, 1, 8]);
}

#[test]
fn supports_float_activations() {
    assert!(supports(11, 2048, DType::BF16));
    assert!(supports(1, 1, DType::F32));
    assert!(!supports(0, 2048, DType::BF16));
    assert!(!supports(11, 0, DType::BF16));
    assert!(!supports(11, 2048, DType::U32));
}

fn err(r: anyhow::Result<(Tensor, Option<Tensor>)>) -> String {
    r.expect_err("an error").to_string()
}

fn zeros(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype, &Device::Cpu).unwrap()
}

#[test]
fn rejects_down_that_is_not_three_dimensional() {
    let (w, r) = (zeros(&[2, 3], DType::F32), zeros(&[2, 8], DType::F32));
    assert!(
        err(moe_combine(&zeros(&[6, 8], DType::F32), &w, &r, None)).contains("must be [N, S, H]")
    );
}

#[test]
fn rejects_an_unsupported_dtype() {
    let (w, r) = (zeros(&[2, 3], DType::F32), zeros(&[2, 8], DType::U32));
    assert!(err(moe_combine(&zeros(&[2, 3, 8], DType::U32), &w, &r, None)).contains("no kernel"));
}

#[test]
fn rejects_weights_of_another_shape_or_dtype() {
    let (d, r) = (zeros(&[2, 3, 8], DType::F32), zeros(&[2, 8], DType::F32));
    assert!(err(moe_combine(&d, &zeros(&[2, 4], DType::F32), &r, None)).contains("weights"));
    assert!(err(moe_combine(&d, &zeros(&[2, 3], DType::BF16), &r, None)).contains("weights"));
}

#[test]
fn rejects_a_residual_of_another_shape_or_dtype() {
    let (d, w) = (zeros(&[2, 3, 8], DType::F32), zeros(&[2, 3], DType::F32));
    assert!(err(moe_combine(&d, &w, &zeros(&[3, 8], DType::F32), None)).contains("residual"));
    assert!(err(moe_combine(&d, &w, &zeros(&[2, 8], DType::BF16), None)).contains("residual"));
}

#[test]
fn rejects_a_norm_weight_of_another_shape_or_dtype() {
    let (d, w, r) = (
        zeros(&[2, 3, 8], DType::F32),
        zeros(&[2, 3], DType::F32),
        zeros(&[2, 8], DType::F32),
    );
    let bad = zeros(&[7], DType::F32);
    assert!(err(moe_combine(&d, &w, &r, Some((&bad, 1e-6)))).contains("norm weight"));
    let bad = zeros(&[8], DType::BF16);
    assert!(err(moe_combine(&d, &w, &r, Some((&bad, 1e-6)))).contains("norm weight"));
}
