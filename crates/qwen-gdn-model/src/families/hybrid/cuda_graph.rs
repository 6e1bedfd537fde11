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
use crate::cache::{Cache, LayerCache};
use crate::cuda_graph::{capture, prepare, write};
use crate::families::Ends;
use crate::tap::NoTap;
use anyhow::{bail, Context, Result};
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

/// The tensor ids a step reads and writes in place, per layer.
pub(super) fn layout(cache: &Cache) -> Vec<[Option<TensorId>; 4]> {
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

/// Whether every KV buffer has room for `rows` more positions.
pub(super) fn room_for(cache: &Cache, rows: usize) -> bool {
    cache.layers.iter().all(|l| match l {
        LayerCache::Attention(c) => c.len() + rows <= c.capacity(),
        LayerCache::Gdn(_) => true,
    })
}

/// Host-side bookkeeping of a step: the offset and every KV length.
pub(super) fn bookkeeping(cache: &Cache) -> (usize, Vec<usize>) {
    let lens = cache
        .layers
        .iter()
        .map(|l| match l {
            LayerCache::Attention(c) => c.len(),
            LayerCache::Gdn(_) => 0,
        })
        .collect();
    (cache.offset, lens)
}

/// A replay's bookkeeping: `rows` positions written into every KV buffer.
pub(super) fn advance(cache: &mut Cache, rows: usize) {
    cache.offset += rows;
    for l in &mut cache.layers {
        if let LayerCache::Attention(c) = l {
            c.advance(rows);
        }
    }
}

pub(super) fn restore(cache: &mut Cache, (offset, lens): &(usize, Vec<usize>)) {
    cache.offset = *offset;
    for (l, &len) in cache.layers.iter_mut().zip(lens) {
        if let LayerCache::Attention(c) = l {
            c.set_len(len);
        }
    }
}

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
            graph.graph.launch().context("replaying the decode graph")?;
            // A copy: callers may keep a step's logits while the next replay rewrites these.
            let logits = graph.logits.copy()?;
            // The replay wrote one position into every KV buffer.
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
    let before = bookkeeping(cache);
    let logits = decoder.decode_step_on(ends, &token_buf, &pos_buf, cache, &mut NoTap)?;
    let after = bookkeeping(cache);
    // The same step again, recorded and not run: from the same host-side state.
    restore(cache, &before);
    let out = logits.zeros_like()?;
    // The step's own output is freed inside the graph once copied into `out`.
    let graph = capture(dev, "decode step", || {
        let l = decoder.decode_step_on(ends, &token_buf, &pos_buf, cache, &mut NoTap)?;
        Ok(out.slice_set(&l, 0, 0)?)
    });
    restore(cache, &after);
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
