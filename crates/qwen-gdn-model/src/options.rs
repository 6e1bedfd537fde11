//! Every switch of a run in one value, [`RunOptions`]: the caller's choices (dtype, plan,
//! state dtype, q8 activations, fused decode, progress) and the engine's environment switches
//! (which kernel variant each layer runs, the CPU copies, the CUDA graphs).
//!
//! [`RunOptions::from_env`] is the one place that reads the environment, in the shape of the
//! CLI's `hub::HubEnv::from_env`. The binary and the tests call it once, before any weight is
//! loaded; layers and ops never read the environment, they get their variant from these
//! options at load ([`RunOptions::layer_variants`]). One rule for a bad value: a one-line
//! error naming the variable and the values it takes. An unset or empty variable keeps the
//! default. A `QWEN_GDN_*` variable that nothing reads is named on stderr (a typo, probably).
//!
//! The README's "Environment variables" table lists them all.

use crate::layers::attention::{AttnPrefill, SCORE_BUDGET_BYTES};
use crate::layers::gdn::{ConvFront, VerifyWindow};
use crate::layers::moe::{MoePrefill, MoePrefillAsked};
use crate::{LoadProgress, Plan};
use anyhow::{bail, Result};
use candle_core::{DType, Device};
use gdn_ops::ops::affine::q8_interleaved::Q8Layout;
use gdn_ops::ops::affine::{DecodeProducts, DenseRows};
use gdn_ops::ops::moe_combine::CombineKernel;
use gdn_ops::ops::moe_route::RouteKernel;
use gdn_ops::simd::Level;
use gdn_ops::{GdnForm, StateDtype};
use std::ffi::OsString;
use std::time::Duration;

/// Forces one gated-delta form for every call of the GDN layers' forward: `recurrent` or
/// `chunked` (unset: calls of 16 tokens or more take the chunked form where the device has it).
pub const GDN_PREFILL_VAR: &str = "QWEN_GDN_GDN_PREFILL";
/// Pins the CPU level the hot loops run ([`Level::name`]: `portable`, `avx2`, `avx2-vnni`,
/// `avx512`, `avx512-vnni`, `neon`, `neon-dotprod`, `neon-i8mm`), or `best` (the best level
/// the CPU has). A level the CPU lacks is refused, naming the missing feature.
pub const CPU_LEVEL_VAR: &str = "QWEN_GDN_CPU_LEVEL";
/// The q8 mode's 4-bit matrix layout: `auto` (interleaved where the CPU level has a kernel for
/// it), `interleaved` or `plain`.
pub const Q8_LAYOUT_VAR: &str = "QWEN_GDN_Q8_LAYOUT";
/// Microseconds the CPU pool's idle workers spin for work during a pass (0: they sleep).
pub const SPIN_US_VAR: &str = "QWEN_GDN_SPIN_US";
/// mlx-lm's switch for a bf16 GDN state; mlx-lm's rule: exactly `1` turns it on, any other
/// value leaves fp32 (so it has no bad value). `--gdn-state-dtype` overrides it.
pub const STATE_BF16_VAR: &str = "MLX_LM_GDN_STATE_BF16";
/// The GDN conv front on the device plan: `composed` or `fused`.
pub const CONV_FRONT_VAR: &str = "QWEN_GDN_CONV_FRONT";
/// CUDA's prefill attention: `kernel` or `composed`.
pub const ATTN_PREFILL_VAR: &str = "QWEN_GDN_ATTN_PREFILL";
/// Bytes of f32 scores a block of prefill attention may hold (at least 4).
pub const ATTN_SCORE_BYTES_VAR: &str = "QWEN_GDN_ATTN_SCORE_BYTES";
/// The device plan's MoE prefill: `pairs`, `gemm`, `grouped` or `grouped:<min tokens>`.
pub const MOE_PREFILL_VAR: &str = crate::layers::moe::grouped::MOE_PREFILL_VAR;
/// CUDA graphs for decode steps: `1` (replay) or `0` (eager launches).
pub const CUDA_GRAPH_VAR: &str = "QWEN_GDN_CUDA_GRAPH";
/// CUDA's decode MoE combine: `auto` (a token over a cluster of blocks where it applies) or
/// `one-block` (one block a token: the A/B reference).
pub const MOE_COMBINE_VAR: &str = "QWEN_GDN_MOE_COMBINE";
/// The MoE router's kernel body (Metal, CUDA): `warp` (one simdgroup a token, the measured
/// default) or `block` (one threadgroup a token; the same outputs, bit for bit; unmeasured).
pub const MOE_ROUTE_VAR: &str = "QWEN_GDN_MOE_ROUTE";
/// Speculative decoding's verify pass on the device plan: `fused` (the fused decode kernels,
/// products over the pass's rows) or `composed` (the prefill path, the reference).
pub const VERIFY_VAR: &str = "QWEN_GDN_VERIFY";
/// The fused verify pass's GDN recurrence: `one-launch` (the T tokens in one
/// `gated_delta_norm_window` launch a layer) or `per-token` (a launch and a state copy a
/// token: the reference). The same states and outputs, bit for bit.
pub const VERIFY_WINDOW_VAR: &str = "QWEN_GDN_VERIFY_WINDOW";
/// How a quantized matrix multiplies 5–64 activation rows (a batched decode step's): `auto`,
/// `rows` (the decode products a row each: each row bit for bit alone), `grouped` (the grouped
/// quantized GEMM with one group) or `dequantize` (a dequantized copy and a GEMM, the
/// reference). See `gdn_ops::ops::affine::dense_rows`.
pub const DENSE_ROWS_VAR: &str = "QWEN_GDN_DENSE_ROWS";
/// The decode products' kernels on CUDA: `auto` (the tensor-core kernels where they take the
/// product, else the streamed ones) or `streamed` (the streamed ones only, the reference). See
/// `gdn_ops::ops::affine::decode_products`.
pub const DECODE_PRODUCTS_VAR: &str = "QWEN_GDN_DECODE_PRODUCTS";

