//! The `qwen4_exp` CUDA decode step as a graph: captured once per cache layout and replayed
//! per token, so that a token costs one graph launch of host time instead of one per kernel
//! (~1,300 at the release's size). The shared mechanics (recording, the in-place input
//! writes, the KV buffers' room and counts) are `crate::cuda_graph`'s; this file adds what
//! only this family has.
//!
//! Everything a step reads that changes from token to token is prepared on the host and
//! written into the step's input tensors before each replay ([`StepInputs`]): the token id
//! and position, the PLE layers' gathered n-gram rows, and the QSA indexer's rows and
//! rotation. Besides the GDN states, conv windows and KV buffers, the step writes in place
//! the PLE conv windows and the indexer's block and tail keys, so a graph is replayed only
//! while the cache holds the very tensors it was captured with, the KV buffers and the
//! indexer's block buffer have room for one more token; otherwise the step runs eagerly once
//! (growing the buffers, moving the indexer's keys to the device) and is captured again.
//!
//! A step is replayed only where its launches do not depend on the position: every part on
//! the fused kernels, and every QSA layer inside its indexer's budget (up to `(k+1)·c − 1`
//! tokens the attention sees every key). Past the budget the selection's mask has the
//! position's width and the attention runs composed under it: those steps run eagerly
//! (named once on stderr). After a replay the host-side counts (offset, KV lengths, the
//! indexer's blocks and tail, the PLE contexts) are advanced here as the eager step does.
//!
//! No capture is attempted where a part of the step would run on the host or read back (a
//! GDN recurrence of key head dims no CUDA kernel covers, a composed MoE or QSA part): those
//! steps run eagerly, the reason named once on stderr. A capture records the step from the
//! counts the eager run started from ([`StepCounts`]); after it, failed or not, the cache is
//! the eager step's again (tensors and counts), so that no tensor of the graph's memory
//! stays in it.
//!
//! `QWEN_GDN_CUDA_GRAPH=0` (`RunOptions::cuda_graph`, read once) turns graphs off.

use super::step_counts::StepCounts;
use super::step_inputs::StepInputs;
use super::{state, Qwen4ExpDecoder, Qwen4Mixer};
use crate::cache::{Cache, LayerCache};
use crate::cuda_graph::{advance, capture, disable, launch, layout, prepare, room_for};
use crate::families::Ends;
use crate::tap::NoTap;
use anyhow::{anyhow, bail, Result};
use candle_core::cuda_backend::cudarc::driver::CudaGraph;
use candle_core::{DType, Device, Tensor, TensorId};

/// One captured step and what it was captured against.
pub struct DecodeGraph {
    graph: CudaGraph,
    /// The step's output, allocated before the capture and rewritten by each replay.
    logits: Tensor,
    /// The step's inputs, rewritten before each replay.
    inputs: StepInputs,
    layout: Vec<[Option<TensorId>; 4]>,
    family: Vec<[Option<TensorId>; 2]>,
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

/// Per layer, the ids of this family's tensors a step writes in place: a PLE layer's conv
/// window; a QSA layer's block keys and tail keys (once on the device).
fn family_layout(cache: &Cache) -> Vec<[Option<TensorId>; 2]> {
    cache
        .layers
        .iter()
        .map(|l| match l {
            LayerCache::Gdn(c) => [state::ple(c).map(|p| p.window.id()), None],
            LayerCache::Attention(c) => match state::indexer(c).and_then(|i| i.device.as_ref()) {
                Some(keys) => {
                    let (blocks, tail) = keys.buffers();
                    [Some(blocks.id()), Some(tail.id())]
                }
                None => [None, None],
            },
        })
        .collect()
}

impl Qwen4ExpDecoder {
    /// Why a step's launches could not be the same at every position inside the indexers'
    /// budget, or could read back (then no capture is attempted): `None` where every MoE
    /// block is on the fused kernels, every QSA layer's selection and attention too (the
    /// composed ones take the position on the host or read back), and every GDN layer's
    /// recurrence runs on the device (a composed GDN mixer is position-free, and the step
    /// keeps its tensors in place; but its recurrence runs on the host, a read-back, for key
    /// head dims no CUDA kernel covers).
    fn not_replayable(&self, dtype: DType, device: &Device) -> Option<String> {
        if self.coverage().len() != self.layers.len() {
            return Some("the fused decode step's coverage is not known".into());
        }
        self.layers
            .iter()
            .zip(self.coverage())
            .enumerate()
            .find_map(|(i, (l, c))| match &l.mixer {
                _ if !c.feed_forward => Some(format!("layer {i}'s MoE block runs composed")),
                Qwen4Mixer::Qsa(q) if !(c.mixer && q.attention.fused_decode_supported(dtype)) => {
                    Some(format!(
                        "layer {i}'s QSA selection or attention runs composed"
                    ))
                }
                Qwen4Mixer::Gdn(g) if !c.mixer && !g.recurrence_on_device(device) => Some(format!(
                    "layer {i}'s GDN recurrence runs on the host (no kernel for its dims)"
                )),
                _ => None,
            })
    }

