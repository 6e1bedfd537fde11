//! The device time of one op's launches, per backend (see the parent module for why each
//! clock).

use anyhow::Result;
use candle_core::Device;
use std::time::{Duration, Instant};

/// Runs `f` and returns its result with the device time of the work it queued.
pub(super) fn time<R>(device: &Device, f: impl FnOnce() -> Result<R>) -> Result<(R, Duration)> {
    match device {
        // The twin runs on the calling thread: its wall time is its time.
        Device::Cpu => {
            let start = Instant::now();
            let out = f()?;
            Ok((out, start.elapsed()))
        }
        // GPU time between two events, host launch latency hidden behind a spin kernel.
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => super::cuda::time(dev, f),
        // Metal: the host clock between two drains of the device. It includes the commit of
        // the command buffer and the wait for its completion (a round trip of some tens of
        // µs), so small kernels read slower than they run inside a step.
        _ => {
            device.synchronize()?;
            let start = Instant::now();
            let out = f()?;
            device.synchronize()?;
            Ok((out, start.elapsed()))
        }
    }
}
