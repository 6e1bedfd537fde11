//! The CUDA verify pass (`verify.rs`) as a graph, one per number of rows T: captured once per
//! cache layout and replayed per speculative step, so that a pass costs one graph launch of
//! host time instead of one per kernel (issue 28).
//!
//! What the decode graph (`cuda_graph.rs`) does, plus what a verify window keeps:
//!
//! - the ids and positions of the T rows live in `[T]` u32 buffers written before a replay;
//! - every GDN layer's window copies its conv rows and the states after its tokens but the
//!   last into buffers allocated before the capture (`GdnSteps::in_buffers`), and keeps its
//!   conv window in place (a pass of T > 1 tokens copies the conv front's new window into
//!   the live one); the window a replay leaves is the one the eager run before the capture
//!   left (views of those buffers and the live state), put back in the cache at each replay;
//! - `Window::close` copies the kept state and conv window into the live tensors, so that a
//!   rollback keeps the layout and the next step replays the same graph;
//! - the address tables of `attn_prep_slots` are looked up (and uploaded) by the eager run
//!   before the capture; the graph holds the ones it reads (`slot_tables::keeping`).
//!
//! A graph is replayed while the cache holds the tensors it was captured with and every KV
//! buffer has room for T more positions. Anything else (a tap, a layer outside the fused
//! kernels, a window that already recorded, a cache without its states yet, T past
//! [`MAX_ROWS`]) runs the eager pass, the first such reason named once on stderr.

use super::HybridDecoder;
use crate::cache::{Cache, LayerCache};
use crate::cache_counts::Bookkeeping;
use crate::cuda_graph::{advance, capture, enabled, layout, prepare, room_for, write};
use crate::families::Ends;
use crate::layers::gdn::GdnSteps;
use crate::tap::NoTap;
use anyhow::{Context, Result};
use candle_core::cuda_backend::cudarc::driver::CudaGraph;
use candle_core::{Device, Tensor, TensorId};
use std::sync::atomic::{AtomicBool, Ordering};

/// The longest pass captured: a speculative step of up to 4 drafts.
pub const MAX_ROWS: usize = 5;

/// One captured pass of `rows` rows and what it was captured against.
pub struct VerifyGraph {
    graph: CudaGraph,
    rows: usize,
    ids: Tensor,
    positions: Tensor,
    /// The pass's outputs, allocated before the capture and rewritten by each replay.
    logits: Tensor,
    normed: Tensor,
    /// Per layer, the window a GDN layer holds after the pass (views of its buffers).
    steps: Vec<Option<GdnSteps>>,
    layout: Vec<[Option<TensorId>; 4]>,
    /// The slot tables the graph reads.
    _tables: gdn_ops::slot_tables::Kept,
}

impl std::fmt::Debug for VerifyGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyGraph")
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

// SAFETY: a graph is only launched, captured or dropped under its decoder's mutex, so by one
// thread at a time, and cudarc binds the context per call.
unsafe impl Send for VerifyGraph {}
unsafe impl Sync for VerifyGraph {}

/// Why a pass ran eagerly, or `None` when a graph covers it.
fn not_covered(decoder: &HybridDecoder, rows: usize, cache: &Cache) -> Option<String> {
    if rows > MAX_ROWS {
        return Some(format!("{rows} rows (graphs go to {MAX_ROWS})"));
    }
    if !decoder.coverage.iter().all(|c| c.mixer && c.feed_forward) {
        return Some("a layer outside the fused kernels".into());
    }
    for l in &cache.layers {
        if let LayerCache::Gdn(c) = l {
            if c.conv.is_none() || c.state.is_none() {
                return Some("a cache without its GDN states yet".into());
            }
            if !c.steps.as_ref().is_some_and(GdnSteps::is_fresh) {
                return Some("a pass outside a verify window just opened".into());
            }
        }
    }
    None
}