    /// Whether the step at `offset` is inside every QSA layer's budget (no mask).
    fn within_budget(&self, offset: usize) -> bool {
        self.layers.iter().all(|l| match &l.mixer {
            Qwen4Mixer::Qsa(q) => q.indexer.within_budget(offset),
            Qwen4Mixer::Gdn(_) => true,
        })
    }

    /// Whether every QSA layer's keys are on the device with room for one more block row.
    fn indexers_ready(&self, cache: &Cache) -> bool {
        cache.layers.iter().all(|l| match l {
            LayerCache::Attention(c) => state::indexer(c)
                .and_then(|i| i.device.as_ref())
                .is_some_and(|k| k.room_for_one()),
            LayerCache::Gdn(_) => true,
        })
    }

    /// The indexers' counts after a replay, as the eager step advances them.
    fn advance_indexers(&self, cache: &mut Cache) -> Result<()> {
        for (layer, c) in self.layers.iter().zip(&mut cache.layers) {
            if let (Qwen4Mixer::Qsa(q), LayerCache::Attention(c)) = (&layer.mixer, c) {
                state::indexer_mut(c)
                    .ok_or_else(|| anyhow!("cache lacks the QSA indexer state"))?
                    .advance_on_device(q.indexer.config().compress_ratio);
            }
        }
        Ok(())
    }
}

/// One decode step through the decoder's graph where the step can be replayed, capturing it
/// first when needed; eagerly elsewhere (`token` already checked against the vocabulary).
pub fn step(
    decoder: &Qwen4ExpDecoder,
    ends: &Ends,
    token: u32,
    cache: &mut Cache,
) -> Result<Tensor> {
    let Device::Cuda(dev) = ends.device else {
        bail!("CUDA graphs need a CUDA device");
    };
    if let Some(why) = decoder.not_replayable(ends.dtype, ends.device) {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            eprintln!("note: qwen4_exp decode steps run without a CUDA graph: {why}");
        });
        return decoder.decode_step(ends, token, cache, Some(&mut NoTap));
    }
    if !decoder.within_budget(cache.offset) {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            eprintln!(
                "note: qwen4_exp decode steps past the QSA indexer's budget run without \
                 a CUDA graph (the selection's mask has the position's width)"
            )
        });
        return decoder.decode_step(ends, token, cache, Some(&mut NoTap));
    }
    let mut slot = decoder
        .decode_graph
        .lock()
        .map_err(|_| anyhow!("a decode step panicked while holding the CUDA graph"))?;
    let values = decoder.step_values(token, cache)?;
    if let Some(graph) = slot.as_ref() {
        if room_for(cache, 1)
            && decoder.indexers_ready(cache)
            && graph.layout == layout(cache)
            && graph.family == family_layout(cache)
        {
            graph.inputs.write(dev, &values)?;
            launch(&graph.graph, "qwen4_exp decode step")?;
            // A copy: callers may keep a step's logits while the next replay rewrites these.
            let logits = graph.logits.copy()?;
            advance(cache, 1);
            decoder.advance_indexers(cache)?;
            values.advance_contexts(cache)?;
            return Ok(logits);
        }
    }
    *slot = None;
    let _uploads = prepare(dev);
    let inputs = StepInputs {
        in_place: true,
        ..values.upload(ends.device)?
    };
    // The eager step: this token's result; it grows the KV and block-key buffers if they are
    // full and moves the indexer's keys to the device, so that the capture below allocates
    // nothing that outlives it.
    let before = StepCounts::of(cache);
    let logits = decoder.decode_step_on(ends, &inputs, cache, &mut NoTap)?;
    // The cache after the eager step (its tensors shared, its counts copied): the truth the
    // cache is reset to after the capture, whether it succeeds or not, so that nothing the
    // capture recorded (counts advanced, tensors of the graph's memory, invalid after a
    // failed capture) stays in it.
    let after = cache.clone();
    // The same step again, recorded and not run: on the eager step's tensors, from the
    // host-side counts it started from.
    if let Err(e) = before.restore(cache) {
        *cache = after;
        values.advance_contexts(cache)?;
        disable("qwen4_exp decode step", &format!("{e:#}"));
        return Ok(logits);
    }
    let out = logits.zeros_like()?;
    let graph = capture(dev, "qwen4_exp decode step", || {
        let l = decoder.decode_step_on(ends, &inputs, cache, &mut NoTap)?;
        Ok(out.slice_set(&l, 0, 0)?)
    });
    // A replay writes only into the tensors the capture found in the cache: a step that
    // replaced one would leave its result in the graph's memory, not in the cache.
    let kept = layout(cache) == layout(&after) && family_layout(cache) == family_layout(&after);
    *cache = after;
    values.advance_contexts(cache)?;
    let Some(graph) = graph else {
        return Ok(logits);
    };
    if !kept {
        disable(
            "qwen4_exp decode step",
            "the captured step replaced a cache tensor instead of writing it in place",
        );
        return Ok(logits);
    }
    *slot = Some(DecodeGraph {
        graph,
        logits: out,
        inputs,
        layout: layout(cache),
        family: family_layout(cache),
    });
    Ok(logits)
}
