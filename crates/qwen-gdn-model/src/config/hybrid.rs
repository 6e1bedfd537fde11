//! The hybrid family's config (Gated DeltaNet + gated attention + MoE), with the defaults
//! mlx-lm applies (mlx-lm-reference.md §2):
//! - `qwen3_next`: flat config.json, every size required; MoE per `mlp_only_layers` /
//!   `decoder_sparse_step`.
//! - `qwen3_5`, `qwen3_5_moe` (Qwen3.5 / 3.6): the same sizes under `text_config` (or flat
//!   when that key is absent), each with a default; RoPE settings only in `rope_parameters`;
//!   MoE on every layer iff `num_experts > 0`.

use super::from_json::{read, unread_keys};
use super::limits::*;
use anyhow::{bail, Result};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `qwen3_next`: fused `in_proj_qkvz` / `in_proj_ba`, keys under `model.`.
    Qwen3Next,
    /// `qwen3_5` / `qwen3_5_moe`: separate projections, keys under `language_model.`.
    Qwen35,
}

/// The sizes of the hybrid stack, spelled and defaulted as qwen3_next's config.json (which
/// deserializes straight into it; Qwen3.5's text config converts into it).
#[derive(Debug, Clone, Deserialize)]
pub struct HybridConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    // Full attention.
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    #[serde(default)]
    pub attention_bias: bool,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
    #[serde(default = "every_fourth")]
    pub full_attention_interval: usize,
    // Gated DeltaNet.
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    // Mixture of experts.
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    /// mlx-lm's qwen3_next default is false (Qwen3.5's is true).
    #[serde(default)]
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
}

fn every_fourth() -> usize {
    4
}

/// Keys of the text config the hybrid family knows and does not need: generic transformers
/// and mlx fields, multi-token prediction, the top level's own keys when the config is flat,
/// and what only one of the two spellings reads (Qwen3.5 takes RoPE from `rope_parameters`
/// and has no sparse-step rule).
const IGNORED: &[&str] = &[
    "architectures",
    "attention_dropout",
    "attn_output_gate",
    "bos_token_id",
    "decoder_sparse_step",
    "dtype",
    "eos_token_id",
    "hidden_act",
    "initializer_range",
    "layer_types",
    "mamba_ssm_dtype",
    "max_window_layers",
    "mlp_only_layers",
    "model_type",
    "mtp",
    "mtp_num_hidden_layers",
    "mtp_use_dedicated_embeddings",
    "output_router_logits",
    "pad_token_id",
    "partial_rotary_factor",
    "quantization",
    "quantization_config",
    "rope_scaling",
    "rope_theta",
    "router_aux_loss_coef",
    "sliding_window",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "use_sliding_window",
];

/// Qwen3.5's text config with mlx-lm's defaults.
#[derive(Deserialize)]
#[serde(default)]
struct Qwen35Text {
    hidden_size: usize,
    num_hidden_layers: usize,
    intermediate_size: usize,
    vocab_size: usize,
    max_position_embeddings: usize,
    rms_norm_eps: f64,
    tie_word_embeddings: bool,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    /// `hidden_size / num_attention_heads` when absent.
    head_dim: Option<usize>,
    attention_bias: bool,
    rope_parameters: RopeParameters,
    full_attention_interval: usize,
    linear_num_key_heads: usize,
    linear_num_value_heads: usize,
    linear_key_head_dim: usize,
    linear_value_head_dim: usize,
    linear_conv_kernel_dim: usize,
    num_experts: usize,
    num_experts_per_tok: usize,
    moe_intermediate_size: usize,
    shared_expert_intermediate_size: usize,
    norm_topk_prob: bool,
}