/// The verify pass of `tokens` through the cache's graph for T = `tokens.len()` rows,
/// capturing it first when needed: the f32 logits `[T, vocab]` and the normed rows
/// `[T, H]`; `None` when the pass is to run eagerly (no CUDA, graphs off, not covered).
pub fn pass(
    decoder: &HybridDecoder,
    ends: &Ends,
    tokens: &[u32],
    cache: &mut Cache,
) -> Result<Option<(Tensor, Tensor)>> {
    let Device::Cuda(dev) = ends.device else {
        return Ok(None);
    };
    if !decoder.cuda_graph || !enabled() {
        return Ok(None);
    }
    let rows = tokens.len();
    if let Some(why) = not_covered(decoder, rows, cache) {
        static NOTED: AtomicBool = AtomicBool::new(false);
        if !NOTED.swap(true, Ordering::Relaxed) {
            eprintln!("note: a verify pass runs without a CUDA graph: {why}");
        }
        return Ok(None);
    }
    let positions: Vec<u32> = (0..rows).map(|t| (cache.offset + t) as u32).collect();
    let mut graphs = decoder
        .verify_graphs
        .lock()
        .map_err(|_| anyhow::anyhow!("a verify pass panicked while holding its CUDA graph"))?;
    if let Some(g) = graphs.iter().find(|g| g.rows == rows) {
        if room_for(cache, rows) && g.layout == layout(cache) {
            write(dev, &g.ids, tokens)?;
            write(dev, &g.positions, &positions)?;
            g.graph.launch().context("replaying the verify graph")?;
            set_windows(cache, &g.steps);
            advance(cache, rows);
            super::verify_replays::count_graph_replay();
            // Copies: callers keep a step's outputs while the next replay rewrites these.
            return Ok(Some((g.logits.copy()?, g.normed.copy()?)));
        }
    }
    graphs.retain(|g| g.rows != rows);
    let _uploads = prepare(dev);
    let ids = Tensor::new(tokens, ends.device)?;
    let positions = Tensor::new(positions.as_slice(), ends.device)?;
    // Every GDN layer's window buffers: the conv rows before the pass and its T, and the
    // states after its tokens but the last.
    let mut fresh = Vec::with_capacity(cache.layers.len());
    for l in &mut cache.layers {
        let LayerCache::Gdn(c) = l else {
            fresh.push(None);
            continue;
        };
        let (Some(conv), Some(state)) = (&c.conv, &c.state) else {
            unreachable!("checked by not_covered");
        };
        let (b, before, channels) = conv.dims3()?;
        let buffer_rows = Tensor::zeros((b, before + rows, channels), conv.dtype(), ends.device)?;
        let after = match rows {
            1 => None,
            _ => {
                let mut shape = vec![rows - 1];
                shape.extend_from_slice(state.dims());
                Some(Tensor::zeros(shape, state.dtype(), ends.device)?)
            }
        };
        let steps = GdnSteps::in_buffers(buffer_rows, after);
        c.steps = Some(steps.clone());
        fresh.push(Some(steps));
    }
    // The eager pass: this step's result; it grows the KV buffers if they are full, so that
    // the capture below allocates nothing that outlives it.
    let before = Bookkeeping::of(cache);
    let (logits, normed) = decoder.verify_pass_on(ends, &ids, &positions, cache, &mut NoTap)?;
    let after = Bookkeeping::of(cache);
    let windows: Vec<Option<GdnSteps>> = (cache.layers.iter())
        .map(|l| match l {
            LayerCache::Gdn(c) => c.steps.clone(),
            LayerCache::Attention(_) => None,
        })
        .collect();
    // The same pass again, recorded and not run: from the same host-side state.
    before.restore(cache);
    set_windows(cache, &fresh);
    let (out_logits, out_normed) = (logits.zeros_like()?, normed.zeros_like()?);
    let (graph, tables) = gdn_ops::slot_tables::keeping(|| {
        capture(dev, "verify pass", || {
            let (l, n) = decoder.verify_pass_on(ends, &ids, &positions, cache, &mut NoTap)?;
            out_logits.slice_set(&l, 0, 0)?;
            Ok(out_normed.slice_set(&n, 0, 0)?)
        })
    });
    after.restore(cache);
    set_windows(cache, &windows);
    if let Some(graph) = graph {
        graphs.push(VerifyGraph {
            graph,
            rows,
            ids,
            positions,
            logits: out_logits,
            normed: out_normed,
            steps: windows,
            layout: layout(cache),
            _tables: tables,
        });
    }
    Ok(Some((logits, normed)))
}

/// Puts `windows` (one per layer, `None` for attention) into the GDN layers of `cache`.
fn set_windows(cache: &mut Cache, windows: &[Option<GdnSteps>]) {
    for (l, steps) in cache.layers.iter_mut().zip(windows) {
        if let LayerCache::Gdn(c) = l {
            c.steps = steps.clone();
        }
    }
}
