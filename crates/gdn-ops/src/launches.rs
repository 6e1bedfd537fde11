//! A per-thread count of the kernel launches the model's code path causes, so that the
//! dispatches per decoded token can be counted on any machine (see docs/metal.md).
//!
//! Counted where launches happen, never by hand in layer code:
//! - this crate's kernels count themselves in the one launch function of each backend
//!   (`backend::metal::encode`, `backend::cuda::launch`), and a CPU twin counts as the one
//!   kernel it stands in for ([`cpu_twin`]);
//! - candle's own ops cannot be hooked, so the device plan calls them through
//!   [`candle_op`] / [`candle_ops`], which count what candle launches for them.

use std::cell::Cell;

thread_local! {
    static LAUNCHES: Cell<usize> = const { Cell::new(0) };
}

/// Adds `n` launches to this thread's count.
pub fn record(n: usize) {
    LAUNCHES.with(|c| c.set(c.get() + n));
}

/// This thread's count so far.
pub fn count() -> usize {
    LAUNCHES.with(Cell::get)
}

/// Resets this thread's count and returns what it was.
pub fn take() -> usize {
    LAUNCHES.with(|c| c.replace(0))
}

/// Runs `f` without counting what it records, then records `n` instead: for a CPU function
/// that stands in for `n` GPU kernels.
pub fn counted_as<R>(n: usize, f: impl FnOnce() -> R) -> R {
    let before = count();
    let out = f();
    LAUNCHES.with(|c| c.set(before + n));
    out
}

/// A CPU twin standing in for one kernel launch.
pub fn cpu_twin<R>(f: impl FnOnce() -> R) -> R {
    counted_as(1, f)
}

/// A candle op that launches one kernel on a GPU (an elementwise op, a reduction, a copy).
pub fn candle_op<T>(result: candle_core::Result<T>) -> anyhow::Result<T> {
    candle_ops(1, result)
}

/// A candle op that launches `n` kernels on a GPU (e.g. `Tensor::cat` of `n` parts: one copy
/// each).
pub fn candle_ops<T>(n: usize, result: candle_core::Result<T>) -> anyhow::Result<T> {
    record(n);
    crate::profile::record::note_candle(n);
    Ok(result?)
}

thread_local! {
    static READ_BACKS: Cell<usize> = const { Cell::new(0) };
}

/// A read of a device tensor's values by the host (`to_vec*`, `to_scalar`, a copy to the CPU)
/// inside the model's step: each one drains the device's queue, so a decode step that is to
/// be replayed without the host (a CUDA graph, one Metal command buffer) must have none. Wrap
/// the read in this, as [`candle_op`] wraps a launch: it counts one per call.
pub fn read_back<T>(result: candle_core::Result<T>) -> anyhow::Result<T> {
    READ_BACKS.with(|c| c.set(c.get() + 1));
    Ok(result?)
}

/// This thread's count of [`read_back`]s so far.
pub fn read_backs() -> usize {
    READ_BACKS.with(Cell::get)
}

thread_local! {
    static UPLOADS: Cell<usize> = const { Cell::new(0) };
}

/// Records `n` copies of host memory to the device inside the model's step (a slot kernel's
/// address table, a sequence's position): each is a host call on the step's path and, in a
/// CUDA graph, a node that must be fed from a fixed host buffer. Counted where the copy is
/// made, and by a CPU twin for the table its kernel would read, so that the count is the
/// same on every backend.
pub fn upload(n: usize) {
    UPLOADS.with(|c| c.set(c.get() + n));
}

/// This thread's count of [`upload`]s so far.
pub fn uploads() -> usize {
    UPLOADS.with(Cell::get)
}
