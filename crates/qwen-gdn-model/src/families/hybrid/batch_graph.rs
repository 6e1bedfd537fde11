//! The CUDA batched decode step as a graph, one per batch size (issue 29): captured once per
//! batch composition and cache layout, replayed per step, so that a step of B sequences costs
//! one graph launch of host time instead of one per kernel, as the single-sequence step does
//! (`cuda_graph.rs`, whose rules this follows).
//!
//! A capture bakes in every device address the step touches: the B sequences' GDN states and
//! conv windows, their KV buffers, the slot kernels' address tables (uploaded once per
//! composition, `gdn_ops::slot_tables`), and two `[B]` u32 buffers, the token ids and the
//! positions, which are the only things written before each replay. So a graph is replayed
//! only while the B caches still hold the very tensors it was captured with, in the same
//! order, and every KV buffer has room for one more position; otherwise the step runs
//! eagerly once (growing buffers if needed) and is captured again. One graph is kept per B
//! (the last composition of that size): `serve`'s batch changes composition as requests join
//! and leave, and each change costs one eager step and one capture.
//!
//! Only the gathered MoE is captured ([`BatchMoe::gathers`]): the grouped form reads the
//! routing back to the host, which a graph cannot replay.

use super::HybridDecoder;
use crate::cache::Cache;
use crate::cuda_graph::{advance, capture, launch, layout, prepare, room_for, write, Bookkeeping};
use crate::families::Ends;
use crate::tap::NoTap;
use crate::tensor::cast;
use crate::BatchMoe;
use anyhow::{bail, Result};
use candle_core::cuda_backend::cudarc::driver::CudaGraph;
use candle_core::{DType, Device, Tensor, TensorId};

/// One captured batched step and what it was captured against.
pub struct BatchGraph {
    graph: CudaGraph,
    /// The step's outputs, allocated before the capture and rewritten by each replay: f32
    /// logits `[B, vocab]` and the final-normed hidden states `[1, B, H]`.
    logits: Tensor,
    normed: Tensor,
    tokens: Tensor,
    positions: Tensor,
    /// Per sequence, the ids of every cache tensor the capture read or wrote, per layer.
    layouts: Vec<Vec<[Option<TensorId>; 4]>>,
}

impl std::fmt::Debug for BatchGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchGraph").finish_non_exhaustive()
    }
}

// SAFETY: as `DecodeGraph`: launched, captured or dropped only under its decoder's mutex.
unsafe impl Send for BatchGraph {}
unsafe impl Sync for BatchGraph {}

impl BatchGraph {
    fn batch(&self) -> usize {
        self.layouts.len()
    }

    fn fits(&self, caches: &[&mut Cache]) -> bool {
        self.batch() == caches.len()
            && caches
                .iter()
                .zip(&self.layouts)
                .all(|(c, l)| room_for(c, 1) && layout(c) == *l)
    }
}

/// Whether a fused batched step of `moe` products replays a graph on `device`, as the
/// single-sequence step's rule (`decode.rs`): a CUDA device, graphs on (`RunOptions::
/// cuda_graph`, no failed capture), and the MoE gathered, which reads nothing back.
pub fn applies(decoder: &HybridDecoder, device: &Device, moe: BatchMoe) -> bool {
    device.is_cuda() && decoder.cuda_graph && moe.gathers() && crate::cuda_graph::enabled()
}

/// The step's work between its inputs and outputs: the embedded ids, the layers over the B
/// rows at the positions held in `positions`, the head. Advances no offset (the KV lengths
/// are advanced by the attention layers, as in the eager step).
fn run(
    decoder: &HybridDecoder,
    ends: &Ends,
    (tokens, positions): (&Tensor, &Tensor),
    caches: &mut [&mut Cache],
    moe: BatchMoe,
) -> Result<(Tensor, Tensor)> {
    let rows: Vec<Tensor> = (0..caches.len())
        .map(|i| positions.narrow(0, i, 1))
        .collect::<candle_core::Result<_>>()?;
    let embedded = ends.embed.forward_ids(tokens, ends.dtype)?; // [B, H]
    let normed = decoder
        .decode_batch_fused_at(&embedded, caches, moe, &rows, &mut NoTap)?
        .unsqueeze(0)?;
    let logits = ends.head.forward(&normed)?;
    Ok((cast(&logits.squeeze(0)?, DType::F32)?, normed))
}

/// One batched step through the graph of its batch size, capturing it first when needed
/// (`tokens` already checked against the vocabulary, the caches against the model). Returns
/// the f32 logits `[B, vocab]` and the normed hidden states `[1, B, H]`, and advances every
/// cache by one position.
pub fn step(
    decoder: &HybridDecoder,
    ends: &Ends,
    tokens: &[u32],
    caches: &mut [&mut Cache],
    moe: BatchMoe,
) -> Result<(Tensor, Tensor)> {
    let Device::Cuda(dev) = ends.device else {
        bail!("CUDA graphs need a CUDA device");
    };
    let positions: Vec<u32> = caches.iter().map(|c| c.offset as u32).collect();
    let mut graphs = decoder
        .batch_graphs
        .lock()
        .map_err(|_| anyhow::anyhow!("a batched step panicked while holding its CUDA graphs"))?;
    if let Some(graph) = graphs.iter().find(|g| g.fits(caches)) {
        write(dev, &graph.tokens, tokens)?;
        write(dev, &graph.positions, &positions)?;
        launch(&graph.graph, "batched decode step")?;
        // Copies: callers keep a step's outputs while the next replay rewrites these.
        let out = (graph.logits.copy()?, graph.normed.copy()?);
        for cache in caches.iter_mut() {
            advance(cache, 1);
        }
        return Ok(out);
    }
    graphs.retain(|g| g.batch() != caches.len());
    let _uploads = prepare(dev);
    let token_buf = Tensor::new(tokens, ends.device)?;
    let pos_buf = Tensor::new(positions.as_slice(), ends.device)?;
    // The eager step: this step's result, and it grows the KV buffers that are full, so that
    // the capture below allocates nothing that outlives it.
    let before: Vec<Bookkeeping> = caches.iter().map(|c| Bookkeeping::of(c)).collect();
    let eager = run(decoder, ends, (&token_buf, &pos_buf), caches, moe)?;
    for cache in caches.iter_mut() {
        cache.offset += 1;
    }
    // The caches after the eager step (tensors shared, counts copied): put back after the
    // capture, failed or not, so that no tensor of the graph's memory stays in them.
    let after: Vec<Cache> = caches.iter().map(|c| (**c).clone()).collect();
    for (cache, counts) in caches.iter_mut().zip(&before) {
        counts.restore(cache);
    }
    let (logits, normed) = (eager.0.zeros_like()?, eager.1.zeros_like()?);
    let graph = capture(dev, "batched decode step", || {
        let (l, n) = run(decoder, ends, (&token_buf, &pos_buf), caches, moe)?;
        logits.slice_set(&l, 0, 0)?;
        Ok(normed.slice_set(&n, 0, 0)?)
    });
    for (cache, kept) in caches.iter_mut().zip(after) {
        **cache = kept;
    }
    let Some(graph) = graph else {
        return Ok(eager);
    };
    graphs.push(BatchGraph {
        graph,
        logits,
        normed,
        tokens: token_buf,
        positions: pos_buf,
        layouts: caches.iter().map(|c| layout(c)).collect(),
    });
    Ok(eager)
}