impl Default for Qwen35Text {
    fn default() -> Self {
        Self {
            hidden_size: 4096,
            num_hidden_layers: 32,
            intermediate_size: 14336,
            vocab_size: 151936,
            max_position_embeddings: 131072,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: false,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: None,
            attention_bias: false,
            rope_parameters: RopeParameters::default(),
            full_attention_interval: every_fourth(),
            linear_num_key_heads: 16,
            linear_num_value_heads: 64,
            linear_key_head_dim: 192,
            linear_value_head_dim: 128,
            linear_conv_kernel_dim: 4,
            num_experts: 0,
            num_experts_per_tok: 0,
            moe_intermediate_size: 0,
            shared_expert_intermediate_size: 0,
            norm_topk_prob: true,
        }
    }
}

#[derive(Deserialize)]
#[serde(default)]
struct RopeParameters {
    rope_theta: f64,
    partial_rotary_factor: f64,
    /// Spelled `type` or `rope_type` (the first wins when both are there).
    r#type: Option<String>,
    rope_type: Option<String>,
}

impl Default for RopeParameters {
    fn default() -> Self {
        Self {
            rope_theta: 100000.0,
            partial_rotary_factor: 0.25,
            r#type: None,
            rope_type: None,
        }
    }
}

impl From<Qwen35Text> for HybridConfig {
    fn from(t: Qwen35Text) -> Self {
        Self {
            hidden_size: t.hidden_size,
            num_hidden_layers: t.num_hidden_layers,
            intermediate_size: t.intermediate_size,
            vocab_size: t.vocab_size,
            max_position_embeddings: t.max_position_embeddings,
            rms_norm_eps: t.rms_norm_eps,
            tie_word_embeddings: t.tie_word_embeddings,
            num_attention_heads: t.num_attention_heads,
            num_key_value_heads: t.num_key_value_heads,
            head_dim: (t.head_dim).unwrap_or(t.hidden_size / t.num_attention_heads.max(1)),
            attention_bias: t.attention_bias,
            rope_theta: t.rope_parameters.rope_theta,
            partial_rotary_factor: t.rope_parameters.partial_rotary_factor,
            full_attention_interval: t.full_attention_interval,
            linear_num_key_heads: t.linear_num_key_heads,
            linear_num_value_heads: t.linear_num_value_heads,
            linear_key_head_dim: t.linear_key_head_dim,
            linear_value_head_dim: t.linear_value_head_dim,
            linear_conv_kernel_dim: t.linear_conv_kernel_dim,
            num_experts: t.num_experts,
            num_experts_per_tok: t.num_experts_per_tok,
            moe_intermediate_size: t.moe_intermediate_size,
            shared_expert_intermediate_size: t.shared_expert_intermediate_size,
            norm_topk_prob: t.norm_topk_prob,
            // Every layer is MoE when the model has experts.
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
        }
    }
}

/// Reads the text config `text` in `family`'s spelling (at key path `at` of `origin`) and lists the keys it holds
/// that the hybrid family does not know.
pub fn read_hybrid(
    family: Family,
    text: &Map<String, Value>,
    origin: &str,
    at: &[&str],
) -> Result<(HybridConfig, BTreeSet<String>)> {
    Ok(match family {
        Family::Qwen3Next => (
            read(text, origin, at)?,
            unread_keys::<HybridConfig>(text, IGNORED),
        ),
        Family::Qwen35 => {
            let t: Qwen35Text = read(text, origin, at)?;
            let rope = &t.rope_parameters;
            if let Some(kind) = rope.r#type.as_ref().or(rope.rope_type.as_ref()) {
                if !matches!(kind.as_str(), "default" | "mrope") {
                    bail!("{origin}: rope type `{kind}` is not supported (only default / mrope)");
                }
            }
            (t.into(), unread_keys::<Qwen35Text>(text, IGNORED))
        }
    })
}

