//! The model config: config.json, and generation_config.json's `eos_token_id`, read into one
//! [`Config`] whatever the family. This file is the registry: it picks the family by
//! `model_type`, finds the text config (the top level, or `text_config` for Qwen3.5 / 3.6 and
//! qwen4_exp checkpoints) and hands it to that family's serde structs, which validate what
//! they read:
//! - [`hybrid`]: `qwen3_next`, `qwen3_5`, `qwen3_5_moe`; the sizes every family has;
//! - [`qwen4_exp`]: what `qwen4_exp` adds to a Qwen3.5-MoE text config (QSA indexer,
//!   hyper-connections, per-layer n-gram embeddings; docs/qwen4_exp.md).
//!
//! Beside them, the parts no family owns: the `quantization` block, the special token ids,
//! the size limits and the serde reading with its one-line errors.

// Crate-visible for the family files, wherever they live.
pub(crate) mod from_json;
pub use crate::families::hybrid::config as hybrid;
pub(crate) mod limits;
mod quantization;
pub use crate::families::qwen4_exp::config as qwen4_exp;
pub(crate) mod token_ids;

pub use hybrid::{Family, HybridConfig};
pub use limits::{
    MAX_CONV_KERNEL, MAX_EXPERTS, MAX_HEADS, MAX_HEAD_DIM, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB,
    MAX_WIDTH,
};
pub use quantization::QuantSpec;
pub(crate) use quantization::{declared_spec, read_quantization, Quantization};

use crate::weights::files::read_json_text;
use anyhow::{anyhow, bail, Context, Result};
use from_json::{read, unknown_fields_notice};
use qwen4_exp::{BaseDims, Qwen4ExpConfig, Qwen4LayerType};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::ops::Deref;
use std::path::Path;
use token_ids::SpecialTokens;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet linear attention.
    LinearAttention,
    /// Gated softmax attention with a KV cache.
    FullAttention,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// `qwen3_next`, `qwen3_5`, `qwen3_5_moe`, `qwen4_exp` or `qwen4_exp_text`.
    pub model_type: String,
    pub family: Family,
    /// The sizes of the hybrid stack, which every family has; read as `cfg.hidden_size`
    /// through [`Deref`].
    pub hybrid: HybridConfig,
    /// Top-level `eos_token_id` of config.json (int or list), or generation_config.json's;
    /// empty when neither has one.
    pub eos_token_id: Vec<u32>,
    /// Global quantization (None for unquantized checkpoints).
    pub quantization: Option<QuantSpec>,
    /// Per-module overrides keyed by the checkpoint's module path; `None` = left unquantized.
    pub quantization_overrides: Vec<(String, Option<QuantSpec>)>,
    /// The `qwen4_exp` additions (its tensor names and Qwen3.5 parts follow [`Family::Qwen35`]).
    pub qwen4_exp: Option<Qwen4ExpConfig>,
    /// Keys of the text config that no family reads (a newer release's fields), sorted.
    pub unknown_fields: Vec<String>,
}

/// The sizes stay where the rest of the crate has always read them, `cfg.hidden_size`,
/// although the hybrid family's file now owns them.
impl Deref for Config {
    type Target = HybridConfig;

    fn deref(&self) -> &HybridConfig {
        &self.hybrid
    }
}

#[derive(Deserialize)]
struct ModelType {
    model_type: String,
}

