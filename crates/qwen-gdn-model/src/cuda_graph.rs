//! What every captured CUDA graph of the crate shares: the recording of a step on candle's
//! stream, the switch that turns graphs off after a failed capture, and the in-place uploads
//! of the inputs a replay reads.
//!
//! A graph bakes in every device address its kernels touched, so a step's inputs (token ids,
//! positions, rows gathered on the host) live in device tensors allocated before the capture
//! and are rewritten in place before each replay ([`write`]). What every family's cache
//! shares is here too: the tensors a step writes in place ([`layout`]; a capture is stale
//! once one of them changes), the KV buffers' room, and the host-side counts a capture must
//! leave as it found them ([`Bookkeeping`]). The families own what they capture and what
//! else makes it stale (`families/hybrid/cuda_graph.rs`, `families/qwen4_exp/cuda_graph.rs`).

use crate::cache::{Cache, LayerCache};
pub use crate::cache_counts::Bookkeeping;
use anyhow::{bail, Context, Result};
use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaGraph, DevicePtr, DeviceRepr};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, Tensor, TensorId};

/// Set when a capture failed: later steps of every graph run eagerly.
static BROKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Graphs captured and replays launched in this process (every family's): tests read them
/// to know that a step ran from a graph.
static CAPTURES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static REPLAYS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Graphs captured so far in this process.
pub fn captures() -> usize {
    CAPTURES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Replays launched so far in this process.
pub fn replays() -> usize {
    REPLAYS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Launches `graph` (the `what` step's replay) on candle's stream.
pub fn launch(graph: &CudaGraph, what: &str) -> Result<()> {
    graph
        .launch()
        .with_context(|| format!("replaying the {what} graph"))?;
    REPLAYS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Whether graphs still work (the run asks for them with `RunOptions::cuda_graph`).
pub fn enabled() -> bool {
    !BROKEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// Readies the device for a capture and returns the guard under which candle records its
/// per-launch shape uploads: hold it across an eager run of the step and the [`capture`] of
/// the same step, so that the replay reads those uploads from device copies.
#[must_use = "candle records its uploads only while the guard lives"]
pub fn prepare(dev: &CudaDevice) -> impl Sized {
    // SAFETY: candle runs every op on one stream, so cudarc's cross-stream events (which a
    // capture must not wait on) order nothing. Off before the step's tensors are made, so
    // that none of them carries an event a capture would wait on.
    unsafe { dev.disable_event_tracking() };
    dev.enable_cuda_graph_htod_cache()
}

/// Records what `step` launches on candle's stream, without running it, into a graph that
/// frees the step's own allocations on launch (so its outputs must be copied, inside `step`,
/// into tensors allocated before). `what` names the step in the one-line note printed when
/// the capture fails; graphs are then off for the rest of the run and `None` is returned.
/// Called under [`prepare`]'s guard, after an eager run of the same step.
pub fn capture(
    dev: &CudaDevice,
    what: &str,
    step: impl FnOnce() -> Result<()>,
) -> Option<CudaGraph> {
    let stream = dev.cuda_stream();
    let why =
        match stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) {
            Err(e) => e.to_string(),
            Ok(()) => {
                let recorded = step();
                let graph = stream.end_capture(
                    sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
                );
                match (recorded, graph) {
                    (Ok(()), Ok(Some(graph))) => {
                        CAPTURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return Some(graph);
                    }
                    (Err(e), _) => format!("{e:#}"),
                    (_, Err(e)) => e.to_string(),
                    _ => "the capture recorded nothing".to_string(),
                }
            }
        };
    disable(what, &why);
    None
}

/// Turns graphs off for the rest of the run, with a one-line note: the `what` step's capture
/// failed, or gave a graph that cannot be replayed, for the reason `why`.
pub fn disable(what: &str, why: &str) {
    BROKEN.store(true, std::sync::atomic::Ordering::Relaxed);
    eprintln!("note: CUDA graph capture of the {what} failed ({why}); running it without graphs");
}

/// Writes `values` into the first `values.len()` elements of the device tensor `t` in place,
/// on candle's stream (so that a replay launched after it reads them), outside any capture.
pub fn write<T: CudaDType + DeviceRepr>(dev: &CudaDevice, t: &Tensor, values: &[T]) -> Result<()> {
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cuda(s) = &*storage else {
        bail!("expected a CUDA tensor");
    };
    if !layout.is_contiguous() || values.len() > layout.shape().elem_count() {
        bail!(
            "a graph input of {} elements written with {} values",
            layout.shape().elem_count(),
            values.len()
        );
    }
    let stream = dev.cuda_stream();
    let slice = s.as_cuda_slice::<T>()?;
    let view = slice.slice(layout.start_offset()..layout.start_offset() + values.len());
    let (ptr, _sync) = view.device_ptr(&stream);
    // SAFETY: `ptr` addresses `values.len()` elements of a live allocation; a copy from
    // pageable host memory is staged before this call returns, so `values` may go out of
    // scope after it.
    unsafe { result::memcpy_htod_async(ptr, values, stream.cu_stream()) }
        .context("writing a CUDA graph's input")?;
    Ok(())
}

/// The ids of the cache tensors a step reads and writes in place, per layer: a GDN layer's
/// conv window and state, an attention layer's keys and values.
pub fn layout(cache: &Cache) -> Vec<[Option<TensorId>; 4]> {
    let id = |t: Option<&Tensor>| t.map(Tensor::id);
    cache
        .layers
        .iter()
        .map(|l| match l {
            LayerCache::Gdn(c) => [id(c.conv.as_ref()), id(c.state.as_ref()), None, None],
            LayerCache::Attention(c) => {
                let (k, v) = c.buffers();
                [None, None, id(k), id(v)]
            }
        })
        .collect()
}

/// Whether every KV buffer has room for `rows` more positions (a replay cannot grow one).
pub fn room_for(cache: &Cache, rows: usize) -> bool {
    cache.layers.iter().all(|l| match l {
        LayerCache::Attention(c) => c.len() + rows <= c.capacity(),
        LayerCache::Gdn(_) => true,
    })
}

/// The counts after a replay of `rows` tokens (a decode step: one; a verify pass: its rows):
/// the offset and every KV length `rows` on (the replay wrote them into every KV buffer).
pub fn advance(cache: &mut Cache, rows: usize) {
    cache.offset += rows;
    for l in &mut cache.layers {
        if let LayerCache::Attention(c) = l {
            c.advance(rows);
        }
    }
}
