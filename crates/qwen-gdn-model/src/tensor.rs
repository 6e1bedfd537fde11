//! Tensor helpers that launch a kernel only when one is needed, counted where they launch
//! (`launches::candle_op`: a candle op costs one kernel on a GPU, docs/metal.md).

use anyhow::Result;
use candle_core::{DType, Tensor};
use gdn_ops::launches::candle_op;

/// A copy kernel when `x` is a strided view, none otherwise.
pub fn contiguous(x: &Tensor) -> Result<Tensor> {
    if x.is_contiguous() {
        Ok(x.clone())
    } else {
        candle_op(x.contiguous())
    }
}

/// A cast kernel when the dtype changes, none otherwise.
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype {
        Ok(x.clone())
    } else {
        candle_op(x.to_dtype(dtype))
    }
}

/// A compact copy of `t` (only its elements, contiguous) that shares no storage with it:
/// `contiguous` returns `t` itself when it already is, `copy` keeps a view's whole storage.
pub fn own_copy(t: &Tensor) -> Result<Tensor> {
    candle_op(t.force_contiguous())
}

/// The largest |element| of `t`, as f32: the tests' measure of a difference between two paths.
#[cfg(test)]
pub(crate) fn max_abs(t: &Tensor) -> f32 {
    t.to_dtype(candle_core::DType::F32)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}
