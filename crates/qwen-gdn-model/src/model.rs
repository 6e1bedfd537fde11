//! The whole model: the token embedding, a family's decoder ([`Decoder`]: its layers and
//! what takes the final norm's place) and the output head. Every forward pass runs the
//! family's one layer loop ([`crate::tap::each_layer`]); instrumentation watches it through
//! a [`Tap`].

use crate::cache::Cache;
use crate::families::hybrid::{DecoderLayer, HybridDecoder, LayerCoverage};
use crate::families::qwen4_exp::Qwen4ExpDecoder;
use crate::families::{Decoder, Ends};
use crate::layers::linear::{Embedding, Linear};
use crate::layers::moe::MoePrefill;
use crate::tap::{LaunchCounter, NoTap, Part, Tap};
use crate::tensor::cast;
use crate::weights::{row_exact, Checkpoint};
use crate::{Config, ModelPart, Plan, RunOptions, StateDtype};
use anyhow::{bail, ensure, Result};
use candle_core::{DType, Device, Tensor};
use std::path::Path;

mod batch_step;
mod launch_budget;
mod mtp;
mod random_weights;
mod verify;
pub use launch_budget::{carried_norm_layers, ple_layers, LaunchBudget};
pub use mtp::MtpPrecision;
pub use random_weights::RandomWeights;

pub struct Model {
    config: Config,
    device: Device,
    dtype: DType,
    plan: Plan,
    q8_activations: bool,
    gdn_state_dtype: StateDtype,
    /// The token embedding; `None` on a pipeline stage other than the first.
    embed: Option<Embedding>,
    decoder: Decoder,
    /// The output head; `None` on a pipeline stage other than the last.
    lm_head: Option<Linear>,
    /// What this process holds of the model ([`ModelPart`]).
    part: ModelPart,
    /// The whole checkpoint's headers, hashed before a stage's view is cut
    /// ([`Checkpoint::header_fingerprint`]).
    checkpoint_fingerprint: u64,
    /// How batched decode steps run their products ([`Model::decode_batch`]).
    batch_products: crate::BatchProducts,
    batch_moe: crate::BatchMoe,
    /// Verify passes on the fused kernels where the fused decode step runs
    /// (`RunOptions::fused_verify`; [`Model::verify`]).
    fused_verify: bool,
    /// The multi-token-prediction head, once [`Model::load_mtp`] found one.
    mtp: Option<crate::families::FamilyMtpHead>,
    warnings: Vec<String>,
    /// Every tensor the loaders read, as stored: (canonical name, dtype, shape), sorted.
    weight_layout: Vec<(String, String, Vec<usize>)>,
}

impl Model {
    /// Loads a checkpoint folder: mlx-community (quantized or not) or raw HF layout.
    pub fn load(dir: &Path, device: &Device, opts: &RunOptions) -> Result<Self> {
        if !dir.is_dir() {
            bail!("{}: model folder does not exist", dir.display());
        }
        let plan = Self::checked_plan(device, opts)?;
        let cfg = Config::from_dir(dir)?;
        let ckpt = Checkpoint::open(dir, &cfg)?;
        Self::from_checkpoint(cfg, ckpt, plan, device, opts)
    }

    /// The plan `opts` asks for (else the device's), refused where it cannot run.
    fn checked_plan(device: &Device, opts: &RunOptions) -> Result<Plan> {
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
        Ok(plan)
    }

