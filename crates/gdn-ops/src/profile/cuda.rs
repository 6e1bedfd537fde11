//! The GPU time of one op on CUDA: the stream drained, a spin kernel (`kernels/profile_spin.cu`)
//! queued, then an event, the op's launches, a second event; the time between the two events.
//!
//! Why the spin: on a drained stream the first event fires as soon as it is queued, and the
//! GPU then waits for the host to queue the op (the launch latency, several µs per launch):
//! that wait would be charged to the op. While the spin runs (~50 µs, longer than the host
//! needs to queue an op's launches) the host queues the event and the launches behind it, so
//! the first event fires when the spin ends and the op starts at once.

use crate::backend::cuda::{cuda_source, function, KernelSource};
use anyhow::Result;
use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::CudaDevice;
use std::time::Duration;

const SOURCE: KernelSource = cuda_source!("profile_spin");

/// SM clock cycles of the spin: 100 000 cycles are ~50 µs at the H100's 1.98 GHz boost clock
/// (~70 µs at 1.4 GHz), well above the host time to queue one op (a few launches).
const SPIN_CYCLES: i64 = 100_000;

pub(super) fn time<R>(dev: &CudaDevice, f: impl FnOnce() -> Result<R>) -> Result<(R, Duration)> {
    let stream = dev.cuda_stream();
    stream.synchronize()?;
    spin(dev)?;
    // Timing events (the default flags of cudarc disable timing).
    let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let out = f()?;
    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    // Waits for both events.
    let ms = start.elapsed_ms(&end)?;
    Ok((out, Duration::from_secs_f64(f64::from(ms) / 1e3)))
}

/// Queues the spin. Launched directly, not through `backend::cuda::launch`: it is the
/// profiler's, so it is neither counted as a launch of the step nor noted as the op's grid.
fn spin(dev: &CudaDevice) -> Result<()> {
    let func = function(dev, &SOURCE, "profile_spin")?;
    let stream = dev.cuda_stream();
    let mut args = stream.launch_builder(&func);
    args.arg(&SPIN_CYCLES);
    let config = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: `profile_spin(long long cycles)` in kernels/profile_spin.cu; it touches no
    // memory.
    unsafe { args.launch(config) }?;
    Ok(())
}

/// `count` timed device-to-device copies of a `bytes` buffer into another, both allocated
/// once.
pub(super) fn copy_times(dev: &CudaDevice, bytes: usize, count: usize) -> Result<Vec<Duration>> {
    let stream = dev.cuda_stream();
    let src = stream.alloc_zeros::<u8>(bytes)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes)?;
    (0..count)
        .map(|_| Ok(time(dev, || Ok(stream.memcpy_dtod(&src, &mut dst)?))?.1))
        .collect()
}
