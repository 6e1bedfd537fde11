//! Products whose every activation row is computed as if it were alone.
//!
//! The host products pick their kernel by the number of activation rows `m`: up to four rows
//! dot each row against the packed weights, from eight on the rows go through a blocked GEMM,
//! whose sums run in another order. A batched decode step stacks one row per sequence, so
//! with the usual choice a sequence's logits would depend on how many others share its step.
//! Inside a [`scope`] the host products keep the one-row kernel for any `m`: each weight row
//! is still read once for all the rows (the saving batching is for), and every row's sums run
//! in the order they run alone, so a sequence gives the same bits in any batch.

use std::cell::Cell;

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread's host products keep the one-row kernels.
pub fn enabled() -> bool {
    ENABLED.with(Cell::get)
}

/// Turns the mode on or off for the current thread until dropped.
pub fn scope(on: bool) -> gdn_ops::thread_flag::FlagScope {
    gdn_ops::thread_flag::FlagScope::enter(&ENABLED, on)
}
