//! The `qwen4_exp` decoder (docs/qwen4_exp.md §1): the residual is `S` streams of `H`; each
//! layer adds its per-layer embedding (PLE layers), mixes the streams into the mixer's input
//! (attention hyper-connection), runs the GDN or the QSA indexed attention, injects the output
//! back into every stream, and does the same around the MoE. The model's last
//! hyper-connection (without injection) replaces the final norm. Composed ops: f32 on the CPU
//! (reference plan), or on the device in the compute dtype (device plan); the indexer's
//! selection and the n-gram gather run on the host in both. On the device plan a decode step
//! runs the GDN mixers, MoE blocks and hyper-connections on the fused kernels, and the
//! indexer's selection on the device (nothing read back), when fused decode is on
//! (`fused.rs`).

use super::fused;
use super::hyper_connection::HyperConnection;
pub use super::indexed_attention::IndexedAttention;
use super::ngram_tables;
use super::ple::PerLayerEmbedding;
use super::qsa_indexer::QsaIndexer;
use super::state::{self, QsaState};
use super::step_inputs::StepInputs;
use crate::cache::{Cache, FamilyState, GdnCache, KvCache, LayerCache};
use crate::config::qwen4_exp::OutputGate;
use crate::config::LayerKind;
use crate::families::hybrid::LayerCoverage;
use crate::families::Ends;
use crate::layers::attention::Attention;
use crate::layers::gdn::GatedDeltaNet;
use crate::layers::moe::SparseMoe;
use crate::layers::norm::Gate;
use crate::tap::{each_layer, NoTap, Part, Tap};
use crate::tensor::cast;
use crate::weights::Checkpoint;
use crate::{Config, StateDtype};
use anyhow::{anyhow, bail, Result};
use candle_core::{DType, Device, Tensor};
use gdn_ops::launches::candle_op;

/// The gate of this family's GDN output norm (`output_gate_type`; silu if the config has no
/// `qwen4_exp` part).
pub fn output_gate(cfg: &Config) -> Gate {
    match cfg.qwen4_exp.as_ref().map(|q| q.output_gate) {
        Some(OutputGate::Sigmoid) => Gate::Sigmoid,
        _ => Gate::Silu,
    }
}

/// A `qwen4_exp` token mixer.
#[derive(Debug)]
pub enum Qwen4Mixer {
    /// Qwen3.5's gated delta net with the configured output gate.
    Gdn(Box<GatedDeltaNet>),
    /// Qwen3.5's gated attention restricted to the keys the indexer selects.
    Qsa(Box<IndexedAttention>),
}

/// One `qwen4_exp` decoder layer.
#[derive(Debug)]
pub struct Qwen4ExpLayer {
    /// On the layers `ple_layer_ids` names (one-based there).
    pub ple: Option<PerLayerEmbedding>,
    pub attn_hc: HyperConnection,
    pub mixer: Qwen4Mixer,
    pub mlp_hc: HyperConnection,
    pub moe: SparseMoe,
}

impl Qwen4ExpLayer {
    /// What the fused decode step (`fused.rs`) covers of this layer in `dtype`: the GDN
    /// mixer where its kernels do, the QSA mixer's selection on the device (device plan),
    /// and the MoE block.
    fn fused_coverage(&self, dtype: DType) -> LayerCoverage {
        LayerCoverage {
            mixer: match &self.mixer {
                Qwen4Mixer::Gdn(m) => m.fused_decode_supported(dtype),
                Qwen4Mixer::Qsa(q) => q.indexer.selects_on_device(),
            },
            feed_forward: self.moe.fused_decode_supported(dtype),
        }
    }
}

/// Every layer of a `qwen4_exp` model and the final stream mixer.
#[derive(Debug)]
pub struct Qwen4ExpDecoder {
    pub layers: Vec<Qwen4ExpLayer>,
    pub final_mixer: HyperConnection,
    pub streams: usize,
    /// Per layer, the parts a decode step runs on the fused kernels (`fused.rs`); empty when
    /// fused decode is off, and every step runs the composed ops.
    fused: Vec<LayerCoverage>,
    /// Whether a decode step runs every hyper-connection (and the final mixer) on the fused
    /// kernels (`hyper_connection` in gdn-ops): fused decode on, and the streams inside
    /// the kernels' coverage.
    fused_hc: bool,
    /// Decode steps on CUDA replay captured graphs (`RunOptions::cuda_graph`, read once).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    cuda_graph: bool,
    /// The CUDA decode step last captured (`cuda_graph.rs`).
    #[cfg(feature = "cuda")]
    pub(super) decode_graph: std::sync::Mutex<Option<super::cuda_graph::DecodeGraph>>,
}

