//! What a device can compute in. bf16 is everywhere but on Metal before MSL 3.1 (macOS 13),
//! where neither our shaders' nor candle's bfloat kernels exist (both are behind
//! `__HAVE_BFLOAT__`), so a bf16 model would fail at its first kernel.

use anyhow::Result;
use candle_core::Device;

/// A one-kernel shader library whose only entry point exists where the compiler has
/// `bfloat`, behind the same `__HAVE_BFLOAT__` guard as the ops' shaders. Its own source, so
/// that asking needs no op's library (the shared backend reaches into no op).
#[cfg(any(feature = "metal", target_os = "macos"))]
const BF16_PROBE: crate::backend::metal::KernelSource = crate::backend::metal::KernelSource {
    file: "gdn-ops/src/capability.rs (bf16 probe)",
    text: "#include <metal_stdlib>
using namespace metal;
#if defined(__HAVE_BFLOAT__)
kernel void bf16_probe(device bfloat *x [[buffer(0)]]) { x[0] = x[0] + bfloat(1.0f); }
#endif
",
    headers: &[],
};

/// Whether kernels can take bf16 tensors on `device`. On Metal this compiles a probe shader
/// (once per device; later calls reuse it) and asks for its bfloat entry point.
pub fn bf16_supported(device: &Device) -> Result<bool> {
    match device {
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(dev) => crate::backend::metal::has_function(dev, &BF16_PROBE, "bf16_probe"),
        _ => Ok(true),
    }
}
