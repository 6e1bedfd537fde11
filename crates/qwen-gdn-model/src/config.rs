//! One `Config` for the three supported families, read from config.json with the defaults
//! mlx-lm applies (mlx-lm-reference.md §2).
//!
//! - `qwen3_next`: flat config; MoE per `mlp_only_layers` / `decoder_sparse_step`.
//! - `qwen3_5`, `qwen3_5_moe`: hyper-parameters nested under `text_config` (or flat when that
//!   key is absent); MoE on every layer iff `num_experts > 0`.
//! - `qwen4_exp`: a Qwen3.5-MoE text config plus the fields of [`qwen4_exp`] (QSA indexer,
//!   hyper-connections, per-layer n-gram embeddings; docs/qwen4_exp.md).

pub mod qwen4_exp;

use crate::weights::files::read_json_text;
use anyhow::{anyhow, bail, Context, Result};
use gdn_ops::affine;
use serde_json::{Map, Value};
use std::path::Path;

/// Upper bounds on config.json's sizes, checked before anything loops over or allocates by
/// them (a config with `num_hidden_layers = 1e18` would otherwise spin in validation). Each
/// is far above any released model and low enough that the products the loaders form
/// (experts × rows × cols) fit a 64-bit `usize`.
pub const MAX_LAYERS: usize = 1024;
pub const MAX_WIDTH: usize = 1 << 20;
pub const MAX_VOCAB: usize = 1 << 24;
pub const MAX_POSITIONS: usize = 1 << 24;
pub const MAX_HEADS: usize = 1 << 12;
pub const MAX_HEAD_DIM: usize = 1 << 12;
pub const MAX_CONV_KERNEL: usize = 64;
pub const MAX_EXPERTS: usize = 1 << 14;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `qwen3_next`: fused `in_proj_qkvz` / `in_proj_ba`, keys under `model.`.
    Qwen3Next,
    /// `qwen3_5` / `qwen3_5_moe`: separate projections, keys under `language_model.`.
    Qwen35,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet linear attention.
    LinearAttention,
    /// Gated softmax attention with a KV cache.
    FullAttention,
}

/// Per-module quantization declared in config.json's `quantization` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    pub bits: usize,
    pub group_size: usize,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// `qwen3_next`, `qwen3_5` or `qwen3_5_moe`.
    pub model_type: String,
    pub family: Family,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    // Full attention.
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
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
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    /// Top-level `eos_token_id` of config.json (int or list), empty when absent.
    pub eos_token_id: Vec<u32>,
    /// Global quantization (None for unquantized checkpoints).
    pub quantization: Option<QuantSpec>,
    /// Per-module overrides keyed by the checkpoint's module path; `None` = left unquantized.
    pub quantization_overrides: Vec<(String, Option<QuantSpec>)>,
    /// The `qwen4_exp` additions (its tensor names and Qwen3.5 parts follow [`Family::Qwen35`]).
    pub qwen4_exp: Option<qwen4_exp::Qwen4ExpConfig>,
}

/// Reads a typed field with a default, reporting the key on a type error.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    origin: &'a str,
}

impl Fields<'_> {
    fn value(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }
    fn usize_req(&self, key: &str) -> Result<usize> {
        let v = self
            .value(key)
            .ok_or_else(|| anyhow!("{}: missing required key `{key}`", self.origin))?;
        v.as_u64().map(|x| x as usize).ok_or_else(|| {
            anyhow!(
                "{}: `{key}` must be a non-negative integer, got {v}",
                self.origin
            )
        })
    }
    fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.value(key) {
            None => Ok(default),
            Some(_) => self.usize_req(key),
        }
    }
    fn f64_req(&self, key: &str) -> Result<f64> {
        let v = self
            .value(key)
            .ok_or_else(|| anyhow!("{}: missing required key `{key}`", self.origin))?;
        v.as_f64()
            .ok_or_else(|| anyhow!("{}: `{key}` must be a number, got {v}", self.origin))
    }
    fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.value(key) {
            None => Ok(default),
            Some(_) => self.f64_req(key),
        }
    }
    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.value(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| anyhow!("{}: `{key}` must be true or false, got {v}", self.origin)),
        }
    }
}

