//! Composed candle definitions the twins are checked against.

use candle_core::{DType, Tensor, D};

/// candle_nn::ops::rms_norm's CPU definition (gdn-ops does not depend on candle-nn):
/// `x / sqrt(mean(x²) + eps) · alpha` with the mean square in f32, rounded once to x's dtype.
pub fn candle_nn_rms_norm(x: &Tensor, alpha: &Tensor, eps: f32) -> Tensor {
    let dtype = x.dtype();
    let xf = x.contiguous().unwrap().to_dtype(DType::F32).unwrap();
    let m = (xf.sqr().unwrap().mean_keepdim(D::Minus1).unwrap() + eps as f64)
        .unwrap()
        .sqrt()
        .unwrap();
    xf.broadcast_div(&m)
        .unwrap()
        .broadcast_mul(&alpha.to_dtype(DType::F32).unwrap())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}
