//! The `qwen4_exp` (Qwen3.8-Flash-Next) part of config.json: what it adds to a Qwen3.5-MoE
//! text config (docs/qwen4_exp.md §5). Read from the same `text_config` object as the
//! hybrid family's sizes, which the registry reads first and hands over as [`BaseDims`].

use super::from_json::{read, unknown_fields_notice, unread_keys};
use super::limits::{MAX_CONV_KERNEL, MAX_HEADS, MAX_HEAD_DIM, MAX_LAYERS, MAX_WIDTH};
use super::token_ids::TokenIds;
use anyhow::{anyhow, bail, Result};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::fmt::Display;
use std::ops::RangeInclusive;

/// Bounds on the n-gram settings, checked before the prime search and the table sizes use
/// them. The release uses n = 3, 8 heads per order, base 2·10⁷.
pub const MAX_NGRAM_SIZE: usize = 8;
pub const MAX_HEADS_PER_NGRAM: usize = 256;
pub const MAX_NGRAM_VOCAB_BASE: u64 = 1 << 34;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Qwen4LayerType {
    /// Gated DeltaNet (Qwen3.5's), possibly with a per-layer embedding.
    #[serde(rename = "linear_attention")]
    LinearAttention,
    /// Gated attention restricted to the tokens the QSA indexer selects (`indexed_attention`,
    /// spelled `full_attention` in the released config: every attention layer of this model
    /// uses the indexer).
    #[serde(
        rename = "indexed_attention",
        alias = "full_attention",
        alias = "qwen_sparse_attention"
    )]
    IndexedAttention,
}

/// Activation of the GDN output gate (`output_gate_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputGate {
    Sigmoid,
    Silu,
}

/// The QSA indexer of every attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QsaConfig {
    pub n_heads: usize,
    pub head_dim: usize,
    /// Tokens attended from complete blocks (`indexer_budget`).
    pub budget: usize,
    /// Tokens per pooled block (`indexer_compress_ratio`).
    pub compress_ratio: usize,
}

impl QsaConfig {
    /// Blocks selected per query.
    pub fn block_topk(&self) -> usize {
        self.budget / self.compress_ratio
    }
}

/// Per-layer embeddings: hashed n-gram tables and their dilated conv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PleConfig {
    /// Zero-based decoder layers with a PLE block, ascending (config: one-based ids).
    pub layers: Vec<usize>,
    pub embed_dim: usize,
    pub conv_kernel: usize,
    /// Largest n-gram order (orders 2..=ngram_size); also the conv dilation.
    pub ngram_size: usize,
    pub heads_per_ngram: usize,
    pub vocab_base: u64,
    pub divisible_by: u64,
    pub seed: u64,
    /// Shard-count hint; the checkpoint's files are authoritative.
    pub split_parts: usize,
    /// The hashing's segment separator: text_config's `eos_token_id` (first of a list).
    pub eos_token_id: u32,
}

impl PleConfig {
    /// Hashed heads per layer, `(ngram_size − 1) · heads_per_ngram`.
    pub fn heads(&self) -> usize {
        (self.ngram_size - 1) * self.heads_per_ngram
    }

    /// Width of one table row.
    pub fn row_width(&self) -> usize {
        self.embed_dim / self.heads()
    }

    /// Index of decoder layer `layer` among the PLE layers (its prime set), if it has one.
    pub fn index_of(&self, layer: usize) -> Option<usize> {
        self.layers.iter().position(|&l| l == layer)
    }
}

#[derive(Debug, Clone)]
pub struct Qwen4ExpConfig {
    pub layer_types: Vec<Qwen4LayerType>,
    pub hc_count: usize,
    pub hc_lowrank: usize,
    pub output_gate: OutputGate,
    /// `None` only when the model has no attention layer.
    pub qsa: Option<QsaConfig>,
    /// `None` when `ple_layer_ids` is empty.
    pub ple: Option<PleConfig>,
    /// text_config keys this engine does not know (a newer release's fields), sorted; the
    /// registry fills it from what neither this family nor the hybrid one reads.
    pub unknown_fields: Vec<String>,
}