/// The engine switches [`RunOptions::from_env`] reads.
pub const ENGINE_VARS: [&str; 16] = [
    GDN_PREFILL_VAR,
    CPU_LEVEL_VAR,
    Q8_LAYOUT_VAR,
    SPIN_US_VAR,
    STATE_BF16_VAR,
    CONV_FRONT_VAR,
    ATTN_PREFILL_VAR,
    ATTN_SCORE_BYTES_VAR,
    MOE_PREFILL_VAR,
    CUDA_GRAPH_VAR,
    MOE_COMBINE_VAR,
    MOE_ROUTE_VAR,
    VERIFY_VAR,
    VERIFY_WINDOW_VAR,
    DENSE_ROWS_VAR,
    DECODE_PRODUCTS_VAR,
];

/// The other `QWEN_GDN_*` variables the project reads: the binary's (`serve --api-key`'s
/// default, the chat template's budgets), those a `--ranks` launcher sets in each rank of an
/// NCCL job, its debug-build test hooks and the tests' and scripts' (`QWEN_GDN_TEST_*` is a
/// prefix).
pub const OTHER_VARS: [&str; 8] = [
    "QWEN_GDN_API_KEY",
    "QWEN_GDN_TEMPLATE_FUEL",
    "QWEN_GDN_TEMPLATE_BYTES",
    "QWEN_GDN_MODELS_DIR",
    "QWEN_GDN_SHARED",
    qwen_gdn_collective::RANK_VAR,
    qwen_gdn_collective::RANKS_VAR,
    qwen_gdn_collective::NCCL_ID_VAR,
];

