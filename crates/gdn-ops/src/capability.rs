//! What a device can compute in. bf16 is everywhere but on Metal before MSL 3.1 (macOS 13),
//! where neither our shaders' nor candle's bfloat kernels exist (both are behind
//! `__HAVE_BFLOAT__`), so a bf16 model would fail at its first kernel.

use anyhow::Result;
use candle_core::Device;

/// Whether kernels can take bf16 tensors on `device`. On Metal this compiles our affine
/// shader library (once per device; later calls reuse it) and asks for a bfloat entry point.
pub fn bf16_supported(device: &Device) -> Result<bool> {
    match device {
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(dev) => crate::backend::metal::bf16_supported(dev),
        _ => Ok(true),
    }
}
