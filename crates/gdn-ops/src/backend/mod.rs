//! What every op's backends share: the kernel-name tag of a dtype, and per backend the
//! loading of shipped kernel sources, buffer views, output wrapping and the launch itself
//! (which is where launches are counted, see [`crate::launches`]).

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use anyhow::{bail, Result};
use candle_core::DType;

/// The kernel-name suffix of a float dtype (`<kernel>_<tag>` instantiations in `kernels/`).
pub fn dtype_tag(dtype: DType, op: &str) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => bail!("{op}: no kernel for {other:?}"),
    })
}

/// `x` rounded to a float dtype and back (round to nearest even, as the kernels' conversions):
/// where a CPU twin stores a value in the activation dtype.
pub(crate) fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}