/// Qwen3.5 dims that have no sensible default for this model: a config without them is
/// refused instead of silently taking Qwen3.5's defaults.
const REQUIRED_FIELDS: &[&str] = &[
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "vocab_size",
    "max_position_embeddings",
];

/// The text_config keys this family reads, with transformers' defaults.
#[derive(Deserialize)]
#[serde(default)]
struct Qwen4ExpText {
    /// Every `full_attention_interval`-th layer is indexed attention when absent.
    layer_types: Option<Vec<Qwen4LayerType>>,
    hc_count: usize,
    hc_lowrank: usize,
    /// The GDN output gate; transformers: `output_gate_type or hidden_act`.
    output_gate_type: Option<String>,
    hidden_act: Option<String>,
    // The QSA indexer: all five or none (then the model must have no attention layer).
    indexer_n_heads: Option<usize>,
    indexer_kv_heads: Option<usize>,
    indexer_head_dim: Option<usize>,
    indexer_budget: Option<usize>,
    indexer_compress_ratio: Option<usize>,
    /// One-based decoder layers with a per-layer embedding.
    ple_layer_ids: Vec<usize>,
    /// mlx-vlm can move the tables out of the safetensors into files a JSON manifest names.
    ple_storage: Option<IgnoredAny>,
    ngram_size: usize,
    heads_per_ngram: usize,
    /// `hidden_size` when absent.
    ple_embed_dim: Option<usize>,
    ple_conv_kernel_size: usize,
    ngram_vocab_size_base: u64,
    make_ngram_vocab_size_divisible_by: u64,
    seed: u64,
    split_ngram_parts: usize,
    /// The n-gram segment separator; the top level's when text_config has none.
    eos_token_id: Option<TokenIds>,
}

impl Default for Qwen4ExpText {
    fn default() -> Self {
        Self {
            layer_types: None,
            hc_count: 4,
            hc_lowrank: 320,
            output_gate_type: None,
            hidden_act: None,
            indexer_n_heads: None,
            indexer_kv_heads: None,
            indexer_head_dim: None,
            indexer_budget: None,
            indexer_compress_ratio: None,
            ple_layer_ids: vec![],
            ple_storage: None,
            ngram_size: 3,
            heads_per_ngram: 8,
            ple_embed_dim: None,
            ple_conv_kernel_size: 4,
            ngram_vocab_size_base: 20_000_000,
            make_ngram_vocab_size_divisible_by: 128,
            seed: 1234,
            split_ngram_parts: 512,
            eos_token_id: None,
        }
    }
}

/// What [`read_qwen4_exp`] needs of the already read and validated hybrid part.
pub struct BaseDims {
    pub num_hidden_layers: usize,
    pub full_attention_interval: usize,
    pub hidden_size: usize,
    pub rope_dims: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
}

/// Reads and validates the family's part of `text` (text_config, or the top level of a flat
/// config; at key path `at` of `origin`) and lists the keys of `text` it does not read.
/// `root_eos` is the top level's `eos_token_id`, used when text_config has none.
pub fn read_qwen4_exp(
    text: &Map<String, Value>,
    root_eos: Option<&TokenIds>,
    base: &BaseDims,
    origin: &str,
    at: &[&str],
) -> Result<(Qwen4ExpConfig, BTreeSet<String>)> {
    for key in REQUIRED_FIELDS {
        if text.get(*key).is_none_or(Value::is_null) {
            bail!("{origin}: missing required key `{key}` (model_type qwen4_exp)");
        }
    }
    let t: Qwen4ExpText = read(text, origin, at)?;
    let config = t.validate(root_eos, base, origin)?;
    Ok((config, unread_keys::<Qwen4ExpText>(text, &[])))
}

