//! The CUDA decode step as a graph: captured once per cache layout and replayed per token,
//! so that a token costs one graph launch of host time instead of one per kernel.
//!
//! A capture bakes in every device address the step touches: weights, the GDN states and
//! conv windows (advanced in place), the KV buffers (written in place at the position the
//! kernels read from a device buffer), and two `[1]` u32 buffers for the token id and its
//! position, which are the only things written before each replay. So a graph is replayed
//! only while the cache still holds the very tensors it was captured with and the KV
//! buffers have room for one more position; otherwise the step runs eagerly once (growing
//! the buffers if needed) and is captured again. Host-side bookkeeping (the cache's offset
//! and KV lengths) is advanced here after each replay, as the eager step does. The decoder
//! holds the last capture (the cache holds only tensors), so caches decoded in turn are
//! captured again at each switch.
//!
//! candle's own kernels upload their shape arguments per launch; with its graph upload
//! cache enabled (`CudaDevice::enable_cuda_graph_htod_cache`), the eager step records those
//! uploads and the capture replays them from device copies.
//!
//! `QWEN_GDN_CUDA_GRAPH=0` (`RunOptions::cuda_graph`, read once) turns graphs off (eager
//! fused steps).

use super::HybridDecoder;
use crate::cache::Cache;
use crate::cuda_graph::{advance, capture, launch, layout, prepare, room_for, write, Bookkeeping};
use crate::families::Ends;
use crate::tap::NoTap;
use anyhow::{bail, Result};
use candle_core::cuda_backend::cudarc::driver::CudaGraph;
use candle_core::{Device, Tensor, TensorId};

/// One captured step and what it was captured against.
pub struct DecodeGraph {
    graph: CudaGraph,
    /// The step's output, allocated before the capture (so not the graph's own memory, which
    /// must not be freed before a launch) and rewritten by each replay.
    logits: Tensor,
    token: Tensor,
    pos: Tensor,
    /// The ids of every cache tensor the capture read or wrote, per layer.
    layout: Vec<[Option<TensorId>; 4]>,
}

impl std::fmt::Debug for DecodeGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeGraph").finish_non_exhaustive()
    }
}

// SAFETY: a graph is only launched, captured or dropped under its decoder's mutex, so by one
// thread at a time, and cudarc binds the context per call.
unsafe impl Send for DecodeGraph {}
unsafe impl Sync for DecodeGraph {}

/// One decode step through the cache's graph, capturing it first when needed (`token`
/// already checked against the vocabulary).
pub fn step(decoder: &HybridDecoder, ends: &Ends, token: u32, cache: &mut Cache) -> Result<Tensor> {
    let Device::Cuda(dev) = ends.device else {
        bail!("CUDA graphs need a CUDA device");
    };
    let mut slot = decoder
        .decode_graph
        .lock()
        .map_err(|_| anyhow::anyhow!("a decode step panicked while holding the CUDA graph"))?;
    if let Some(graph) = slot.as_ref() {
        if room_for(cache, 1) && graph.layout == layout(cache) {
            write(dev, &graph.token, &[token])?;
            write(dev, &graph.pos, &[cache.offset as u32])?;
            launch(&graph.graph, "decode step")?;
            // A copy: callers may keep a step's logits while the next replay rewrites these.
            let logits = graph.logits.copy()?;
            advance(cache, 1);
            return Ok(logits);
        }
    }
    *slot = None;
    let _uploads = prepare(dev);
    let token_buf = Tensor::new(&[token], ends.device)?;
    let pos_buf = Tensor::new(&[cache.offset as u32], ends.device)?;
    // The eager step: this token's result, and it grows the KV buffers if they are full, so
    // that the capture below allocates nothing that outlives it.
    let before = Bookkeeping::of(cache);
    let logits = decoder.decode_step_on(ends, &token_buf, &pos_buf, cache, &mut NoTap)?;
    // The cache after the eager step (tensors shared, counts copied): put back after the
    // capture, failed or not, so that no tensor of the graph's memory (invalid after a failed
    // capture) stays in it.
    let after = cache.clone();
    // The same step again, recorded and not run: from the same host-side state.
    before.restore(cache);
    let out = logits.zeros_like()?;
    // The step's own output is freed inside the graph once copied into `out`.
    let graph = capture(dev, "decode step", || {
        let l = decoder.decode_step_on(ends, &token_buf, &pos_buf, cache, &mut NoTap)?;
        Ok(out.slice_set(&l, 0, 0)?)
    });
    *cache = after;
    // Without a graph this token's logits came from the eager step; every later step runs
    // eagerly.
    let Some(graph) = graph else {
        return Ok(logits);
    };
    *slot = Some(DecodeGraph {
        graph,
        token: token_buf,
        pos: pos_buf,
        logits: out,
        layout: layout(cache),
    });
    Ok(logits)
}
