//! The count of verify passes replayed from a CUDA graph (`verify_graph.rs`), apart from the
//! pass itself so that the graph and the pass do not import each other.

/// Verify passes replayed from a CUDA graph in this process.
static GRAPH_REPLAYS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many verify passes were replayed from a CUDA graph in this process (0 off CUDA): the
/// tests' evidence that the graph ran.
pub fn graph_replays() -> usize {
    GRAPH_REPLAYS.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(super) fn count_graph_replay() {
    GRAPH_REPLAYS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}
