//! The whole model: embeddings, decoder layers (GDN or gated attention, then dense MLP or
//! MoE, each behind a pre-norm and a residual add), final norm and output head. `qwen4_exp`
//! replaces the layers and the final norm by its own decoder ([`qwen4_exp`]).

use crate::cache::{Cache, GdnCache, KvCache, LayerCache};
use crate::config::LayerKind;
use crate::layers::attention::Attention;
use crate::layers::gdn::GatedDeltaNet;
use crate::layers::linear::{Embedding, Linear};
use crate::layers::mlp::Mlp;
use crate::layers::moe::{MoePrefill, SparseMoe};
use crate::layers::norm::cast;
use crate::layers::norm::RmsNorm;
use crate::phase_profile::phase;
use crate::weights::Checkpoint;
use crate::{Config, LayerVariants, Plan, RunOptions, StateDtype};
use anyhow::{bail, ensure, Result};
use candle_core::{DType, Device, Tensor};
use gdn_ops::launches::candle_op;
use std::path::Path;

#[cfg(feature = "cuda")]
pub(crate) mod cuda_graph;
mod decode;
mod launch_budget;
pub mod qwen4_exp;
pub use decode::LayerCoverage;
pub use launch_budget::{ple_layers, LaunchBudget};

#[derive(Debug, Clone)]
pub enum Mixer {
    Gdn(GatedDeltaNet),
    Attention(Attention),
}

#[derive(Debug, Clone)]
pub enum FeedForward {
    Dense(Mlp),
    Moe(Box<SparseMoe>),
}

#[derive(Debug, Clone)]
pub struct DecoderLayer {
    input_norm: RmsNorm,
    pub mixer: Mixer,
    post_norm: RmsNorm,
    pub feed_forward: FeedForward,
}

impl DecoderLayer {
    fn load(ckpt: &Checkpoint, i: usize, cfg: &Config) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let dev = &Device::Cpu;
        let eps = cfg.rms_norm_eps as f32;
        let mixer = match cfg.layer_kind(i) {
            LayerKind::LinearAttention => {
                Mixer::Gdn(GatedDeltaNet::load(ckpt, &format!("{p}.linear_attn"), cfg)?)
            }
            LayerKind::FullAttention => {
                Mixer::Attention(Attention::load(ckpt, &format!("{p}.self_attn"), cfg)?)
            }
        };
        let feed_forward = if cfg.is_moe_layer(i) {
            FeedForward::Moe(Box::new(SparseMoe::load(ckpt, &format!("{p}.mlp"), cfg)?))
        } else {
            FeedForward::Dense(Mlp::load(
                ckpt,
                &format!("{p}.mlp"),
                cfg.hidden_size,
                cfg.intermediate_size,
                cfg,
            )?)
        };
        Ok(Self {
            input_norm: RmsNorm {
                weight: ckpt.norm(&format!("{p}.input_layernorm.weight"), cfg.hidden_size, dev)?,
                eps,
            },
            mixer,
            post_norm: RmsNorm {
                weight: ckpt.norm(
                    &format!("{p}.post_attention_layernorm.weight"),
                    cfg.hidden_size,
                    dev,
                )?,
                eps,
            },
            feed_forward,
        })
    }

    /// The device plan's copy of this layer; the host copy is dropped as it goes.
    fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            input_norm: self.input_norm.into_device(device, dtype)?,
            mixer: match self.mixer {
                Mixer::Gdn(m) => Mixer::Gdn(m.into_device(device, dtype)?),
                Mixer::Attention(m) => Mixer::Attention(m.into_device(device, dtype)?),
            },
            post_norm: self.post_norm.into_device(device, dtype)?,
            feed_forward: match self.feed_forward {
                FeedForward::Dense(m) => FeedForward::Dense(m.into_device(device, dtype)?),
                FeedForward::Moe(m) => FeedForward::Moe(Box::new(m.into_device(device, dtype)?)),
            },
        })
    }

    fn new_cache(&self, state_dtype: StateDtype) -> LayerCache {
        match self.mixer {
            Mixer::Gdn(_) => LayerCache::Gdn(GdnCache {
                state_dtype,
                ..GdnCache::default()
            }),
            Mixer::Attention(_) => LayerCache::Attention(KvCache::default()),
        }
    }

    /// The mixer's contribution to the residual stream: `mixer(input_norm(h))`.
    pub fn mixer_forward(
        &self,
        h: &Tensor,
        cache: &mut LayerCache,
        offset: usize,
    ) -> Result<Tensor> {
        let device = h.device();
        match (&self.mixer, cache) {
            (Mixer::Gdn(m), LayerCache::Gdn(c)) => {
                phase("gdn", device, || m.forward(&self.input_norm.forward(h)?, c))
            }
            (Mixer::Attention(m), LayerCache::Attention(c)) => phase("attention", device, || {
                m.forward(&self.input_norm.forward(h)?, c, offset)
            }),
            _ => bail!("cache does not belong to this model"),
        }
    }

    /// The feed-forward contribution: `mlp(post_attention_norm(h))`.
    pub fn feed_forward(&self, h: &Tensor) -> Result<Tensor> {
        let device = h.device();
        match &self.feed_forward {
            FeedForward::Dense(m) => {
                phase("mlp", device, || m.forward(&self.post_norm.forward(h)?))
            }
            FeedForward::Moe(m) => phase("moe", device, || m.forward(&self.post_norm.forward(h)?)),
        }
    }

    pub fn forward(&self, h: &Tensor, cache: &mut LayerCache, offset: usize) -> Result<Tensor> {
        let h = candle_op(h + self.mixer_forward(h, cache, offset)?)?;
        candle_op(&h + self.feed_forward(&h)?)
    }
}