impl Qwen4ExpLayer {
    fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            ple: self.ple.map(|p| p.into_device(device, dtype)).transpose()?,
            attn_hc: self.attn_hc.into_device(device, dtype)?,
            mixer: match self.mixer {
                Qwen4Mixer::Gdn(m) => Qwen4Mixer::Gdn(Box::new(m.into_device(device, dtype)?)),
                Qwen4Mixer::Qsa(q) => Qwen4Mixer::Qsa(Box::new(IndexedAttention {
                    attention: q.attention.into_device(device, dtype)?,
                    indexer: q.indexer.into_device(device, dtype)?,
                })),
            },
            mlp_hc: self.mlp_hc.into_device(device, dtype)?,
            moe: self.moe.into_device(device, dtype)?,
        })
    }
}

impl Qwen4ExpDecoder {
    /// Loads the layers; the n-gram tables are located (and checked) first, so that a
    /// checkpoint without them fails before anything else is read. With a `target`, each
    /// layer moves there as soon as it is built, so that the host holds one layer at a time
    /// (the release's 177B parameters do not fit a GPU machine's memory twice).
    pub fn load(ckpt: &Checkpoint, cfg: &Config, target: Option<(&Device, DType)>) -> Result<Self> {
        let q = cfg
            .qwen4_exp
            .as_ref()
            .ok_or_else(|| anyhow!("not a qwen4_exp config"))?;
        let mut tables = ngram_tables::locate(ckpt, cfg)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let ple = match tables.iter().position(|t| t.layer == i) {
                    Some(at) => Some(PerLayerEmbedding::load(ckpt, &tables.remove(at), cfg)?),
                    None => None,
                };
                let mixer = match cfg.layer_kind(i) {
                    LayerKind::LinearAttention => Qwen4Mixer::Gdn(Box::new(GatedDeltaNet::load(
                        ckpt,
                        &format!("{p}.linear_attn"),
                        cfg,
                        output_gate(cfg),
                    )?)),
                    LayerKind::FullAttention => {
                        let attn = format!("{p}.self_attn");
                        Qwen4Mixer::Qsa(Box::new(IndexedAttention {
                            attention: Attention::load(ckpt, &attn, cfg)?,
                            indexer: QsaIndexer::load(ckpt, &attn, cfg)?,
                        }))
                    }
                };
                let hc =
                    |name: &str| HyperConnection::load(ckpt, &format!("{p}.{name}"), cfg, true);
                let layer = Qwen4ExpLayer {
                    ple,
                    attn_hc: hc("attn_hyper_connection")?,
                    mixer,
                    mlp_hc: hc("mlp_hyper_connection")?,
                    moe: SparseMoe::load(ckpt, &format!("{p}.mlp"), cfg)?,
                };
                match target {
                    Some((device, dtype)) => layer
                        .into_device(device, dtype)
                        .map_err(|e| e.context(format!("moving layer {i} to {device:?}"))),
                    None => Ok(layer),
                }
                .map_err(|e: anyhow::Error| e.context(format!("loading layer {i}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let final_mixer = HyperConnection::load(ckpt, "model.hyper_connection_mixer", cfg, false)?;
        Ok(Self {
            layers,
            final_mixer: match target {
                Some((device, dtype)) => final_mixer.into_device(device, dtype)?,
                None => final_mixer,
            },
            streams: q.hc_count,
            fused: Vec::new(),
            fused_hc: false,
            cuda_graph: true,
            #[cfg(feature = "cuda")]
            decode_graph: std::sync::Mutex::new(None),
        })
    }

    /// The device plan's copy: every product on `device` in `dtype` (composed ops; the
    /// n-gram gather and the indexer's selection stay on the host).
    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        let layers = self
            .layers
            .into_iter()
            .enumerate()
            .map(|(i, l)| {
                l.into_device(device, dtype)
                    .map_err(|e| e.context(format!("moving layer {i} to {device:?}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            final_mixer: self.final_mixer.into_device(device, dtype)?,
            streams: self.streams,
            fused: Vec::new(),
            fused_hc: false,
            cuda_graph: true,
            #[cfg(feature = "cuda")]
            decode_graph: std::sync::Mutex::new(None),
        })
    }

    /// Hands the mixers the run's kernel variants (the MoE's through [`Self::set_moe_prefill`]).
    pub fn set_variants(&mut self, v: &crate::LayerVariants) {
        for layer in &mut self.layers {
            match &mut layer.mixer {
                Qwen4Mixer::Gdn(m) => m.set_variants(v),
                Qwen4Mixer::Qsa(q) => q.attention.set_variants(v),
            }
        }
        self.cuda_graph = v.cuda_graph;
    }

    /// Runs decode steps' GDN mixers and MoE blocks on the fused kernels where they cover
    /// the layer in `dtype` (device plan; the caller checks), or everything composed.
    pub fn set_fused_decode(&mut self, on: bool, dtype: DType) {
        self.fused_hc = on
            && self.final_mixer.fused_supported(dtype)
            && self
                .layers
                .iter()
                .all(|l| l.attn_hc.fused_supported(dtype) && l.mlp_hc.fused_supported(dtype));
        self.fused = if on {
            self.layers
                .iter()
                .map(|l| l.fused_coverage(dtype))
                .collect()
        } else {
            Vec::new()
        };
    }

    pub fn fused_decode(&self) -> bool {
        !self.fused.is_empty()
    }

    /// Whether a decode step runs the hyper-connections on the fused kernels.
    pub fn fused_hyper_connections(&self) -> bool {
        self.fused_hc
    }

    /// Per layer, what a decode step runs fused (empty when fused decode is off).
    pub fn coverage(&self) -> &[LayerCoverage] {
        &self.fused
    }

    /// A fresh cache per layer: GDN states (plus the PLE context and window on PLE layers),
    /// or keys, values and the indexer's block keys.
    pub fn new_cache(&self, state_dtype: StateDtype) -> Vec<LayerCache> {
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                Qwen4Mixer::Gdn(_) => LayerCache::Gdn(GdnCache {
                    state_dtype,
                    family: l.ple.as_ref().map(|p| -> Box<dyn FamilyState> {
                        // A zeros tensor of a fixed small shape on the CPU: only an
                        // allocation failure (which aborts anyway) could stop it.
                        Box::new(p.new_state().expect("PLE window allocation"))
                    }),
                    ..GdnCache::default()
                }),
                Qwen4Mixer::Qsa(q) => {
                    let qsa = q.indexer.config();
                    let mut kv = KvCache::default();
                    kv.family = Some(Box::new(QsaState::new(qsa.head_dim, qsa.compress_ratio)));
                    LayerCache::Attention(kv)
                }
            })
            .collect()
    }

    /// `[T, H]` token embeddings → the `S` residual streams `[T, S·H]` (the row repeated).
    pub fn streams_of(&self, embedded: &Tensor) -> Result<Tensor> {
        candle_op(Tensor::cat(&vec![embedded; self.streams], 1))
    }

    /// The layers on the embedded tokens `[1, T, H]` at the cache's offset (the caller
    /// advances it): the streams `[1, T, S·H]`.
    pub fn forward(
        &self,
        embedded: Tensor,
        tokens: &[u32],
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        let hs = self.streams_of(&embedded.squeeze(0)?)?;
        // A decode step (one token) runs the fused parts; a prompt, the composed layers.
        if let (true, &[token]) = (self.fused_decode(), tokens) {
            let values = self.step_values(token, cache)?;
            let step = values.upload(embedded.device())?;
            // The final mixer's normed streams are the caller's to recompute (`final_mix`).
            let (hs, _) = self.layers_forward(hs, tokens, Some(&step), cache, tap)?;
            values.advance_contexts(cache)?;
            return Ok(hs.unsqueeze(0)?);
        }
        Ok(self
            .layers_forward(hs, tokens, None, cache, tap)?
            .0
            .unsqueeze(0)?)
    }

    /// Every layer on the streams `hs` `[T, S·H]` at the cache's offset (not advanced): with
    /// `step` (one token) the fused parts, reading the step's inputs from its tensors (the
    /// PLE contexts are the caller's to advance); without, the composed layers on `tokens`.
    /// With the fused hyper-connections also the final mixer's normed streams, which the
    /// last layer's injection computed in the same launch (see [`HcChain`]).
    fn layers_forward(
        &self,
        hs: Tensor,
        tokens: &[u32],
        step: Option<&StepInputs>,
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let offset = cache.offset;
        let none = LayerCoverage {
            mixer: false,
            feed_forward: false,
        };
        let parts = |i: usize| match step {
            Some(_) => self.fused.get(i).copied().unwrap_or(none),
            None => none,
        };
        let fused_hc = self.fused_hc && step.is_some();
        each_layer(
            &self.layers,
            &mut cache.layers,
            tap,
            (hs, None),
            |i, layer, c, (hs, normed), tap| {
                let input = match step {
                    Some(step) => LayerInput::Step(step),
                    None => LayerInput::Tokens(tokens),
                };
                let chain = fused_hc.then(|| HcChain {
                    normed,
                    next: self.hc_after(i),
                });
                layer.forward(i, &hs, input, c, offset, parts(i), chain, tap)
            },
        )
    }

    /// The hyper-connection whose norm follows layer `i`'s MoE injection directly: the next
    /// layer's attention one, the final mixer's after the last layer; `None` before a PLE
    /// layer, whose embedding is added to the streams between the two.
    fn hc_after(&self, i: usize) -> Option<&HyperConnection> {
        match self.layers.get(i + 1) {
            Some(next) if next.ple.is_some() => None,
            Some(next) => Some(&next.attn_hc),
            None => Some(&self.final_mixer),
        }
    }

    /// `[1, vocab]` f32 logits of `token` (already checked against the vocabulary) after
    /// what `cache` holds, on the fused step (fused decode on), advancing the cache, each
    /// layer shown to `tap`. On CUDA without a tap the step is replayed from a captured
    /// graph where it can be (`cuda_graph.rs`); with one it runs eagerly.
    pub fn decode_step(
        &self,
        ends: &Ends,
        token: u32,
        cache: &mut Cache,
        tap: Option<&mut dyn Tap>,
    ) -> Result<Tensor> {
        let Some(tap) = tap else {
            #[cfg(feature = "cuda")]
            if ends.device.is_cuda() && self.cuda_graph && crate::cuda_graph::enabled() {
                return super::cuda_graph::step(self, ends, token, cache);
            }
            return self.decode_step(ends, token, cache, Some(&mut NoTap));
        };
        let values = self.step_values(token, cache)?;
        let step = values.upload(ends.device)?;
        let logits = self.decode_step_on(ends, &step, cache, tap)?;
        values.advance_contexts(cache)?;
        Ok(logits)
    }

    /// The fused step on the inputs held in `step`'s device tensors (what a captured graph
    /// reads on replay): embedding, layers, final mixer and head; advances the cache's
    /// offset, KV lengths and indexer counts, not the PLE contexts ([`super::step_inputs::StepValues`]'s).
    pub(crate) fn decode_step_on(
        &self,
        ends: &Ends,
        step: &StepInputs,
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        tap.begin_pass()?;
        let embedded = ends.embed.forward_ids(&step.token, ends.dtype)?; // [1, H]
        tap.part(Part::Embedding, &embedded, &embedded)?;
        let hs = self.streams_of(&embedded)?;
        let (hs, normed) = self.layers_forward(hs, &[], Some(step), cache, tap)?;
        cache.offset += 1;
        let mixed = match normed {
            Some(n) => self.final_mixer.mix_normed(&n)?.0,
            None => self.final_mix(&hs)?,
        };
        let logits = ends.head.forward(&mixed)?;
        tap.part(Part::OutputHead, &logits, &logits)?;
        cast(&logits, DType::F32)
    }

    /// The final mixer: streams `[T, S·H]` → the lm_head input `[T, H]`; one token's on the
    /// fused kernels when the decode step's hyper-connections are.
    pub fn final_mix(&self, hs: &Tensor) -> Result<Tensor> {
        if self.fused_hc && hs.dim(0)? == 1 {
            let n = self.final_mixer.normed(hs)?;
            return Ok(self.final_mixer.mix_normed(&n)?.0);
        }
        Ok(self.final_mixer.forward(hs)?.0)
    }
}

/// How a fused step's hyper-connections meet across a layer boundary: a layer's last launch
/// (the MoE block's injection, `hc_inject_norm`) also computes the norm of the
/// hyper-connection after it, one launch instead of two.
#[derive(Debug, Clone)]
pub struct HcChain<'a> {
    /// This layer's attention hyper-connection's normed streams, when the previous layer's
    /// injection computed them; `None` on the first layer and after a PLE layer's embedding.
    pub normed: Option<Tensor>,
    /// The hyper-connection whose norm this layer's injection computes (the next layer's
    /// attention one or the final mixer); `None` when something comes between.
    pub next: Option<&'a HyperConnection>,
}

/// What a layer runs on: a prompt's (or a composed step's) token ids, or a fused step's
/// inputs on the device.
#[derive(Debug, Clone, Copy)]
pub enum LayerInput<'a> {
    Tokens(&'a [u32]),
    Step(&'a StepInputs),
}

impl Qwen4ExpLayer {
    /// Runs `tokens` (at positions `offset..`) through layer `i`: streams `hs` `[T, S·H]` in
    /// and out, `cache` advanced, the streams after each part shown to `tap`; the parts
    /// `fused` names run on the fused kernels (one token only), and with `fused_hc` the
    /// hyper-connections too: the attention hyper-connection's norm (one launch, or none
    /// when `fused_hc` carries it in), the mixer's injection fused with the MoE
    /// hyper-connection's norm (one), the MoE block's injection with the norm of
    /// `fused_hc.next` (one, which also sums the fused MoE block's slots; its normed streams
    /// returned with the streams), and each hyper-connection's merged down and inject
    /// product and `hc_up_mix` (activation, up product and mixing).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        i: usize,
        hs: &Tensor,
        input: LayerInput,
        cache: &mut LayerCache,
        offset: usize,
        fused: LayerCoverage,
        fused_hc: Option<HcChain>,
        tap: &mut dyn Tap,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let hs = self.add_per_layer_embedding(i, hs, input, cache)?;
        let step = match input {
            LayerInput::Step(step) => Some(step),
            LayerInput::Tokens(_) => None,
        };
        if self.ple.is_some() {
            tap.part(Part::PerLayerEmbedding { layer: i }, &hs, &hs)?;
        }
        let mixer = Part::Mixer {
            layer: i,
            attention: matches!(self.mixer, Qwen4Mixer::Qsa(_)),
        };
        let feed_forward = Part::FeedForward {
            layer: i,
            moe: true,
        };
        let Some(chain) = fused_hc else {
            let hs = self.mixer_residual(&hs, cache, offset, fused.mixer, step)?;
            tap.part(mixer, &hs, &hs)?;
            let hs = self.feed_forward_residual(&hs, fused.feed_forward)?;
            tap.part(feed_forward, &hs, &hs)?;
            return Ok((hs, None));
        };
        let n = match chain.normed {
            Some(n) if self.ple.is_none() => n,
            Some(_) => bail!("layer {i}: normed streams carried into a PLE layer"),
            None => self.attn_hc.normed(&hs)?,
        };
        let (x, g) = self.attn_hc.mix_normed(&n)?;
        let g = g.ok_or_else(|| anyhow!("attention hyper-connection without injection"))?;
        let y = self.mixer_output(&x, cache, offset, fused.mixer, step)?;
        let (hs, n) = HyperConnection::inject_normed(&hs, &y, &g, Some(&self.mlp_hc))?;
        let n = n.ok_or_else(|| anyhow!("hc_inject_norm returned no normed streams"))?;
        tap.part(mixer, &hs, &hs)?;
        let (x, g) = self.mlp_hc.mix_normed(&n)?;
        let g = g.ok_or_else(|| anyhow!("MoE hyper-connection without injection"))?;
        let (hs, next) = if fused.feed_forward {
            let (down, weights) = fused::moe_slots(&self.moe, &x)?;
            HyperConnection::inject_slots_normed(&hs, (&down, &weights), &g, chain.next)?
        } else {
            let y = self.moe_output(&x, false)?;
            HyperConnection::inject_normed(&hs, &y, &g, chain.next)?
        };
        tap.part(feed_forward, &hs, &hs)?;
        Ok((hs, next))
    }

    /// The streams plus this layer's (layer `i`'s) per-layer embedding (unchanged on a layer
    /// without one): of `tokens`, advancing the PLE's n-gram context and conv window, or of
    /// a step's gathered rows, advancing the window in place (the context is the step's
    /// caller's).
    pub fn add_per_layer_embedding(
        &self,
        i: usize,
        hs: &Tensor,
        input: LayerInput,
        cache: &mut LayerCache,
    ) -> Result<Tensor> {
        let Some(ple) = &self.ple else {
            return Ok(hs.clone());
        };
        let LayerCache::Gdn(c) = cache else {
            bail!("cache does not belong to this model");
        };
        let state = state::ple_mut(c)
            .ok_or_else(|| anyhow!("cache lacks the per-layer embedding state"))?;
        let term = match input {
            LayerInput::Tokens(tokens) => ple.forward(hs, tokens, state)?,
            LayerInput::Step(step) => {
                let rows = step
                    .ple_rows
                    .get(i)
                    .and_then(Option::as_ref)
                    .ok_or_else(|| anyhow!("step inputs without layer {i}'s PLE rows"))?;
                ple.forward_rows(hs, rows, state, step.in_place)?
            }
        };
        candle_op(hs.add(&term))
    }

    /// The attention hyper-connection, the mixer (GDN or QSA) and its injection into the
    /// streams; advances the mixer's cache.
    pub fn mixer_residual(
        &self,
        hs: &Tensor,
        cache: &mut LayerCache,
        offset: usize,
        fused: bool,
        step: Option<&StepInputs>,
    ) -> Result<Tensor> {
        let (x, w) = self.attn_hc.forward(hs)?;
        let w = w.ok_or_else(|| anyhow!("attention hyper-connection without injection"))?;
        let y = self.mixer_output(&x, cache, offset, fused, step)?;
        HyperConnection::inject(hs, &y, &w)
    }

    /// The mixer (GDN or QSA) on its input `x` `[T, H]`, on the fused kernels where `fused`
    /// says (one token, whose `step` inputs the fused QSA mixer reads): its output `[T, H]`;
    /// advances the mixer's cache.
    fn mixer_output(
        &self,
        x: &Tensor,
        cache: &mut LayerCache,
        offset: usize,
        fused: bool,
        step: Option<&StepInputs>,
    ) -> Result<Tensor> {
        Ok(match (&self.mixer, cache) {
            (Qwen4Mixer::Gdn(m), LayerCache::Gdn(c)) if fused => fused::gdn_mixer(m, x, c)?,
            (Qwen4Mixer::Gdn(m), LayerCache::Gdn(c)) => {
                let kept = step
                    .filter(|s| s.in_place)
                    .map(|_| (c.conv.clone(), c.state.clone()));
                let y = m.forward(&x.unsqueeze(0)?, c)?.squeeze(0)?;
                if let Some((conv, state)) = kept {
                    c.conv = fused::kept_in_place(conv, c.conv.take())?;
                    c.state = fused::kept_in_place(state, c.state.take())?;
                }
                y
            }
            (Qwen4Mixer::Qsa(q), LayerCache::Attention(c)) if fused => {
                let step = step.ok_or_else(|| anyhow!("a fused QSA mixer without step inputs"))?;
                fused::qsa_mixer(q, x, c, offset, step)?
            }
            (Qwen4Mixer::Qsa(q), LayerCache::Attention(c)) => {
                let (attention, indexer) = (&q.attention, &q.indexer);
                let keys = state::indexer_mut(c)
                    .ok_or_else(|| anyhow!("cache lacks the QSA indexer state"))?;
                let visible = indexer.select(x, keys, offset)?;
                let mask = QsaIndexer::mask(&visible)?
                    .to_device(x.device())?
                    .to_dtype(x.dtype())?;
                attention
                    .forward_masked(&x.unsqueeze(0)?, c, offset, Some(&mask))?
                    .squeeze(0)?
            }
            _ => bail!("cache does not belong to this model"),
        })
    }

    /// The MoE hyper-connection, the MoE block and its injection into the streams.
    pub fn feed_forward_residual(&self, hs: &Tensor, fused: bool) -> Result<Tensor> {
        let (x, w) = self.mlp_hc.forward(hs)?;
        let w = w.ok_or_else(|| anyhow!("MoE hyper-connection without injection"))?;
        let y = self.moe_output(&x, fused)?;
        HyperConnection::inject(hs, &y, &w)
    }

    /// The MoE block on its input `x` `[T, H]`, on the fused kernels when `fused` (one
    /// token): its output `[T, H]`, without a residual.
    fn moe_output(&self, x: &Tensor, fused: bool) -> Result<Tensor> {
        if fused {
            fused::moe_block(&self.moe, x)
        } else {
            Ok(self.moe.forward(&x.unsqueeze(0)?)?.squeeze(0)?)
        }
    }
}