impl HybridConfig {
    /// Bounds first: everything after (and every loader loop and allocation) may then
    /// iterate over or multiply these numbers.
    pub fn validate(&self, origin: &str) -> Result<()> {
        check_upper_bounds(
            origin,
            &[
                ("hidden_size", self.hidden_size, MAX_WIDTH),
                ("intermediate_size", self.intermediate_size, MAX_WIDTH),
                (
                    "moe_intermediate_size",
                    self.moe_intermediate_size,
                    MAX_WIDTH,
                ),
                (
                    "shared_expert_intermediate_size",
                    self.shared_expert_intermediate_size,
                    MAX_WIDTH,
                ),
                ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
                ("vocab_size", self.vocab_size, MAX_VOCAB),
                (
                    "max_position_embeddings",
                    self.max_position_embeddings,
                    MAX_POSITIONS,
                ),
                ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
                ("num_key_value_heads", self.num_key_value_heads, MAX_HEADS),
                ("head_dim", self.head_dim, MAX_HEAD_DIM),
                ("linear_num_key_heads", self.linear_num_key_heads, MAX_HEADS),
                (
                    "linear_num_value_heads",
                    self.linear_num_value_heads,
                    MAX_HEADS,
                ),
                (
                    "linear_key_head_dim",
                    self.linear_key_head_dim,
                    MAX_HEAD_DIM,
                ),
                (
                    "linear_value_head_dim",
                    self.linear_value_head_dim,
                    MAX_HEAD_DIM,
                ),
                (
                    "linear_conv_kernel_dim",
                    self.linear_conv_kernel_dim,
                    MAX_CONV_KERNEL,
                ),
                ("num_experts", self.num_experts, MAX_EXPERTS),
                ("num_experts_per_tok", self.num_experts_per_tok, MAX_EXPERTS),
                (
                    "full_attention_interval",
                    self.full_attention_interval,
                    MAX_LAYERS,
                ),
                ("decoder_sparse_step", self.decoder_sparse_step, MAX_LAYERS),
                (
                    "mlp_only_layers (length)",
                    self.mlp_only_layers.len(),
                    MAX_LAYERS,
                ),
            ],
        )?;
        for (key, v) in [
            ("rms_norm_eps", self.rms_norm_eps),
            ("rope_theta", self.rope_theta),
            ("partial_rotary_factor", self.partial_rotary_factor),
        ] {
            if !(v.is_finite() && v > 0.0) {
                bail!("{origin}: `{key}` must be a positive number, got {v}");
            }
        }
        for (key, v) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("vocab_size", self.vocab_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
            ("full_attention_interval", self.full_attention_interval),
        ] {
            if v == 0 {
                bail!("{origin}: `{key}` must be positive");
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "{origin}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if !self
            .linear_num_value_heads
            .is_multiple_of(self.linear_num_key_heads)
        {
            bail!(
                "{origin}: linear_num_value_heads ({}) is not a multiple of linear_num_key_heads ({})",
                self.linear_num_value_heads,
                self.linear_num_key_heads
            );
        }
        let rope_dims = self.rope_dims();
        if rope_dims == 0 || !rope_dims.is_multiple_of(2) || rope_dims > self.head_dim {
            bail!(
                "{origin}: partial_rotary_factor {} gives {rope_dims} rotary dims for head_dim {}; need an even number in 2..=head_dim",
                self.partial_rotary_factor,
                self.head_dim
            );
        }
        if (0..self.num_hidden_layers).any(|i| self.is_moe_layer(i)) {
            if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.num_experts {
                bail!(
                    "{origin}: num_experts_per_tok ({}) must be in 1..=num_experts ({})",
                    self.num_experts_per_tok,
                    self.num_experts
                );
            }
            if self.moe_intermediate_size == 0 {
                bail!("{origin}: `moe_intermediate_size` must be positive for MoE models");
            }
        }
        if self.decoder_sparse_step == 0 {
            bail!("{origin}: `decoder_sparse_step` must be positive");
        }
        Ok(())
    }

    /// qwen3_next: MoE unless listed in `mlp_only_layers` or off the `decoder_sparse_step`
    /// grid; Qwen3.5 (no list, step 1): every layer when the model has experts.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.num_experts > 0
            && !self.mlp_only_layers.contains(&i)
            && (i + 1).is_multiple_of(self.decoder_sparse_step.max(1))
    }

    /// Number of leading features of each attention head that RoPE rotates.
    pub fn rope_dims(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor) as usize
    }

    pub fn key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// Channels of the depthwise conv: `[q | k | v]`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}