/// The special token ids of a config file (`eos_token_id`, `bos_token_id`, `pad_token_id`: an
/// id or a list of them) must be tokens of the vocabulary: one past it would index past the
/// embeddings, one past 2^32 would be wrapped into another token.
fn check_token_ids(map: &Map<String, Value>, origin: &str, vocab_size: usize) -> Result<()> {
    for key in ["eos_token_id", "bos_token_id", "pad_token_id"] {
        let ids: Vec<&Value> = match map.get(key) {
            None | Some(Value::Null) => continue,
            Some(Value::Array(list)) => list.iter().collect(),
            Some(one) => vec![one],
        };
        for v in ids {
            match v.as_u64() {
                Some(id) if id < vocab_size as u64 => {}
                Some(id) => bail!(
                    "{origin}: `{key}` = {id} is not a token of the vocabulary (vocab_size = {vocab_size})"
                ),
                None => bail!("{origin}: `{key}` must be a token id or a list of them, got {v}"),
            }
        }
    }
    Ok(())
}

/// An id or a list of them, already checked by [`check_token_ids`].
fn parse_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => vec![],
    }
}

fn parse_quant_spec(
    v: &Value,
    default: QuantSpec,
    origin: &str,
    key: &str,
) -> Result<Option<QuantSpec>> {
    match v {
        Value::Bool(false) => Ok(None),
        Value::Bool(true) => Ok(Some(default)),
        Value::Object(m) => {
            if let Some(mode) = m.get("mode").and_then(Value::as_str) {
                if mode != "affine" {
                    bail!("{origin}: quantization mode `{mode}` of `{key}` is not supported (only MLX affine)");
                }
            }
            let spec = QuantSpec {
                bits: quant_number(m, "bits", default.bits, origin, key)?,
                group_size: quant_number(m, "group_size", default.group_size, origin, key)?,
            };
            spec.check(origin, key)?;
            Ok(Some(spec))
        }
        other => {
            bail!("{origin}: quantization entry `{key}` must be an object or false, got {other}")
        }
    }
}