pub struct Model {
    config: Config,
    device: Device,
    dtype: DType,
    plan: Plan,
    q8_activations: bool,
    gdn_state_dtype: StateDtype,
    embed: Embedding,
    /// Empty for `qwen4_exp`, whose layers are in `qwen4_exp`.
    layers: Vec<DecoderLayer>,
    /// `None` for `qwen4_exp` (its final stream mixer takes the norm's place).
    norm: Option<RmsNorm>,
    /// The `qwen4_exp` decoder (reference plan only so far).
    qwen4_exp: Option<qwen4_exp::Qwen4ExpDecoder>,
    lm_head: Linear,
    /// Decode steps run on the fused kernels (device plan); off, they run the composed ops.
    fused_decode: bool,
    /// Per layer, what the fused kernels cover.
    coverage: Vec<LayerCoverage>,
    /// Decode steps on CUDA replay captured graphs (`RunOptions::cuda_graph`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    cuda_graph: bool,
    warnings: Vec<String>,
}

impl Model {
    /// Loads a checkpoint folder: mlx-community (quantized or not) or raw HF layout.
    pub fn load(dir: &Path, device: &Device, opts: &RunOptions) -> Result<Self> {
        if !dir.is_dir() {
            bail!("{}: model folder does not exist", dir.display());
        }
        let plan = opts
            .plan
            .unwrap_or_else(|| Plan::for_device(device, opts.dtype));
        match plan {
            Plan::Reference => {
                ensure!(
                    device.is_cpu(),
                    "the reference plan runs on the CPU only (got {device:?})"
                );
                ensure!(
                    opts.dtype == DType::F32,
                    "the reference plan computes in f32 (got {:?})",
                    opts.dtype
                );
            }
            Plan::Device => {
                ensure!(
                    matches!(opts.dtype, DType::F32 | DType::BF16 | DType::F16),
                    "unsupported compute dtype {:?} (use f32, bf16 or f16)",
                    opts.dtype
                );
                ensure!(
                    !opts.q8_activations,
                    "8-bit activations are a CPU reference-plan mode (use --dtype f32 on the CPU)"
                );
            }
        }
        let variants = opts.layer_variants(device);
        opts.apply_process_wide();
        let cfg = Config::from_dir(dir)?;
        let mut ckpt = Checkpoint::open(dir, &cfg)?;
        ckpt.report_progress(opts.progress.clone());
        ckpt.interleave_for_q8(
            opts.q8_activations && gdn_ops::affine_q8_interleaved::repack_at_load(opts.q8_layout),
        );
        // Each part moves to the device as soon as it is built, so that the host holds at
        // most one layer beyond the mapped files.
        let place = |w: crate::weights::Weight| match plan {
            Plan::Reference => Ok(w),
            Plan::Device => w.into_device(device, opts.dtype),
        };
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed = Embedding {
            table: place(crate::weights::Weight::Host(ckpt.matrix(
                "model.embed_tokens",
                v,
                h,
                &cfg,
            )?))?,
        };
        let lm_head = if cfg.tie_word_embeddings {
            embed.as_linear()
        } else {
            let head = Linear::load(&ckpt, "lm_head", v, h, &cfg)?;
            match plan {
                Plan::Reference => head,
                Plan::Device => head.into_device(device, opts.dtype)?,
            }
        };
        let qwen4_exp = match cfg.qwen4_exp {
            Some(_) => {
                let decoder = qwen4_exp::Qwen4ExpDecoder::load(&ckpt, &cfg)?;
                Some(match plan {
                    Plan::Reference => decoder,
                    Plan::Device => decoder.into_device(device, opts.dtype)?,
                })
            }
            None => None,
        };
        let plain_layers = if qwen4_exp.is_some() {
            0
        } else {
            cfg.num_hidden_layers
        };
        let layers = (0..plain_layers)
            .map(|i| {
                let layer = DecoderLayer::load(&ckpt, i, &cfg)?;
                match plan {
                    Plan::Reference => Ok(layer),
                    Plan::Device => layer.into_device(device, opts.dtype),
                }
                .map_err(|e| e.context(format!("loading layer {i}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = match qwen4_exp {
            Some(_) => None,
            None => Some(
                RmsNorm {
                    weight: ckpt.norm("model.norm.weight", h, &Device::Cpu)?,
                    eps: cfg.rms_norm_eps as f32,
                }
                .into_device(device, opts.dtype)?,
            ),
        };
        let warnings = ckpt.leftovers()?.into_iter().collect();
        let mut model = Self {
            config: cfg,
            device: device.clone(),
            dtype: opts.dtype,
            plan,
            q8_activations: opts.q8_activations,
            gdn_state_dtype: opts.gdn_state_dtype,
            embed,
            layers,
            norm,
            qwen4_exp,
            lm_head,
            warnings,
            fused_decode: false,
            coverage: vec![],
            cuda_graph: opts.cuda_graph,
        };
        model.set_variants(&variants);
        model.coverage = model.fused_coverage();
        model.set_fused_decode(plan == Plan::Device && opts.fused_decode);
        Ok(model)
    }

    /// Hands every layer the run's kernel variants (`RunOptions::layer_variants`).
    fn set_variants(&mut self, v: &LayerVariants) {
        for layer in &mut self.layers {
            match &mut layer.mixer {
                Mixer::Gdn(m) => m.set_variants(v),
                Mixer::Attention(m) => m.set_variants(v),
            }
        }
        if let Some(q) = &mut self.qwen4_exp {
            q.set_variants(v);
        }
        self.set_moe_prefill(v.moe_prefill);
    }

    /// How prefill chunks run the device plan's quantized expert products: one grouped GEMM
    /// per projection (the default on CUDA), grouped per expert (elsewhere), or per (token,
    /// slot) pair, the reference; `RunOptions::moe_prefill` at load. The reference plan always
    /// groups its products on the host.
    pub fn set_moe_prefill(&mut self, mode: MoePrefill) {
        for layer in &mut self.layers {
            if let FeedForward::Moe(moe) = &mut layer.feed_forward {
                moe.set_prefill(mode);
            }
        }
        if let Some(q) = &mut self.qwen4_exp {
            q.set_moe_prefill(mode);
        }
    }

    /// Runs decode steps on the fused kernels (device plan only), or on the composed ops:
    /// the reference the fused path is tested against. Layers outside the kernels' coverage
    /// always run composed, and are named once on stderr.
    pub fn set_fused_decode(&mut self, on: bool) {
        // qwen4_exp has no fused kernels yet: its decode steps run the composed ops.
        self.fused_decode = on && self.plan == Plan::Device && self.qwen4_exp.is_none();
        if on && self.plan == Plan::Device && self.qwen4_exp.is_some() {
            static QWEN4_ONCE: std::sync::Once = std::sync::Once::new();
            QWEN4_ONCE.call_once(|| {
                eprintln!("note: no fused decode kernels for qwen4_exp yet; its decode steps run composed ops")
            });
        }
        if self.fused_decode {
            let composed: Vec<String> = self
                .coverage
                .iter()
                .enumerate()
                .filter(|(_, c)| !(c.mixer && c.feed_forward))
                .map(|(i, c)| {
                    let part = match (c.mixer, c.feed_forward) {
                        (false, false) => "mixer and feed-forward",
                        (false, true) => "mixer",
                        _ => "feed-forward",
                    };
                    format!("{i} ({part})")
                })
                .collect();
            if !composed.is_empty() {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    eprintln!(
                        "note: no fused decode kernels for layers {} in {:?}; they run composed ops",
                        composed.join(", "),
                        self.dtype
                    )
                });
            }
        }
    }

    pub fn fused_decode(&self) -> bool {
        self.fused_decode
    }

    /// Per layer, whether the fused decode kernels cover its mixer and its feed-forward.
    pub fn fused_coverage_per_layer(&self) -> &[LayerCoverage] {
        &self.coverage
    }

    /// What loading found odd but harmless (tensors a text model skips), for the user.
    pub fn load_warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Whether the reference plan's products round activations to 8 bits.
    pub fn q8_activations(&self) -> bool {
        self.q8_activations
    }

    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// How GDN recurrent states of new caches are stored.
    pub fn gdn_state_dtype(&self) -> StateDtype {
        self.gdn_state_dtype
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The decoder layers (empty for `qwen4_exp`: see [`Model::qwen4_exp`]).
    pub fn layers(&self) -> &[DecoderLayer] {
        &self.layers
    }

    /// The `qwen4_exp` decoder, for a model of that family.
    pub fn qwen4_exp(&self) -> Option<&qwen4_exp::Qwen4ExpDecoder> {
        self.qwen4_exp.as_ref()
    }

    /// Number of decoder layers, whatever their family.
    pub fn num_layers(&self) -> usize {
        self.qwen4_exp
            .as_ref()
            .map_or(self.layers.len(), |q| q.layers.len())
    }

    /// A fresh cache whose GDN states are stored in the dtype the model was loaded with.
    pub fn new_cache(&self) -> Cache {
        self.new_cache_with(self.gdn_state_dtype)
    }

    /// A fresh cache with GDN states stored in `state_dtype`.
    pub fn new_cache_with(&self, state_dtype: StateDtype) -> Cache {
        if let Some(q) = &self.qwen4_exp {
            return Cache::new(q.new_cache(state_dtype));
        }
        Cache::new(
            self.layers
                .iter()
                .map(|l| l.new_cache(state_dtype))
                .collect(),
        )
    }

    /// `[S]` ids → `[1, S, H]` embeddings.
    pub fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        Ok(self
            .embed
            .forward(tokens, &self.device, self.dtype)?
            .unsqueeze(0)?)
    }

    /// The final norm `[1, S, H]` → `[1, S, H]`; for `qwen4_exp` the final stream mixer,
    /// `[1, S, streams·H]` → `[1, S, H]`: the lm_head input either way.
    pub fn final_norm(&self, h: &Tensor) -> Result<Tensor> {
        match (&self.norm, &self.qwen4_exp) {
            (Some(norm), _) => norm.forward(h),
            (None, Some(q)) => Ok(q.final_mix(&h.squeeze(0)?)?.unsqueeze(0)?),
            (None, None) => bail!("model has no final norm"),
        }
    }

    /// Runs `tokens` through the decoder layers after what `cache` holds, updating it in
    /// place; returns the final hidden states `[1, S, H]` before the final norm
    /// (`[1, S, streams·H]` for `qwen4_exp`).
    fn run_layers(&self, tokens: &[u32], cache: &mut Cache) -> Result<Tensor> {
        self.run_layers_counted(tokens, cache, None)
    }

    /// [`Self::run_layers`], pushing each layer's kernel launches to `per_layer` if given.
    pub(crate) fn run_layers_counted(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        mut per_layer: Option<&mut Vec<usize>>,
    ) -> Result<Tensor> {
        ensure!(!tokens.is_empty(), "forward needs at least one token");
        ensure!(
            cache.layers.len() == self.num_layers(),
            "cache does not belong to this model"
        );
        self.on_host_workers(|| {
            let _q8 = gdn_ops::affine_q8::Scope::enter(self.q8_activations);
            if let Some(q) = &self.qwen4_exp {
                let mut hs = q.streams_of(&self.embed(tokens)?.squeeze(0)?)?;
                for (layer, c) in q.layers.iter().zip(cache.layers.iter_mut()) {
                    let before = gdn_ops::launches::count();
                    hs = layer.forward(&hs, tokens, c, cache.offset)?;
                    if let Some(counts) = per_layer.as_deref_mut() {
                        counts.push(gdn_ops::launches::count() - before);
                    }
                }
                cache.offset += tokens.len();
                return Ok(hs.unsqueeze(0)?);
            }
            let mut h = phase("embed", &self.device, || self.embed(tokens))?;
            for (layer, c) in self.layers.iter().zip(cache.layers.iter_mut()) {
                let before = gdn_ops::launches::count();
                h = layer.forward(&h, c, cache.offset)?;
                if let Some(counts) = per_layer.as_deref_mut() {
                    counts.push(gdn_ops::launches::count() - before);
                }
            }
            cache.offset += tokens.len();
            Ok(h)
        })
    }

    fn logits(&self, h: &Tensor) -> Result<Tensor> {
        self.on_host_workers(|| {
            let _q8 = gdn_ops::affine_q8::Scope::enter(self.q8_activations);
            let logits = phase("lm_head", &self.device, || {
                self.lm_head.forward(&self.final_norm(h)?)
            })?;
            crate::device_memory::sample(&self.device);
            cast(&logits.squeeze(0)?, DType::F32)
        })
    }

    /// The reference plan's products are host loops split over rayon: they run from a
    /// worker of the CPU pool (see `gdn_ops::threads`). The device plan stays on the
    /// caller's thread, where its per-thread launch counter and device queues live.
    fn on_host_workers<R: Send>(&self, work: impl FnOnce() -> Result<R> + Send) -> Result<R> {
        match self.plan {
            Plan::Reference => gdn_ops::threads::on_cpu_pool(work),
            Plan::Device => work(),
        }
    }

    /// Runs `tokens` (one sequence) after what `cache` already holds, updating it in place.
    /// Returns f32 logits of shape `[tokens.len(), vocab_size]` (every position: scoring).
    pub fn forward(&self, tokens: &[u32], cache: &mut Cache) -> Result<Tensor> {
        let h = self.run_layers(tokens, cache)?;
        self.logits(&h)
    }

    /// As [`Model::forward`], but only the last position goes through the output head:
    /// returns `[1, vocab_size]` (generation needs no more).
    pub fn forward_last(&self, tokens: &[u32], cache: &mut Cache) -> Result<Tensor> {
        if let (true, &[token]) = (self.fused_decode, tokens) {
            return self.decode_step(token, cache);
        }
        let h = self.run_layers(tokens, cache)?;
        let s = h.dim(1)?;
        self.logits(&h.narrow(1, s - 1, 1)?)
    }

    /// Runs a prompt in chunks of at most `chunk` tokens, without computing any logits.
    pub fn prefill(&self, tokens: &[u32], cache: &mut Cache, chunk: usize) -> Result<()> {
        ensure!(chunk > 0, "prefill chunk size must be positive");
        for part in tokens.chunks(chunk) {
            self.run_layers(part, cache)?;
            crate::device_memory::sample(&self.device);
            // Nothing of a prefill chunk is read back, and candle's Metal pool releases the
            // buffers a chunk dropped only at a host sync: without one, a long prompt holds
            // every chunk's temporaries at once.
            self.device.synchronize()?;
        }
        Ok(())
    }
}