impl Qwen4ExpText {
    fn validate(
        self,
        root_eos: Option<&TokenIds>,
        base: &BaseDims,
        origin: &str,
    ) -> Result<Qwen4ExpConfig> {
        let layer_types = self.layer_types(base, origin)?;
        check_ranges(
            origin,
            [
                ("hc_count", self.hc_count, 2..=MAX_HEADS),
                ("hc_lowrank", self.hc_lowrank, 1..=MAX_WIDTH),
            ],
        )?;
        let gate = self
            .output_gate_type
            .as_deref()
            .or(self.hidden_act.as_deref());
        let output_gate = match gate.unwrap_or("silu") {
            "sigmoid" => OutputGate::Sigmoid,
            "silu" => OutputGate::Silu,
            other => bail!(
                "{origin}: output gate activation `{other}` is not supported (sigmoid or silu)"
            ),
        };
        Ok(Qwen4ExpConfig {
            qsa: self.qsa(&layer_types, base, origin)?,
            ple: self.ple(&layer_types, root_eos, base, origin)?,
            layer_types,
            hc_count: self.hc_count,
            hc_lowrank: self.hc_lowrank,
            output_gate,
            unknown_fields: vec![],
        })
    }

    fn layer_types(&self, base: &BaseDims, origin: &str) -> Result<Vec<Qwen4LayerType>> {
        let n = base.num_hidden_layers;
        match &self.layer_types {
            // transformers: every `full_attention_interval`-th layer (default 4) is indexed.
            None => Ok((0..n)
                .map(|i| {
                    if (i + 1).is_multiple_of(base.full_attention_interval) {
                        Qwen4LayerType::IndexedAttention
                    } else {
                        Qwen4LayerType::LinearAttention
                    }
                })
                .collect()),
            Some(types) if types.len() != n => bail!(
                "{origin}: `layer_types` has {} entries but num_hidden_layers is {n}",
                types.len()
            ),
            Some(types) => Ok(types.clone()),
        }
    }

    fn qsa(
        &self,
        layer_types: &[Qwen4LayerType],
        base: &BaseDims,
        origin: &str,
    ) -> Result<Option<QsaConfig>> {
        let keys = [
            ("indexer_n_heads", self.indexer_n_heads),
            ("indexer_kv_heads", self.indexer_kv_heads),
            ("indexer_head_dim", self.indexer_head_dim),
            ("indexer_budget", self.indexer_budget),
            ("indexer_compress_ratio", self.indexer_compress_ratio),
        ];
        let has_attention = layer_types.contains(&Qwen4LayerType::IndexedAttention);
        if keys.iter().all(|(_, v)| v.is_none()) && !has_attention {
            return Ok(None);
        }
        if let Some((missing, _)) = keys.iter().find(|(_, v)| v.is_none()) {
            let all: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
            bail!(
                "{origin}: missing required key `{missing}` (the QSA indexer of qwen4_exp's attention layers needs all of {})",
                all.join(", ")
            );
        }
        let [n_heads, kv_heads, head_dim, budget, compress_ratio] =
            keys.map(|(_, v)| v.unwrap_or_default());
        if kv_heads != 1 {
            bail!("{origin}: `indexer_kv_heads` = {kv_heads}; qwen4_exp's QSA indexer has exactly one key head");
        }
        check_ranges(
            origin,
            [
                ("indexer_n_heads", n_heads, 1..=MAX_HEADS),
                ("indexer_head_dim", head_dim, 1..=MAX_HEAD_DIM),
                ("indexer_compress_ratio", compress_ratio, 1..=MAX_WIDTH),
            ],
        )?;
        if budget == 0 || !budget.is_multiple_of(compress_ratio) {
            bail!(
                "{origin}: `indexer_budget` = {budget} must be a positive multiple of indexer_compress_ratio ({compress_ratio})"
            );
        }
        if budget > base.max_position_embeddings {
            bail!(
                "{origin}: `indexer_budget` = {budget} is larger than the context (max_position_embeddings = {}): the sparse attention could never select anything",
                base.max_position_embeddings
            );
        }
        if base.rope_dims > head_dim {
            bail!(
                "{origin}: the attention's {} rotary dims do not fit the QSA index head (indexer_head_dim = {head_dim})",
                base.rope_dims
            );
        }
        Ok(Some(QsaConfig {
            n_heads,
            head_dim,
            budget,
            compress_ratio,
        }))
    }