impl Config {
    /// Reads `<dir>/config.json`, and `eos_token_id` from generation_config.json when present.
    /// Unknown fields are named in one notice on stderr.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = read_json_text(&path)
            .with_context(|| format!("{}: cannot read model config", path.display()))?
            .ok_or_else(|| anyhow!("{}: cannot read model config: not found", path.display()))?;
        let mut cfg = Self::from_json_str(&text, &path.display().to_string())?;
        if let Some(note) = cfg.unknown_fields_notice(&path.display().to_string()) {
            eprintln!("{note}");
        }
        let gen_path = dir.join("generation_config.json");
        if let Some(gen_text) = read_json_text(&gen_path)? {
            let gen: Value = serde_json::from_str(&gen_text)
                .with_context(|| format!("{}: invalid JSON", gen_path.display()))?;
            if let Value::Object(gen) = gen {
                let origin = gen_path.display().to_string();
                let tokens: SpecialTokens = read(&gen, &origin, &[])?;
                tokens.validate(&origin, cfg.vocab_size)?;
                let eos = tokens.eos();
                if !eos.is_empty() {
                    cfg.eos_token_id = eos;
                }
            }
        }
        Ok(cfg)
    }

    /// Parses config.json text; `origin` names the file in error messages.
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| anyhow!("{origin}: invalid JSON: {e}"))?;
        let Value::Object(root) = root else {
            bail!("{origin}: expected a JSON object");
        };
        let ModelType { model_type } = read(&root, origin, &[])?;
        let family = match model_type.as_str() {
            "qwen3_next" => Family::Qwen3Next,
            "qwen3_5" | "qwen3_5_moe" | "qwen4_exp" | "qwen4_exp_text" => Family::Qwen35,
            other => bail!(
                "{origin}: unsupported model_type `{other}` (supported: qwen3_next, qwen3_5, qwen3_5_moe, qwen4_exp)"
            ),
        };
        let (quantization, quantization_overrides) =
            quantization::read_quantization(&root, origin)?;
        // Qwen3.5 / 3.6 checkpoints nest the text config; mlx-lm takes it flat as well.
        let (text, at): (&Map<String, Value>, &[&str]) = match (family, root.get("text_config")) {
            (Family::Qwen35, Some(Value::Object(text))) => (text, &["text_config"]),
            (Family::Qwen35, Some(_)) => bail!("{origin}: `text_config` must be an object"),
            _ => (&root, &[]),
        };
        let (hybrid, mut unknown) = hybrid::read_hybrid(family, text, origin, at)?;
        hybrid.validate(origin)?;
        let root_tokens: SpecialTokens = read(&root, origin, &[])?;
        let qwen4_exp = if model_type.starts_with("qwen4_exp") {
            let base = BaseDims {
                num_hidden_layers: hybrid.num_hidden_layers,
                full_attention_interval: hybrid.full_attention_interval,
                hidden_size: hybrid.hidden_size,
                rope_dims: hybrid.rope_dims(),
                max_position_embeddings: hybrid.max_position_embeddings,
                vocab_size: hybrid.vocab_size,
            };
            let eos = root_tokens.eos_token_id.as_ref();
            let (mut q, unread) = qwen4_exp::read_qwen4_exp(text, eos, &base, origin, at)?;
            // Unknown: read by neither family.
            unknown.retain(|k| unread.contains(k));
            q.unknown_fields = unknown.iter().cloned().collect();
            Some(q)
        } else {
            None
        };
        root_tokens.validate(origin, hybrid.vocab_size)?;
        if !at.is_empty() {
            let text_tokens: SpecialTokens = read(text, origin, at)?;
            text_tokens.validate(origin, hybrid.vocab_size)?;
        }
        Ok(Self {
            model_type,
            family,
            hybrid,
            // mlx-lm reads eos from the top level (and generation_config.json), not text_config.
            eos_token_id: root_tokens.eos(),
            quantization,
            quantization_overrides,
            qwen4_exp,
            unknown_fields: unknown.into_iter().collect(),
        })
    }

    /// The one-line notice for text config fields this engine ignores, if any.
    pub fn unknown_fields_notice(&self, origin: &str) -> Option<String> {
        let family = match self.qwen4_exp {
            Some(_) => "qwen4_exp",
            None => &self.model_type,
        };
        unknown_fields_notice(origin, family, &self.unknown_fields)
    }

    /// mlx-lm: layer `i` is full attention iff `(i + 1) % full_attention_interval == 0`.
    /// `qwen4_exp` follows its `layer_types` (its indexed attention is an attention layer).
    pub fn layer_kind(&self, i: usize) -> LayerKind {
        if let Some(q) = &self.qwen4_exp {
            return match q.layer_types.get(i) {
                Some(Qwen4LayerType::IndexedAttention) => LayerKind::FullAttention,
                _ => LayerKind::LinearAttention,
            };
        }
        if (i + 1).is_multiple_of(self.full_attention_interval) {
            LayerKind::FullAttention
        } else {
            LayerKind::LinearAttention
        }
    }

    /// The spec config.json declares for `module_path` ([`declared_spec`]).
    pub fn declared_spec_for(&self, module_path: &str) -> Option<QuantSpec> {
        declared_spec(
            (&self.quantization, &self.quantization_overrides),
            module_path,
        )
    }

    /// The quantization declared for a module path (as spelled in the checkpoint), if any.
    pub fn quant_spec_for(&self, module_path: &str) -> Option<Option<QuantSpec>> {
        self.quantization_overrides
            .iter()
            .find(|(p, _)| p == module_path)
            .map(|(_, s)| *s)
    }
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

    fn qwen35_json() -> Value {
        serde_json::json!({"model_type": "qwen3_5", "vision_config": {"depth": 2}, "text_config": {
            "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 32, "linear_value_head_dim": 32, "vocab_size": 2048,
            "rope_theta": 1e6, "mlp_only_layers": [], "architectures": ["x"]}})
    }

    #[test]
    fn unknown_fields_get_one_notice_naming_them() {
        let mut j = next_json();
        j["zz_future"] = true.into();
        j["hc_dynamic"] = 1.into();
        j["_comment"] = "JSON comments are not fields".into();
        j["torch_dtype"] = "bfloat16".into();
        let cfg = Config::from_json_str(&j.to_string(), "cfg.json").unwrap();
        assert_eq!(cfg.unknown_fields, ["hc_dynamic", "zz_future"]);
        assert_eq!(
            cfg.unknown_fields_notice("cfg.json").unwrap(),
            "note: cfg.json: ignoring qwen3_next config fields this version does not know: hc_dynamic, zz_future"
        );
        // Nested: the text config's keys count (those the family knowingly skips do not);
        // the top level's multimodal keys are not the text model's.
        let cfg = Config::from_json_str(&qwen35_json().to_string(), "cfg.json").unwrap();
        assert!(cfg.unknown_fields.is_empty(), "{:?}", cfg.unknown_fields);
        assert_eq!(cfg.unknown_fields_notice("cfg.json"), None);
        let mut j = qwen35_json();
        j["text_config"]["sliding_window_pattern"] = 2.into();
        let cfg = Config::from_json_str(&j.to_string(), "cfg.json").unwrap();
        assert_eq!(
            cfg.unknown_fields_notice("cfg.json").unwrap(),
            "note: cfg.json: ignoring qwen3_5 config fields this version does not know: sliding_window_pattern"
        );
    }

    #[test]
    fn wrong_types_name_the_key_path() {
        type Case = (fn() -> Value, fn(&mut Value), &'static str);
        let cases: [Case; 6] = [
            (
                next_json,
                |j| j["hidden_size"] = "128".into(),
                "cfg.json: `hidden_size`: invalid type: string \"128\", expected usize",
            ),
            (
                next_json,
                |j| j["mlp_only_layers"] = serde_json::json!([1, -2]),
                "cfg.json: `mlp_only_layers[1]`: invalid value: integer `-2`, expected usize",
            ),
            (
                next_json,
                |j| j["eos_token_id"] = "<|im_end|>".into(),
                "cfg.json: `eos_token_id`: invalid type: string \"<|im_end|>\", expected a token id or a list of them",
            ),
            (
                next_json,
                |j| j["quantization"]["model.layers.0.mlp.gate"]["bits"] = "8".into(),
                "cfg.json: `bits` of `quantization.model.layers.0.mlp.gate`: must be a positive integer, got \"8\"",
            ),
            (
                qwen35_json,
                |j| j["text_config"]["rope_parameters"] = serde_json::json!({"rope_theta": "1e7"}),
                "cfg.json: `rope_theta` of `text_config.rope_parameters`: invalid type: string \"1e7\", expected f64",
            ),
            (
                qwen35_json,
                |j| j["text_config"]["tie_word_embeddings"] = 1.into(),
                "cfg.json: `tie_word_embeddings` of `text_config`: invalid type: integer `1`, expected a boolean",
            ),
        ];
        for (base, edit, want) in cases {
            let mut j = base();
            edit(&mut j);
            let e = Config::from_json_str(&j.to_string(), "cfg.json").unwrap_err();
            assert_eq!(format!("{e:#}"), want);
        }
    }

    #[test]
    fn null_members_read_as_absent() {
        let mut j = qwen35_json();
        j["text_config"]["head_dim"] = Value::Null;
        j["text_config"]["rope_parameters"] = Value::Null;
        j["quantization"] = Value::Null;
        let cfg = Config::from_json_str(&j.to_string(), "cfg.json").unwrap();
        assert_eq!(cfg.head_dim, 32, "hidden_size / num_attention_heads");
        assert_eq!(
            (cfg.rope_theta, cfg.partial_rotary_factor),
            (100000.0, 0.25),
            "mlx-lm's rope_parameters defaults (the top-level rope_theta is not read)"
        );
        assert_eq!(cfg.quantization, None);
        let mut j = next_json();
        j["tie_word_embeddings"] = Value::Null;
        assert!(
            !Config::from_json_str(&j.to_string(), "cfg.json")
                .unwrap()
                .tie_word_embeddings
        );
        let mut j = next_json();
        j["head_dim"] = Value::Null;
        assert!(format!(
            "{:#}",
            Config::from_json_str(&j.to_string(), "cfg.json").unwrap_err()
        )
        .contains("missing required key `head_dim`"));
    }
}
