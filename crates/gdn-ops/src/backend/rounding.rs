//! What the CPU twins share: a tensor's values in f32, and the rounding of an f32 value to an
//! activation dtype (round to nearest even, as the kernels' conversions do).

use anyhow::Result;
use candle_core::{DType, Tensor};
use half::{bf16, f16};

/// Every element of `t` (any float dtype, any layout) in f32, row-major.
pub(crate) fn f32_values(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

/// `x` rounded to a float dtype and back (round to nearest even, as the kernels' conversions):
/// where a CPU twin stores a value in the activation dtype. Other dtypes leave it as is.
pub(crate) fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}