    /// Builds the model from `ckpt`'s tensors, files or random ([`Model::random`]).
    fn from_checkpoint(
        cfg: Config,
        mut ckpt: Checkpoint,
        plan: Plan,
        device: &Device,
        opts: &RunOptions,
    ) -> Result<Self> {
        let variants = opts.layer_variants(device);
        opts.apply_process_wide()?;
        let part = opts.part.clone();
        if part.is_stage() {
            ensure!(
                cfg.qwen4_exp.is_none(),
                "a pipeline stage runs the hybrid family only (qwen4_exp is not split yet)"
            );
            let layers = part.layers(cfg.num_hidden_layers);
            ensure!(
                !layers.is_empty() && layers.end <= cfg.num_hidden_layers,
                "pipeline stage layers {layers:?} are not within the model's {} layers",
                cfg.num_hidden_layers
            );
        }
        let tied = cfg.tie_word_embeddings;
        let checkpoint_fingerprint = ckpt.header_fingerprint();
        ckpt.restrict_to(&part, tied);
        ckpt.report_progress(opts.progress.clone());
        ckpt.interleave_for_q8(
            opts.q8_activations
                && gdn_ops::ops::affine::q8_interleaved::repack_at_load(opts.q8_layout),
        );
        // Each part moves to the device as soon as it is built, so that the host holds at
        // most one layer beyond the mapped files.
        let place = |w: crate::weights::Weight| match plan {
            Plan::Reference => Ok(w),
            Plan::Device => w.into_device(device, opts.dtype),
        };
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        // A tied head is the embedding table: the last stage reads it too.
        let embed = if part.embeds() || (tied && part.has_head()) {
            Some(Embedding {
                table: place(crate::weights::Weight::Host(ckpt.matrix(
                    "model.embed_tokens",
                    v,
                    h,
                    &cfg,
                )?))?,
            })
        } else {
            None
        };
        let lm_head = match (part.has_head(), &embed) {
            (false, _) => None,
            (true, Some(embed)) if tied => Some(embed.as_linear()),
            (true, _) => {
                let head = Linear::load(&ckpt, "lm_head", v, h, &cfg)?;
                Some(match plan {
                    Plan::Reference => head,
                    Plan::Device => head.into_device(device, opts.dtype)?,
                })
            }
        };
        let embed = embed.filter(|_| part.embeds());
        let decoder = match cfg.qwen4_exp {
            Some(_) => {
                let target = (plan == Plan::Device).then_some((device, opts.dtype));
                Decoder::Qwen4Exp(Box::new(Qwen4ExpDecoder::load(&ckpt, &cfg, target)?))
            }
            None => Decoder::Hybrid(HybridDecoder::load(
                &ckpt, &cfg, plan, device, opts.dtype, &part,
            )?),
        };
        let warnings = ckpt.leftovers()?.into_iter().collect();
        let weight_layout = ckpt.used_layout();
        let mut model = Self {
            config: cfg,
            device: device.clone(),
            dtype: opts.dtype,
            plan,
            q8_activations: opts.q8_activations,
            gdn_state_dtype: opts.gdn_state_dtype,
            embed,
            decoder,
            lm_head,
            part,
            checkpoint_fingerprint,
            batch_products: crate::BatchProducts::default_for(plan),
            batch_moe: crate::BatchMoe::default(),
            fused_verify: opts.fused_verify,
            mtp: None,
            warnings,
            weight_layout,
        };
        model.decoder.set_variants(&variants);
        model.set_fused_decode(plan == Plan::Device && opts.fused_decode);
        Ok(model)
    }

    /// How prefill chunks run the device plan's quantized expert products: one grouped GEMM
    /// per projection (the default on CUDA), grouped per expert (elsewhere), or per (token,
    /// slot) pair, the reference; `RunOptions::moe_prefill` at load. The reference plan always
    /// groups its products on the host.
    pub fn set_moe_prefill(&mut self, mode: MoePrefill) {
        self.decoder.set_moe_prefill(mode);
    }

    /// Runs decode steps on the fused kernels (device plan only), or on the composed ops:
    /// the reference the fused path is tested against. Layers outside the kernels' coverage
    /// always run composed, and are named once on stderr.
    pub fn set_fused_decode(&mut self, on: bool) {
        let on = on && self.plan == Plan::Device;
        match &mut self.decoder {
            Decoder::Hybrid(d) => d.set_fused_decode(on, self.dtype),
            // The GDN mixers and MoE blocks run fused; the rest of its step stays composed
            // (families/qwen4_exp/fused.rs says what and why).
            Decoder::Qwen4Exp(d) => d.set_fused_decode(on, self.dtype),
        }
    }

    pub fn fused_decode(&self) -> bool {
        match &self.decoder {
            Decoder::Hybrid(d) => d.fused_decode(),
            Decoder::Qwen4Exp(d) => d.fused_decode(),
        }
    }