impl Config {
    /// Reads `<dir>/config.json`, and `eos_token_id` from generation_config.json when present.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = read_json_text(&path)
            .with_context(|| format!("{}: cannot read model config", path.display()))?
            .ok_or_else(|| anyhow!("{}: cannot read model config: not found", path.display()))?;
        let mut cfg = Self::from_json_str(&text, &path.display().to_string())?;
        if let Some(note) = cfg
            .qwen4_exp
            .as_ref()
            .and_then(|q| q.unknown_fields_notice(&path.display().to_string()))
        {
            eprintln!("{note}");
        }
        let gen_path = dir.join("generation_config.json");
        if let Some(gen_text) = read_json_text(&gen_path)? {
            let gen: Value = serde_json::from_str(&gen_text)
                .with_context(|| format!("{}: invalid JSON", gen_path.display()))?;
            if let Some(map) = gen.as_object() {
                check_token_ids(map, &gen_path.display().to_string(), cfg.vocab_size)?;
            }
            let ids = parse_ids(gen.get("eos_token_id"));
            if !ids.is_empty() {
                cfg.eos_token_id = ids;
            }
        }
        Ok(cfg)
    }

    /// Parses config.json text; `origin` names the file in error messages.
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| anyhow!("{origin}: invalid JSON: {e}"))?;
        let root = root
            .as_object()
            .ok_or_else(|| anyhow!("{origin}: expected a JSON object"))?;
        let model_type = root
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("{origin}: missing required key `model_type`"))?
            .to_string();
        let family = match model_type.as_str() {
            "qwen3_next" => Family::Qwen3Next,
            "qwen3_5" | "qwen3_5_moe" | "qwen4_exp" | "qwen4_exp_text" => Family::Qwen35,
            other => bail!(
                "{origin}: unsupported model_type `{other}` (supported: qwen3_next, qwen3_5, qwen3_5_moe, qwen4_exp)"
            ),
        };
        let cfg = match family {
            Family::Qwen3Next => Self::parse_next(root, origin, model_type)?,
            Family::Qwen35 => {
                let text_cfg = match root.get("text_config") {
                    Some(Value::Object(m)) => m,
                    Some(_) => bail!("{origin}: `text_config` must be an object"),
                    None => root,
                };
                let mut cfg = Self::parse_qwen35(root, text_cfg, origin, model_type)?;
                if cfg.model_type.starts_with("qwen4_exp") {
                    let base = qwen4_exp::BaseDims {
                        num_hidden_layers: cfg.num_hidden_layers.min(MAX_LAYERS),
                        full_attention_interval: cfg.full_attention_interval.max(1),
                        hidden_size: cfg.hidden_size,
                        rope_dims: cfg.rope_dims(),
                        max_position_embeddings: cfg.max_position_embeddings,
                        vocab_size: cfg.vocab_size,
                    };
                    if cfg.num_hidden_layers > MAX_LAYERS {
                        bail!("{origin}: `num_hidden_layers` = {} is larger than this engine supports ({MAX_LAYERS})", cfg.num_hidden_layers);
                    }
                    cfg.qwen4_exp = Some(qwen4_exp::Qwen4ExpConfig::parse(
                        text_cfg, root, &base, origin,
                    )?);
                }
                cfg
            }
        };
        cfg.validate(origin)?;
        check_token_ids(root, origin, cfg.vocab_size)?;
        if let Some(Value::Object(text_cfg)) = root.get("text_config") {
            check_token_ids(text_cfg, origin, cfg.vocab_size)?;
        }
        Ok(cfg)
    }

    fn parse_next(root: &Map<String, Value>, origin: &str, model_type: String) -> Result<Self> {
        let f = Fields { map: root, origin };
        let (quantization, quantization_overrides) = parse_quantization(root, origin)?;
        Ok(Self {
            model_type,
            family: Family::Qwen3Next,
            hidden_size: f.usize_req("hidden_size")?,
            num_hidden_layers: f.usize_req("num_hidden_layers")?,
            intermediate_size: f.usize_req("intermediate_size")?,
            vocab_size: f.usize_req("vocab_size")?,
            max_position_embeddings: f.usize_req("max_position_embeddings")?,
            rms_norm_eps: f.f64_req("rms_norm_eps")?,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            num_attention_heads: f.usize_req("num_attention_heads")?,
            num_key_value_heads: f.usize_req("num_key_value_heads")?,
            head_dim: f.usize_req("head_dim")?,
            attention_bias: f.bool_or("attention_bias", false)?,
            rope_theta: f.f64_req("rope_theta")?,
            partial_rotary_factor: f.f64_req("partial_rotary_factor")?,
            full_attention_interval: f.usize_or("full_attention_interval", 4)?,
            linear_num_key_heads: f.usize_req("linear_num_key_heads")?,
            linear_num_value_heads: f.usize_req("linear_num_value_heads")?,
            linear_key_head_dim: f.usize_req("linear_key_head_dim")?,
            linear_value_head_dim: f.usize_req("linear_value_head_dim")?,
            linear_conv_kernel_dim: f.usize_req("linear_conv_kernel_dim")?,
            num_experts: f.usize_req("num_experts")?,
            num_experts_per_tok: f.usize_req("num_experts_per_tok")?,
            moe_intermediate_size: f.usize_req("moe_intermediate_size")?,
            shared_expert_intermediate_size: f.usize_req("shared_expert_intermediate_size")?,
            norm_topk_prob: f.bool_or("norm_topk_prob", false)?,
            decoder_sparse_step: f.usize_req("decoder_sparse_step")?,
            mlp_only_layers: match root.get("mlp_only_layers") {
                Some(Value::Array(a)) => a
                    .iter()
                    .filter_map(|x| x.as_u64().map(|x| x as usize))
                    .collect(),
                None | Some(Value::Null) => {
                    bail!("{origin}: missing required key `mlp_only_layers`")
                }
                Some(other) => bail!("{origin}: `mlp_only_layers` must be a list, got {other}"),
            },
            eos_token_id: parse_ids(root.get("eos_token_id")),
            quantization,
            quantization_overrides,
            qwen4_exp: None,
        })
    }

    fn parse_qwen35(
        root: &Map<String, Value>,
        text: &Map<String, Value>,
        origin: &str,
        model_type: String,
    ) -> Result<Self> {
        let f = Fields { map: text, origin };
        let (quantization, quantization_overrides) = parse_quantization(root, origin)?;
        // mlx-lm: rope settings come only from `rope_parameters` (with its own defaults).
        let rope = match text.get("rope_parameters") {
            Some(Value::Object(m)) => Some(m),
            None | Some(Value::Null) => None,
            Some(other) => bail!("{origin}: `rope_parameters` must be an object, got {other}"),
        };
        let rope_num = |key: &str, default: f64| -> Result<f64> {
            match rope.and_then(|m| m.get(key)) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_f64().ok_or_else(|| {
                    anyhow!("{origin}: `rope_parameters.{key}` must be a number, got {v}")
                }),
            }
        };
        if let Some(kind) = rope
            .and_then(|m| m.get("type").or(m.get("rope_type")))
            .and_then(Value::as_str)
        {
            if !matches!(kind, "default" | "mrope") {
                bail!("{origin}: rope type `{kind}` is not supported (only default / mrope)");
            }
        }
        let hidden_size = f.usize_or("hidden_size", 4096)?;
        let num_attention_heads = f.usize_or("num_attention_heads", 32)?;
        Ok(Self {
            model_type,
            family: Family::Qwen35,
            hidden_size,
            num_hidden_layers: f.usize_or("num_hidden_layers", 32)?,
            intermediate_size: f.usize_or("intermediate_size", 14336)?,
            vocab_size: f.usize_or("vocab_size", 151936)?,
            max_position_embeddings: f.usize_or("max_position_embeddings", 131072)?,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            num_attention_heads,
            num_key_value_heads: f.usize_or("num_key_value_heads", 8)?,
            head_dim: f.usize_or("head_dim", hidden_size / num_attention_heads.max(1))?,
            attention_bias: f.bool_or("attention_bias", false)?,
            rope_theta: rope_num("rope_theta", 100000.0)?,
            partial_rotary_factor: rope_num("partial_rotary_factor", 0.25)?,
            full_attention_interval: f.usize_or("full_attention_interval", 4)?,
            linear_num_key_heads: f.usize_or("linear_num_key_heads", 16)?,
            linear_num_value_heads: f.usize_or("linear_num_value_heads", 64)?,
            linear_key_head_dim: f.usize_or("linear_key_head_dim", 192)?,
            linear_value_head_dim: f.usize_or("linear_value_head_dim", 128)?,
            linear_conv_kernel_dim: f.usize_or("linear_conv_kernel_dim", 4)?,
            num_experts: f.usize_or("num_experts", 0)?,
            num_experts_per_tok: f.usize_or("num_experts_per_tok", 0)?,
            moe_intermediate_size: f.usize_or("moe_intermediate_size", 0)?,
            shared_expert_intermediate_size: f.usize_or("shared_expert_intermediate_size", 0)?,
            norm_topk_prob: f.bool_or("norm_topk_prob", true)?,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            // mlx-lm reads eos from the top level (and generation_config.json), not text_config.
            eos_token_id: parse_ids(root.get("eos_token_id")),
            quantization,
            quantization_overrides,
            qwen4_exp: None,
        })
    }

    fn validate(&self, origin: &str) -> Result<()> {
        // Bounds first: everything after (and every loader loop and allocation) may then
        // iterate over or multiply these numbers.
        let bounded = [
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
        ];
        for (key, v, max) in bounded {
            if v > max {
                bail!("{origin}: `{key}` = {v} is larger than this engine supports ({max})");
            }
        }
        for (key, v) in [
            ("rms_norm_eps", self.rms_norm_eps),
            ("rope_theta", self.rope_theta),
            ("partial_rotary_factor", self.partial_rotary_factor),
        ] {
            if !(v.is_finite() && v > 0.0) {
                bail!("{origin}: `{key}` must be a positive number, got {v}");
            }
        }
        let positive = [
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
        ];
        for (key, v) in positive {
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
        if self.rope_dims() == 0
            || !self.rope_dims().is_multiple_of(2)
            || self.rope_dims() > self.head_dim
        {
            bail!(
                "{origin}: partial_rotary_factor {} gives {} rotary dims for head_dim {}; need an even number in 2..=head_dim",
                self.partial_rotary_factor,
                self.rope_dims(),
                self.head_dim
            );
        }
        let any_moe = (0..self.num_hidden_layers).any(|i| self.is_moe_layer(i));
        if any_moe {
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
        if self.family == Family::Qwen3Next && self.decoder_sparse_step == 0 {
            bail!("{origin}: `decoder_sparse_step` must be positive");
        }
        Ok(())
    }

    /// mlx-lm: layer `i` is full attention iff `(i + 1) % full_attention_interval == 0`.
    /// `qwen4_exp` follows its `layer_types` (its indexed attention is an attention layer).
    pub fn layer_kind(&self, i: usize) -> LayerKind {
        if let Some(q) = &self.qwen4_exp {
            return match q.layer_types.get(i) {
                Some(qwen4_exp::Qwen4LayerType::IndexedAttention) => LayerKind::FullAttention,
                _ => LayerKind::LinearAttention,
            };
        }
        if (i + 1).is_multiple_of(self.full_attention_interval) {
            LayerKind::FullAttention
        } else {
            LayerKind::LinearAttention
        }
    }

    pub fn is_moe_layer(&self, i: usize) -> bool {
        match self.family {
            Family::Qwen3Next => {
                self.num_experts > 0
                    && !self.mlp_only_layers.contains(&i)
                    && (i + 1).is_multiple_of(self.decoder_sparse_step.max(1))
            }
            Family::Qwen35 => self.num_experts > 0,
        }
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

    /// The quantization declared for a module path (as spelled in the checkpoint), if any.
    pub fn quant_spec_for(&self, module_path: &str) -> Option<Option<QuantSpec>> {
        self.quantization_overrides
            .iter()
            .find(|(p, _)| p == module_path)
            .map(|(_, s)| *s)
    }
}

/// `bits` or `group_size` of a quantization entry: a positive integer (a string such as
/// `"4"` is an error rather than silently the default).
fn quant_number(
    m: &Map<String, Value>,
    field: &str,
    default: usize,
    origin: &str,
    key: &str,
) -> Result<usize> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| {
                anyhow!("{origin}: `{field}` of `{key}` must be a positive integer, got {v}")
            }),
    }
}

