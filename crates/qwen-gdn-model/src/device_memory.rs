//! GPU memory as the device counts it, which the process's resident set does not show
//! (mlx-lm reports its GPU peak the same way).
//!
//! On Metal, candle's buffer pool releases what a forward call dropped only at the next host
//! sync (candle-core 0.11.1 `src/metal_backend/device.rs:145–162`), so the allocated size just
//! before a sync is the high-water mark since the previous one: the model samples there
//! (after each prefill chunk, and when logits are produced). `MTLDevice.currentAllocatedSize`
//! and `recommendedMaxWorkingSetSize` are read through candle-metal-kernels 0.11.1
//! `src/metal/device.rs:134–140`.

use candle_core::Device;
use std::sync::atomic::{AtomicU64, Ordering};

static PEAK: AtomicU64 = AtomicU64::new(0);

/// Bytes allocated on the device now; `None` where it cannot be asked (the CPU). On Metal the
/// allocator's own count; on CUDA the device's used memory, `total − free` from
/// `cuMemGetInfo` (cudarc 0.19.10 `CudaContext::mem_get_info`, `src/driver/safe/core.rs:321`,
/// reached through candle-core 0.11.1 `CudaDevice::cuda_stream`,
/// `src/cuda_backend/device.rs:288`), which also counts the CUDA context itself.
pub fn allocated_bytes(device: &Device) -> Option<u64> {
    match device {
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(dev) => Some(dev.device().current_allocated_size() as u64),
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            let (free, total) = dev.cuda_stream().context().mem_get_info().ok()?;
            Some(total.saturating_sub(free) as u64)
        }
        _ => None,
    }
}

/// Records the allocated size now into the process-wide peak.
pub fn sample(device: &Device) {
    if let Some(bytes) = allocated_bytes(device) {
        PEAK.fetch_max(bytes, Ordering::Relaxed);
    }
}

/// The largest allocated size sampled so far; `None` before any sample on a GPU.
pub fn peak_bytes() -> Option<u64> {
    match PEAK.load(Ordering::Relaxed) {
        0 => None,
        bytes => Some(bytes),
    }
}

/// Memory the device can use without paging: Metal's recommended working-set size (on Apple
/// Silicon, the GPU wired-memory limit, `iogpu.wired_limit_mb`, about 75% of RAM by
/// default); `None` where it cannot be asked.
pub fn working_set_bytes(device: &Device) -> Option<u64> {
    match device {
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(dev) => Some(dev.device().recommended_max_working_set_size() as u64),
        _ => None,
    }
}

/// Memory the device could still allocate: on Metal the working set less what is allocated,
/// on CUDA the driver's free memory; `None` where it cannot be asked (the CPU, whose caller
/// asks the operating system).
pub fn free_bytes(device: &Device) -> Option<u64> {
    match device {
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(_) => {
            Some(working_set_bytes(device)?.saturating_sub(allocated_bytes(device)?))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => {
            let (free, _total) = dev.cuda_stream().context().mem_get_info().ok()?;
            Some(free as u64)
        }
        _ => None,
    }
}