    /// Per layer, whether the fused decode kernels cover its mixer and its feed-forward.
    pub fn fused_coverage_per_layer(&self) -> &[LayerCoverage] {
        match &self.decoder {
            Decoder::Hybrid(d) => d.coverage(),
            Decoder::Qwen4Exp(d) => d.coverage(),
        }
    }

    /// Every tensor the loaders read, as stored (canonical name, dtype, shape; sorted): what
    /// the random-weights test compares with a checkpoint's (the shapes of packed words and
    /// group parameters give the bits and group size).
    pub fn weight_layout(&self) -> &[(String, String, Vec<usize>)] {
        &self.weight_layout
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

    /// The family's layers, for plans that reshape them after load (expert parallel).
    pub(crate) fn decoder_mut(&mut self) -> &mut Decoder {
        &mut self.decoder
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

    /// The family's decoder.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// The hybrid family's decoder layers (empty for `qwen4_exp`: see [`Model::qwen4_exp`]).
    pub fn layers(&self) -> &[DecoderLayer] {
        match &self.decoder {
            Decoder::Hybrid(d) => &d.layers,
            Decoder::Qwen4Exp(_) => &[],
        }
    }

    /// The `qwen4_exp` decoder, for a model of that family.
    pub fn qwen4_exp(&self) -> Option<&Qwen4ExpDecoder> {
        match &self.decoder {
            Decoder::Qwen4Exp(d) => Some(d.as_ref()),
            Decoder::Hybrid(_) => None,
        }
    }

    /// Number of decoder layers, whatever their family.
    pub fn num_layers(&self) -> usize {
        self.decoder.num_layers()
    }

    /// Refuses a token id outside the vocabulary, in one line: the device plan's embedding
    /// gathers rows by device ids, which would read past the table.
    pub(crate) fn check_token_ids(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            bail!("token id {bad} is outside the vocabulary ({vocab})");
        }
        Ok(())
    }

    /// Refuses a cache made for another model (another layer count).
    pub(crate) fn check_cache(&self, cache: &Cache) -> Result<()> {
        ensure!(
            cache.layers.len() == self.num_layers(),
            "cache does not belong to this model"
        );
        Ok(())
    }

    /// A fresh cache whose GDN states are stored in the dtype the model was loaded with.
    pub fn new_cache(&self) -> Cache {
        self.new_cache_with(self.gdn_state_dtype)
    }

    /// A fresh cache with GDN states stored in `state_dtype`.
    pub fn new_cache_with(&self, state_dtype: StateDtype) -> Cache {
        self.decoder.new_cache(state_dtype)
    }

    /// What this process holds of the model: all of it, or one pipeline stage.
    pub fn part(&self) -> &ModelPart {
        &self.part
    }

    /// A hash of the whole checkpoint's tensor headers (names, dtypes, shapes, byte ranges),
    /// the same on every pipeline stage although each reads only its own tensors' data.
    pub fn checkpoint_fingerprint(&self) -> u64 {
        self.checkpoint_fingerprint
    }

    /// The token embedding (every process but a pipeline's non-first stages holds it).
    pub(crate) fn embedding(&self) -> Result<&Embedding> {
        self.embed
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this pipeline stage does not hold the embedding"))
    }

    /// The output head (every process but a pipeline's non-last stages holds it).
    /// What a family's fused passes take from outside its layers: the embedding, the output
    /// head, the device and the dtype.
    pub(crate) fn ends(&self) -> Result<Ends<'_>> {
        Ok(Ends {
            embed: self.embedding()?,
            head: self.head()?,
            device: &self.device,
            dtype: self.dtype,
        })
    }

    pub(crate) fn head(&self) -> Result<&Linear> {
        self.lm_head
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this pipeline stage does not hold the output head"))
    }