/// How to load and run a model.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Activation dtype: f32 on the CPU, bf16 on Metal by default.
    pub dtype: DType,
    /// Storage dtype of the GDN recurrent state (fp32 unless asked otherwise;
    /// `MLX_LM_GDN_STATE_BF16=1`).
    pub gdn_state_dtype: StateDtype,
    /// `None` picks [`Plan::for_device`].
    pub plan: Option<Plan>,
    /// Reference plan only: decode-shaped 4-bit products round each activation row to i8
    /// per 64 values and dot in integers (faster; judged by the KL gate, not exact).
    pub q8_activations: bool,
    /// Device plan: decode steps on the fused kernels (on by default; off runs the composed
    /// ops they are tested against).
    pub fused_decode: bool,
    /// `QWEN_GDN_VERIFY`: device plan with fused decode on: speculative decoding's verify
    /// pass on the fused kernels (on by default; off runs the composed prefill path, the
    /// reference).
    pub fused_verify: bool,
    /// `QWEN_GDN_VERIFY_WINDOW`: the fused verify pass's GDN recurrence in one launch a layer
    /// or a launch a token.
    pub verify_window: VerifyWindow,
    /// Follows the bytes read from the checkpoint while loading.
    pub progress: Option<LoadProgress>,
    /// `QWEN_GDN_GDN_PREFILL`: one gated-delta form for every GDN layer call; `None` lets the
    /// length choose.
    pub gdn_prefill: Option<GdnForm>,
    /// `QWEN_GDN_CPU_LEVEL`: the CPU level the hot loops run, one the CPU has; `None`: the best
    /// it has (process-wide, set by [`crate::Model::load`]).
    pub cpu_level: Option<Level>,
    /// `QWEN_GDN_Q8_LAYOUT`: the q8 mode's matrix layout.
    pub q8_layout: Q8Layout,
    /// `QWEN_GDN_SPIN_US`: how long the CPU pool's idle workers spin for work (process-wide,
    /// set by [`crate::Model::load`]).
    pub spin: Duration,
    /// `QWEN_GDN_CONV_FRONT`: the device plan's GDN conv front; `None` is the device's
    /// default ([`ConvFront::default_for`]).
    pub conv_front: Option<ConvFront>,
    /// `QWEN_GDN_ATTN_PREFILL`: CUDA's prefill attention kernel, or the composed ops.
    pub attn_prefill: AttnPrefill,
    /// `QWEN_GDN_ATTN_SCORE_BYTES`: the score budget of one block of blocked attention.
    pub attn_score_bytes: usize,
    /// `QWEN_GDN_MOE_PREFILL`: the device plan's MoE prefill; `None` is the device's default
    /// ([`MoePrefill::default_for`]).
    pub moe_prefill: Option<MoePrefillAsked>,
    /// `QWEN_GDN_CUDA_GRAPH`: decode steps and verify passes on CUDA replay captured graphs.
    pub cuda_graph: bool,
    /// `QWEN_GDN_MOE_COMBINE`: the kernel of the fused decode step's MoE combine (CUDA).
    pub moe_combine: CombineKernel,
    /// `QWEN_GDN_MOE_ROUTE`: the MoE router's kernel body (Metal, CUDA).
    pub moe_route: RouteKernel,
    /// `QWEN_GDN_DENSE_ROWS`: how quantized products of 5–64 rows run (process-wide, set by
    /// [`crate::Model::load`]).
    pub dense_rows: DenseRows,
    /// `QWEN_GDN_DECODE_PRODUCTS`: the decode products' kernels on CUDA (process-wide, set by
    /// [`crate::Model::load`]).
    pub decode_products: DecodeProducts,
    /// The part of the model to load: all of it, or one pipeline stage's (set by the
    /// pipeline plan, `crate::pipeline`, never from the environment).
    pub part: crate::ModelPart,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            gdn_state_dtype: StateDtype::F32,
            plan: None,
            q8_activations: false,
            fused_decode: true,
            fused_verify: true,
            verify_window: VerifyWindow::OneLaunch,
            progress: None,
            gdn_prefill: None,
            cpu_level: None,
            q8_layout: Q8Layout::Auto,
            spin: gdn_ops::threads::DEFAULT_SPIN,
            conv_front: None,
            attn_prefill: AttnPrefill::Kernel,
            attn_score_bytes: SCORE_BUDGET_BYTES,
            moe_prefill: None,
            cuda_graph: true,
            moe_combine: CombineKernel::Auto,
            moe_route: RouteKernel::Auto,
            dense_rows: DenseRows::Auto,
            decode_products: DecodeProducts::Auto,
            part: crate::ModelPart::Whole,
        }
    }
}

/// The kernel variants a model's decoder runs, resolved for one device: what
/// [`crate::Model::load`] hands each layer (and the hybrid decoder, its CUDA graphs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerVariants {
    pub gdn_prefill: Option<GdnForm>,
    /// `None`: the device's default (device plan only; the reference plan composes).
    pub conv_front: Option<ConvFront>,
    pub attn_prefill: AttnPrefill,
    pub attn_score_bytes: usize,
    pub moe_prefill: MoePrefill,
    /// CUDA decode steps and verify passes replay captured graphs.
    pub cuda_graph: bool,
    /// The fused decode step's MoE combine kernel.
    pub moe_combine: CombineKernel,
    /// The MoE router's kernel body, decode and prefill.
    pub moe_route: RouteKernel,
    /// The fused verify pass's GDN recurrence.
    pub verify_window: VerifyWindow,
}