    fn ple(
        &self,
        layer_types: &[Qwen4LayerType],
        root_eos: Option<&TokenIds>,
        base: &BaseDims,
        origin: &str,
    ) -> Result<Option<PleConfig>> {
        if self.ple_layer_ids.is_empty() {
            return Ok(None);
        }
        // Without this check such a checkpoint would fail later as "tables missing".
        if self.ple_storage.is_some() {
            bail!(
                "{origin}: `ple_storage` (n-gram tables in external files, mlx-vlm) is not supported yet: \
                 use a conversion that keeps the tables in the model's safetensors"
            );
        }
        if self.ple_layer_ids.len() > MAX_LAYERS {
            bail!("{origin}: `ple_layer_ids` has more than {MAX_LAYERS} entries");
        }
        let mut layers = vec![];
        for &id in &self.ple_layer_ids {
            if id == 0 || id > base.num_hidden_layers {
                bail!(
                    "{origin}: `ple_layer_ids` entry {id} is not a one-based layer id in 1..={}",
                    base.num_hidden_layers
                );
            }
            if layer_types[id - 1] != Qwen4LayerType::LinearAttention {
                bail!("{origin}: `ple_layer_ids` entry {id} is an attention layer; per-layer embeddings are only defined on linear_attention layers");
            }
            layers.push(id - 1);
        }
        layers.sort_unstable();
        layers.dedup();

        let (ngram_size, heads_per_ngram) = (self.ngram_size, self.heads_per_ngram);
        check_ranges(
            origin,
            [
                ("ngram_size", ngram_size, 2..=MAX_NGRAM_SIZE),
                ("heads_per_ngram", heads_per_ngram, 1..=MAX_HEADS_PER_NGRAM),
                (
                    "ple_conv_kernel_size",
                    self.ple_conv_kernel_size,
                    1..=MAX_CONV_KERNEL,
                ),
            ],
        )?;
        check_ranges(
            origin,
            [
                (
                    "ngram_vocab_size_base",
                    self.ngram_vocab_size_base,
                    2..=MAX_NGRAM_VOCAB_BASE,
                ),
                (
                    "make_ngram_vocab_size_divisible_by",
                    self.make_ngram_vocab_size_divisible_by,
                    1..=1 << 20,
                ),
            ],
        )?;
        let embed_dim = self.ple_embed_dim.unwrap_or(base.hidden_size);
        let heads = (ngram_size - 1) * heads_per_ngram;
        if embed_dim == 0 || embed_dim > MAX_WIDTH || !embed_dim.is_multiple_of(heads) {
            bail!(
                "{origin}: `ple_embed_dim` = {embed_dim} must be a positive multiple of the {heads} n-gram heads ((ngram_size − 1) · heads_per_ngram)"
            );
        }
        let eos = self
            .eos_token_id
            .as_ref()
            .or(root_eos)
            .and_then(TokenIds::first)
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| {
                anyhow!("{origin}: `eos_token_id` is required when ple_layer_ids is set (it separates the n-gram segments)")
            })?;
        Ok(Some(PleConfig {
            layers,
            embed_dim,
            conv_kernel: self.ple_conv_kernel_size,
            ngram_size,
            heads_per_ngram,
            vocab_base: self.ngram_vocab_size_base,
            divisible_by: self.make_ngram_vocab_size_divisible_by,
            seed: self.seed,
            split_parts: self.split_ngram_parts,
            eos_token_id: eos,
        }))
    }
}

/// Refuses the first `(key, value, range)` whose value is outside its range.
fn check_ranges<T: PartialOrd + Display, const N: usize>(
    origin: &str,
    ranged: [(&str, T, RangeInclusive<T>); N],
) -> Result<()> {
    for (key, v, range) in ranged {
        if !range.contains(&v) {
            bail!(
                "{origin}: `{key}` = {v} must be in {}..={}",
                range.start(),
                range.end()
            );
        }
    }
    Ok(())
}

impl Qwen4ExpConfig {
    /// The one-line notice for fields this engine ignores, if any.
    pub fn unknown_fields_notice(&self, origin: &str) -> Option<String> {
        unknown_fields_notice(origin, "qwen4_exp", &self.unknown_fields)
    }

    /// `S · H`: the width of the hyper-connection residual.
    pub fn residual_width(&self, hidden_size: usize) -> usize {
        self.hc_count * hidden_size
    }
}
