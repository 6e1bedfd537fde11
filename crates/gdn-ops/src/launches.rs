//! A per-thread count of the kernel launches the model's code path asks for, so that the
//! dispatches per decoded token can be counted on any machine (see docs/metal.md). The ops in
//! this crate record their own launches; the model records the candle ops it calls.

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

/// Runs `f` without counting what it records, then records `n` instead: for a CPU twin that
/// stands in for one fused GPU kernel.
pub fn counted_as<R>(n: usize, f: impl FnOnce() -> R) -> R {
    let before = count();
    let out = f();
    LAUNCHES.with(|c| c.set(before + n));
    out
}
