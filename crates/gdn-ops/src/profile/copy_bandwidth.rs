//! The copy bandwidth of a device, the yardstick of the decode profile's "% of copy": one
//! large buffer copied on the device, read and written bytes counted (as the STREAM copy
//! and `scripts/gpu/bench-cuda.sh` count them), the median over repetitions after warm-ups.
//!
//! GPUs: 1 GiB device to device (on CUDA `cuMemcpyDtoDAsync` between two buffers allocated
//! once, timed with the profile's events; on Metal candle's buffer copy, drained host
//! clock). CPU: 256 MiB, far above the caches, copied in 1 MiB pieces on every worker of the
//! CPU pool.

use anyhow::Result;
use candle_core::Device;
use std::time::{Duration, Instant};

/// A measured copy bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyBandwidth {
    /// (read + written bytes) per second.
    pub bytes_per_second: f64,
    /// Size of the copied buffer.
    pub buffer_bytes: usize,
    /// Timed copies (the median is taken).
    pub repetitions: usize,
}

const GPU_BYTES: usize = 1 << 30;
const CPU_BYTES: usize = 256 << 20;
const WARM_UPS: usize = 2;
const REPETITIONS: usize = 7;

/// Measures the copy bandwidth of `device` (a few hundred ms).
pub fn copy_bandwidth(device: &Device) -> Result<CopyBandwidth> {
    let (bytes, times) = match device {
        Device::Cpu => (CPU_BYTES, cpu_copies(CPU_BYTES)),
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => (
            GPU_BYTES,
            super::cuda::copy_times(dev, GPU_BYTES, WARM_UPS + REPETITIONS)?,
        ),
        _ => (GPU_BYTES, candle_copies(device, GPU_BYTES)?),
    };
    let mut timed: Vec<Duration> = times.into_iter().skip(WARM_UPS).collect();
    timed.sort();
    let median = timed[timed.len() / 2].as_secs_f64().max(1e-12);
    Ok(CopyBandwidth {
        bytes_per_second: 2.0 * bytes as f64 / median,
        buffer_bytes: bytes,
        repetitions: timed.len(),
    })
}

fn cpu_copies(bytes: usize) -> Vec<Duration> {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 20;
    // Written, not calloc'ed: untouched pages would all read as the one zero page.
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    crate::threads::on_cpu_pool(|| {
        (0..WARM_UPS + REPETITIONS)
            .map(|_| {
                let start = Instant::now();
                dst.par_chunks_mut(PIECE)
                    .zip(src.par_chunks(PIECE))
                    .for_each(|(d, s)| d.copy_from_slice(s));
                start.elapsed()
            })
            .collect()
    })
}

/// Metal (and any other GPU without its own path): candle's copy of a device tensor.
fn candle_copies(device: &Device, bytes: usize) -> Result<Vec<Duration>> {
    let src = candle_core::Tensor::ones(bytes / 4, candle_core::DType::U32, device)?;
    (0..WARM_UPS + REPETITIONS)
        .map(|_| Ok(super::timer::time(device, || Ok(src.copy()?))?.1))
        .collect()
}