    /// `[S]` ids → `[1, S, H]` embeddings.
    pub fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        Ok(self
            .embedding()?
            .forward(tokens, &self.device, self.dtype)?
            .unsqueeze(0)?)
    }

    /// The final norm `[1, S, H]` → `[1, S, H]`; for `qwen4_exp` the final stream mixer,
    /// `[1, S, streams·H]` → `[1, S, H]`: the lm_head input either way.
    pub fn final_norm(&self, h: &Tensor) -> Result<Tensor> {
        self.decoder.final_norm(h)
    }

    /// Runs `tokens` through the decoder layers after what `cache` holds, updating it in
    /// place; returns the final hidden states `[1, S, H]` before the final norm
    /// (`[1, S, streams·H]` for `qwen4_exp`). `tap` sees the embedding, every layer and
    /// every part of it.
    pub fn run_layers(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        self.run_layers_from(None, tokens, cache, tap)
    }

    /// [`Model::run_layers`] on this process's layers, starting from `received` `[1, S, H]`
    /// (the previous pipeline stage's hidden states for `tokens`) or, when `None`, from the
    /// embedded `tokens`. Returns the hidden states after this process's last layer.
    pub fn run_layers_from(
        &self,
        received: Option<Tensor>,
        tokens: &[u32],
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        ensure!(!tokens.is_empty(), "forward needs at least one token");
        self.check_cache(cache)?;
        self.on_host_workers(|| {
            tap.begin_pass()?;
            let h = match received {
                Some(h) => h,
                None => {
                    let h = self.embed(tokens)?;
                    tap.part(Part::Embedding, &h, &h)?;
                    h
                }
            };
            let h = self.decoder.forward(h, tokens, cache, tap)?;
            cache.offset += tokens.len();
            Ok(h)
        })
    }

    /// The final norm and the output head on `h`, shown to `tap` as [`Part::OutputHead`].
    fn logits(&self, h: &Tensor, tap: &mut dyn Tap) -> Result<Tensor> {
        self.on_host_workers(|| {
            let logits = self.head()?.forward(&self.final_norm(h)?)?;
            tap.part(Part::OutputHead, &logits, &logits)?;
            crate::device_memory::sample(&self.device);
            cast(&logits.squeeze(0)?, DType::F32)
        })
    }

    /// The reference plan's products are host loops split over rayon: they run from a
    /// worker of the CPU pool (see `gdn_ops::threads`). The device plan stays on the
    /// caller's thread, where its per-thread launch counter and device queues live.
    ///
    /// The products' modes are per-thread switches, so they are entered here, on the thread
    /// that runs `work`: this model's 8-bit activations, and the caller's row-exact mode. A
    /// pool worker waiting inside one pass can pick up another caller's whole pass (rayon
    /// steals it while it waits); without this, that pass ran under the waiting pass's
    /// switches — a sequence prefilled alone while a batched step waited took the batch's
    /// row-exact products and came out a few ulps off (the flaky `batched_decode` failure).
    pub(crate) fn on_host_workers<R: Send>(
        &self,
        work: impl FnOnce() -> Result<R> + Send,
    ) -> Result<R> {
        let (q8, rows) = (self.q8_activations, row_exact::enabled());
        let with_modes = move || {
            let _q8 = gdn_ops::ops::affine::q8::Scope::enter(q8);
            let _rows = row_exact::scope(rows);
            work()
        };
        match self.plan {
            Plan::Reference => gdn_ops::threads::on_cpu_pool(with_modes),
            Plan::Device => with_modes(),
        }
    }

    /// Runs `tokens` (one sequence) after what `cache` already holds, updating it in place.
    /// Returns f32 logits of shape `[tokens.len(), vocab_size]` (every position: scoring).
    pub fn forward(&self, tokens: &[u32], cache: &mut Cache) -> Result<Tensor> {
        let h = self.run_layers(tokens, cache, &mut NoTap)?;
        self.logits(&h, &mut NoTap)
    }

    /// As [`Model::forward`], but only the last position goes through the output head:
    /// returns `[1, vocab_size]` (generation needs no more).
    pub fn forward_last(&self, tokens: &[u32], cache: &mut Cache) -> Result<Tensor> {
        self.forward_last_observed(tokens, cache, None)
    }

    /// [`Model::forward_last`] watched by `tap` (a decode step then runs eagerly, never
    /// from a CUDA graph).
    pub fn forward_last_tapped(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        self.forward_last_observed(tokens, cache, Some(tap))
    }

    fn forward_last_observed(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        tap: Option<&mut dyn Tap>,
    ) -> Result<Tensor> {
        if let (true, &[token]) = (self.fused_decode(), tokens) {
            return self.decode_step(token, cache, tap);
        }
        let mut no_tap = NoTap;
        let tap = tap.unwrap_or(&mut no_tap);
        let h = self.run_layers(tokens, cache, tap)?;
        self.last_logits(&h, tap)
    }

    /// The logits `[1, vocab_size]` of the last position of the hidden states `h` `[1, S, H]`
    /// (the last pipeline stage's end of a forward call).
    pub fn last_logits(&self, h: &Tensor, tap: &mut dyn Tap) -> Result<Tensor> {
        let s = h.dim(1)?;
        self.logits(&h.narrow(1, s - 1, 1)?, tap)
    }

    /// Runs a prompt in chunks of at most `chunk` tokens, without computing any logits.
    pub fn prefill(&self, tokens: &[u32], cache: &mut Cache, chunk: usize) -> Result<()> {
        self.prefill_tapped(tokens, cache, chunk, &mut NoTap)
    }

    /// [`Model::prefill`] watched by `tap`.
    pub fn prefill_tapped(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        chunk: usize,
        tap: &mut dyn Tap,
    ) -> Result<()> {
        ensure!(chunk > 0, "prefill chunk size must be positive");
        for part in tokens.chunks(chunk) {
            self.run_layers(part, cache, tap)?;
            crate::device_memory::sample(&self.device);
            // Nothing of a prefill chunk is read back, and candle's Metal pool releases the
            // buffers a chunk dropped only at a host sync: without one, a long prompt holds
            // every chunk's temporaries at once.
            self.device.synchronize()?;
        }
        Ok(())
    }

    /// As [`Model::forward_last`] for one token, also returning the kernel launches of each
    /// layer (counted where the kernels are launched, read by a [`LaunchCounter`] tap).
    /// Everything else the step launches (embedding, first norm, head) is the total minus
    /// their sum.
    ///
    /// Always the eager step, never a CUDA graph's replay: `bench --profile-decode` times its
    /// kernels one by one through it.
    pub fn decode_step_with_launches(
        &self,
        token: u32,
        cache: &mut Cache,
    ) -> Result<(Tensor, Vec<usize>)> {
        let mut counter = LaunchCounter::default();
        let logits = self.decode_step(token, cache, Some(&mut counter))?;
        Ok((logits, counter.per_layer))
    }

    /// One decode step: the family's fused step if it has one and it is on, the composed
    /// layers otherwise; with `tap`, always eager (no CUDA graph).
    fn decode_step(
        &self,
        token: u32,
        cache: &mut Cache,
        tap: Option<&mut dyn Tap>,
    ) -> Result<Tensor> {
        self.check_cache(cache)?;
        match &self.decoder {
            // Inside a verify window (a draft model drafts one step at a time in one) every
            // GDN layer must record its state: the fused step does not, the verify pass does
            // (or the composed layers, when it is off).
            Decoder::Hybrid(d) if d.fused_decode() && cache.in_window() => {
                // Eagerly (with a tap): a CUDA graph covers a window of one pass, and a
                // draft model's window spans a pass per drafted token.
                let mut no_tap = NoTap;
                let tap = tap.unwrap_or(&mut no_tap);
                Ok(self.verify_tapped(&[token], cache, Some(tap))?.0)
            }
            decoder if self.fused_decode() => {
                self.check_token_ids(&[token])?;
                let ends = self.ends()?;
                match decoder {
                    Decoder::Hybrid(d) => d.decode_step(&ends, token, cache, tap),
                    Decoder::Qwen4Exp(d) => d.decode_step(&ends, token, cache, tap),
                }
            }
            _ => {
                let mut no_tap = NoTap;
                let tap = tap.unwrap_or(&mut no_tap);
                let h = self.run_layers(&[token], cache, tap)?;
                self.logits(&h, tap)
            }
        }
    }
}