impl RunOptions {
    /// The defaults with every engine switch set in the environment: the one reader. A bad
    /// value is an error naming the variable and the values it takes; an unknown `QWEN_GDN_*`
    /// variable gets a one-line notice on stderr.
    pub fn from_env() -> Result<Self> {
        for name in unknown_vars(std::env::vars_os().map(|(name, _)| name)) {
            eprintln!("qwen-gdn: ignoring {name}: no such setting (see the README's environment variables)");
        }
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// As [`Self::from_env`], with the variables from `var` (how the tests try each value
    /// without touching the process environment).
    pub fn from_lookup(var: impl Fn(&str) -> Option<OsString>) -> Result<Self> {
        let text = |name: &str| -> Result<Option<String>> {
            match var(name) {
                None => Ok(None),
                Some(value) => match value.into_string() {
                    Ok(s) if s.trim().is_empty() => Ok(None),
                    Ok(s) => Ok(Some(s.trim().to_string())),
                    Err(_) => bail!("{name}: not valid UTF-8"),
                },
            }
        };
        let mut o = Self::default();
        if let Some(t) = text(GDN_PREFILL_VAR)? {
            o.gdn_prefill = Some(choice(
                GDN_PREFILL_VAR,
                &t,
                &[
                    ("recurrent", GdnForm::Recurrent),
                    ("chunked", GdnForm::Chunked),
                ],
            )?);
        }
        if let Some(t) = text(CPU_LEVEL_VAR)? {
            let mut table: Vec<(&str, Option<Level>)> =
                Level::ALL.iter().map(|&l| (l.name(), Some(l))).collect();
            table.push(("best", None));
            o.cpu_level = choice(CPU_LEVEL_VAR, &t, &table)?;
            if let Some(why) = o.cpu_level.and_then(Level::missing) {
                bail!("{CPU_LEVEL_VAR}={t}: {why}");
            }
        }
        if let Some(t) = text(Q8_LAYOUT_VAR)? {
            o.q8_layout = choice(
                Q8_LAYOUT_VAR,
                &t,
                &[
                    ("auto", Q8Layout::Auto),
                    ("interleaved", Q8Layout::Interleaved),
                    ("plain", Q8Layout::Plain),
                ],
            )?;
        }
        if let Some(t) = text(SPIN_US_VAR)? {
            o.spin = Duration::from_micros(whole_number(SPIN_US_VAR, &t, 0)?);
        }
        // mlx-lm's variable, mlx-lm's rule (see STATE_BF16_VAR); read raw, as mlx-lm does.
        let bf16 = var(STATE_BF16_VAR).map(|v| v.to_string_lossy().into_owned());
        o.gdn_state_dtype = StateDtype::from_env_value(bf16.as_deref());
        if let Some(t) = text(CONV_FRONT_VAR)? {
            o.conv_front = Some(choice(
                CONV_FRONT_VAR,
                &t,
                &[
                    ("composed", ConvFront::Composed),
                    ("fused", ConvFront::Fused),
                ],
            )?);
        }
        if let Some(t) = text(ATTN_PREFILL_VAR)? {
            o.attn_prefill = choice(
                ATTN_PREFILL_VAR,
                &t,
                &[
                    ("kernel", AttnPrefill::Kernel),
                    ("composed", AttnPrefill::Composed),
                ],
            )?;
        }
        if let Some(t) = text(ATTN_SCORE_BYTES_VAR)? {
            let bytes = whole_number(ATTN_SCORE_BYTES_VAR, &t, 4)?;
            o.attn_score_bytes = usize::try_from(bytes)
                .map_err(|_| anyhow::anyhow!("{ATTN_SCORE_BYTES_VAR}={t}: too large"))?;
        }
        if let Some(t) = text(MOE_PREFILL_VAR)? {
            o.moe_prefill = Some(MoePrefillAsked::parse(&t)?);
        }
        if let Some(t) = text(CUDA_GRAPH_VAR)? {
            o.cuda_graph = choice(CUDA_GRAPH_VAR, &t, &[("1", true), ("0", false)])?;
        }
        if let Some(t) = text(MOE_COMBINE_VAR)? {
            o.moe_combine = choice(
                MOE_COMBINE_VAR,
                &t,
                &[
                    ("auto", CombineKernel::Auto),
                    ("one-block", CombineKernel::OneBlock),
                ],
            )?;
        }
        if let Some(t) = text(MOE_ROUTE_VAR)? {
            o.moe_route = choice(
                MOE_ROUTE_VAR,
                &t,
                &[
                    ("auto", RouteKernel::Auto),
                    ("warp", RouteKernel::Warp),
                    ("block", RouteKernel::Block),
                ],
            )?;
        }
        if let Some(t) = text(DENSE_ROWS_VAR)? {
            o.dense_rows = choice(DENSE_ROWS_VAR, &t, &DenseRows::NAMED)?;
        }
        if let Some(t) = text(DECODE_PRODUCTS_VAR)? {
            o.decode_products = choice(DECODE_PRODUCTS_VAR, &t, &DecodeProducts::NAMED)?;
        }
        if let Some(t) = text(VERIFY_VAR)? {
            o.fused_verify = choice(VERIFY_VAR, &t, &[("fused", true), ("composed", false)])?;
        }
        if let Some(t) = text(VERIFY_WINDOW_VAR)? {
            o.verify_window = choice(
                VERIFY_WINDOW_VAR,
                &t,
                &[
                    ("one-launch", VerifyWindow::OneLaunch),
                    ("per-token", VerifyWindow::PerToken),
                ],
            )?;
        }
        Ok(o)
    }

    /// The layers' kernel variants on `device`.
    pub fn layer_variants(&self, device: &Device) -> LayerVariants {
        LayerVariants {
            gdn_prefill: self.gdn_prefill,
            conv_front: self.conv_front,
            attn_prefill: self.attn_prefill,
            attn_score_bytes: self.attn_score_bytes,
            moe_prefill: match self.moe_prefill {
                Some(asked) => asked.on(device),
                None => MoePrefill::default_for(device),
            },
            cuda_graph: self.cuda_graph,
            moe_combine: self.moe_combine,
            moe_route: self.moe_route,
            verify_window: self.verify_window,
        }
    }

    /// Sets the switches that belong to the process, not to one model: the CPU copies
    /// (chosen deep in every CPU kernel), the CPU pool's spinners, the quantized products'
    /// path for 5–64 rows and the decode products' kernels (leaves under every layer). The last
    /// load wins.
    /// A level the CPU lacks (set in the options by hand, not read by [`Self::from_env`], which
    /// refuses it) is an error naming the missing feature.
    pub(crate) fn apply_process_wide(&self) -> Result<()> {
        gdn_ops::simd::select_level(self.cpu_level)
            .map_err(|why| anyhow::anyhow!("{CPU_LEVEL_VAR}: {why}"))?;
        gdn_ops::threads::set_spin_budget(self.spin);
        gdn_ops::ops::affine::set_dense_rows(self.dense_rows);
        gdn_ops::ops::affine::set_decode_products(self.decode_products);
        Ok(())
    }
}

/// The value `text` names among `table`'s, or an error naming `var` and the accepted names.
fn choice<T: Copy>(var: &str, text: &str, table: &[(&str, T)]) -> Result<T> {
    if let Some((_, value)) = table.iter().find(|(name, _)| *name == text) {
        return Ok(*value);
    }
    let names: Vec<&str> = table.iter().map(|(name, _)| *name).collect();
    let (last, rest) = names.split_last().expect("a non-empty table");
    bail!("{var}={text}: expected {} or {last}", rest.join(", "))
}

/// A whole number of at least `min`, or an error naming `var`.
fn whole_number(var: &str, text: &str, min: u64) -> Result<u64> {
    match text.parse::<u64>() {
        Ok(n) if n >= min => Ok(n),
        _ => bail!("{var}={text}: expected a whole number ≥ {min}"),
    }
}

/// The `QWEN_GDN_*` variables among `names` that nothing reads.
pub fn unknown_vars(names: impl Iterator<Item = OsString>) -> Vec<String> {
    names
        .filter_map(|name| name.into_string().ok())
        .filter(|name| name.starts_with("QWEN_GDN_"))
        .filter(|name| {
            !ENGINE_VARS.contains(&name.as_str())
                && !OTHER_VARS.contains(&name.as_str())
                && !name.starts_with("QWEN_GDN_TEST_")
        })
        .collect()
}

#[cfg(test)]
mod tests;