impl QuantSpec {
    /// Only the formats MLX produces, which are the ones the kernels handle: a group must
    /// fill whole 32-bit words (a 4-bit group of 4 would not).
    fn check(&self, origin: &str, key: &str) -> Result<()> {
        if !affine::SUPPORTED_BITS.contains(&self.bits) {
            bail!(
                "{origin}: `{key}` declares {} bits (supported: {:?})",
                self.bits,
                affine::SUPPORTED_BITS
            );
        }
        if !affine::SUPPORTED_GROUPS.contains(&self.group_size) {
            bail!(
                "{origin}: `{key}` declares group_size {} (supported: {:?})",
                self.group_size,
                affine::SUPPORTED_GROUPS
            );
        }
        Ok(())
    }
}

type QuantBlock = (Option<QuantSpec>, Vec<(String, Option<QuantSpec>)>);

fn parse_quantization(root: &Map<String, Value>, origin: &str) -> Result<QuantBlock> {
    let block = match root
        .get("quantization")
        .or_else(|| root.get("quantization_config"))
    {
        None | Some(Value::Null) => return Ok((None, vec![])),
        Some(Value::Object(m)) => m,
        Some(other) => bail!("{origin}: `quantization` must be an object, got {other}"),
    };
    if let Some(mode) = block.get("mode").and_then(Value::as_str) {
        if mode != "affine" {
            bail!("{origin}: quantization mode `{mode}` is not supported (only MLX affine)");
        }
    }
    if block.contains_key("quant_method") && !block.contains_key("bits") {
        let method = block
            .get("quant_method")
            .and_then(Value::as_str)
            .unwrap_or("?");
        bail!("{origin}: quantization method `{method}` is not supported (only MLX affine)");
    }
    let global = QuantSpec {
        bits: quant_number(block, "bits", 4, origin, "quantization")?,
        group_size: quant_number(block, "group_size", 64, origin, "quantization")?,
    };
    global.check(origin, "quantization")?;
    let mut overrides = vec![];
    for (key, v) in block {
        if matches!(key.as_str(), "bits" | "group_size" | "mode") {
            continue;
        }
        if v.is_object() || v.is_boolean() {
            overrides.push((key.clone(), parse_quant_spec(v, global, origin, key)?));
        }
    }
    Ok((Some(global), overrides))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next_json() -> Value {
        serde_json::json!({
            "model_type": "qwen3_next", "hidden_size": 128, "num_hidden_layers": 6,
            "intermediate_size": 256, "vocab_size": 2048, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "rope_theta": 1e7, "partial_rotary_factor": 0.25, "full_attention_interval": 3,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
            "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
            "decoder_sparse_step": 1, "mlp_only_layers": [1], "eos_token_id": 7,
            "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}}
        })
    }

    #[test]
    fn qwen3_next_layer_rules_and_defaults() {
        let cfg = Config::from_json_str(&next_json().to_string(), "config.json").unwrap();
        assert_eq!(cfg.layer_kind(2), LayerKind::FullAttention);
        assert_eq!(cfg.layer_kind(3), LayerKind::LinearAttention);
        assert!(!cfg.is_moe_layer(1) && cfg.is_moe_layer(0));
        assert!(!cfg.norm_topk_prob, "mlx-lm's qwen3_next default is false");
        assert_eq!(cfg.rope_dims(), 16);
        assert_eq!(cfg.eos_token_id, vec![7]);
        assert_eq!(
            cfg.quant_spec_for("model.layers.0.mlp.gate"),
            Some(Some(QuantSpec {
                bits: 8,
                group_size: 64
            }))
        );
    }

    #[test]
    fn qwen35_nested_rope_parameters_and_defaults() {
        let j = serde_json::json!({"model_type": "qwen3_5", "eos_token_id": [1, 2], "text_config": {
            "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 32, "linear_value_head_dim": 32, "vocab_size": 2048,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5}}});
        let cfg = Config::from_json_str(&j.to_string(), "config.json").unwrap();
        assert_eq!(cfg.rope_theta, 1e7);
        assert_eq!(cfg.rope_dims(), 32);
        assert!(cfg.norm_topk_prob);
        assert!(!cfg.is_moe_layer(0));
        assert_eq!(cfg.eos_token_id, vec![1, 2]);
        assert_eq!(cfg.layer_kind(3), LayerKind::FullAttention);
    }

    #[test]
    fn clear_errors() {
        let err = |j: Value| {
            format!(
                "{:#}",
                Config::from_json_str(&j.to_string(), "cfg.json").unwrap_err()
            )
        };
        let mut j = next_json();
        j["model_type"] = "llama".into();
        assert!(err(j).contains("unsupported model_type `llama`"));
        let mut j = next_json();
        j.as_object_mut().unwrap().remove("hidden_size");
        assert!(err(j).contains("missing required key `hidden_size`"));
        let mut j = next_json();
        j["num_key_value_heads"] = 3.into();
        assert!(err(j).contains("not a multiple of num_key_value_heads"));
        let mut j = next_json();
        j["linear_num_value_heads"] = 3.into();
        assert!(err(j).contains("linear_num_value_heads (3)"));
        let e = format!(
            "{:#}",
            Config::from_json_str("{not json", "cfg.json").unwrap_err()
        );
        assert!(e.starts_with("cfg.json: invalid JSON"));
    }
}
