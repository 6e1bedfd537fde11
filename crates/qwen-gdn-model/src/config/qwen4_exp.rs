//! The `qwen4_exp` (Qwen3.8-Flash-Next) part of config.json: what it adds to a Qwen3.5-MoE
//! text config (docs/qwen4_exp.md §5). Parsed from the same `text_config` object; the
//! Qwen3.5 fields stay in [`super::Config`].

use super::{Fields, MAX_CONV_KERNEL, MAX_HEADS, MAX_HEAD_DIM, MAX_LAYERS, MAX_WIDTH};
use anyhow::{anyhow, bail, Result};
use serde_json::{Map, Value};

/// Bounds on the n-gram settings, checked before the prime search and the table sizes use
/// them. The release uses n = 3, 8 heads per order, base 2·10⁷.
pub const MAX_NGRAM_SIZE: usize = 8;
pub const MAX_HEADS_PER_NGRAM: usize = 256;
pub const MAX_NGRAM_VOCAB_BASE: u64 = 1 << 34;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qwen4LayerType {
    /// Gated DeltaNet (Qwen3.5's), possibly with a per-layer embedding.
    LinearAttention,
    /// Gated attention restricted to the tokens the QSA indexer selects (`indexed_attention`,
    /// spelled `full_attention` in the released config).
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
    /// text_config keys this engine does not know (a newer release's fields), sorted.
    pub unknown_fields: Vec<String>,
}

/// text_config keys of qwen3_5_moe / qwen4_exp that the engine reads or may ignore knowingly
/// (generic transformers fields, MTP, vision ids, rope spellings).
const KNOWN_FIELDS: &[&str] = &[
    "architectures",
    "attention_bias",
    "attention_dropout",
    "attn_output_gate",
    "bos_token_id",
    "decoder_sparse_step",
    "dtype",
    "eos_token_id",
    "full_attention_interval",
    "hc_count",
    "hc_lowrank",
    "head_dim",
    "heads_per_ngram",
    "hidden_act",
    "hidden_size",
    "indexer_budget",
    "indexer_compress_ratio",
    "indexer_head_dim",
    "indexer_kv_heads",
    "indexer_n_heads",
    "initializer_range",
    "intermediate_size",
    "layer_types",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_value_head_dim",
    "make_ngram_vocab_size_divisible_by",
    "mamba_ssm_dtype",
    "max_position_embeddings",
    "mlp_only_layers",
    "model_type",
    "moe_intermediate_size",
    "mtp",
    "mtp_num_hidden_layers",
    "mtp_use_dedicated_embeddings",
    "ngram_size",
    "ngram_vocab_size_base",
    "norm_topk_prob",
    "num_attention_heads",
    "num_experts",
    "num_experts_per_tok",
    "num_hidden_layers",
    "num_key_value_heads",
    "output_gate_type",
    "output_router_logits",
    "pad_token_id",
    "partial_rotary_factor",
    "ple_conv_kernel_size",
    "ple_embed_dim",
    "ple_layer_ids",
    "ple_storage",
    "rms_norm_eps",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "router_aux_loss_coef",
    "seed",
    "shared_expert_intermediate_size",
    "split_ngram_parts",
    "tie_word_embeddings",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "vocab_size",
];

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

/// What [`Qwen4ExpConfig::parse`] needs of the already parsed Qwen3.5 part.
pub struct BaseDims {
    pub num_hidden_layers: usize,
    pub full_attention_interval: usize,
    pub hidden_size: usize,
    pub rope_dims: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
}

impl Qwen4ExpConfig {
    /// `text` is text_config (or the root of a flat config); `root` the top level, whose
    /// `eos_token_id` is used when text_config has none.
    pub fn parse(
        text: &Map<String, Value>,
        root: &Map<String, Value>,
        base: &BaseDims,
        origin: &str,
    ) -> Result<Self> {
        let f = Fields { map: text, origin };
        for key in REQUIRED_FIELDS {
            if f.value(key).is_none() {
                bail!("{origin}: missing required key `{key}` (model_type qwen4_exp)");
            }
        }
        let layer_types = parse_layer_types(text, base, origin)?;

        let hc_count = f.usize_or("hc_count", 4)?;
        if !(2..=MAX_HEADS).contains(&hc_count) {
            bail!("{origin}: `hc_count` = {hc_count} must be in 2..={MAX_HEADS}");
        }
        let hc_lowrank = f.usize_or("hc_lowrank", 320)?;
        if hc_lowrank == 0 || hc_lowrank > MAX_WIDTH {
            bail!("{origin}: `hc_lowrank` = {hc_lowrank} must be in 1..={MAX_WIDTH}");
        }
        // transformers: `output_gate_type or hidden_act`.
        let gate_name = match f.value("output_gate_type") {
            Some(v) => v
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("{origin}: `output_gate_type` must be a string, got {v}"))?,
            None => match f.value("hidden_act") {
                Some(v) => v
                    .as_str()
                    .ok_or_else(|| anyhow!("{origin}: `hidden_act` must be a string, got {v}"))?
                    .to_string(),
                None => "silu".to_string(),
            },
        };
        let output_gate = match gate_name.as_str() {
            "sigmoid" => OutputGate::Sigmoid,
            "silu" => OutputGate::Silu,
            other => bail!(
                "{origin}: output gate activation `{other}` is not supported (sigmoid or silu)"
            ),
        };

        let qsa = parse_qsa(&f, &layer_types, base, origin)?;
        let ple = parse_ple(&f, text, root, &layer_types, base, origin)?;

        let mut unknown_fields: Vec<String> = text
            .keys()
            .filter(|k| !KNOWN_FIELDS.contains(&k.as_str()))
            .cloned()
            .collect();
        unknown_fields.sort();
        Ok(Self {
            layer_types,
            hc_count,
            hc_lowrank,
            output_gate,
            qsa,
            ple,
            unknown_fields,
        })
    }

    /// The one-line notice for fields this engine ignores, if any.
    pub fn unknown_fields_notice(&self, origin: &str) -> Option<String> {
        (!self.unknown_fields.is_empty()).then(|| {
            format!(
                "note: {origin}: ignoring qwen4_exp config fields this version does not know: {}",
                self.unknown_fields.join(", ")
            )
        })
    }

    /// `S · H`: the width of the hyper-connection residual.
    pub fn residual_width(&self, hidden_size: usize) -> usize {
        self.hc_count * hidden_size
    }
}

fn parse_layer_types(
    text: &Map<String, Value>,
    base: &BaseDims,
    origin: &str,
) -> Result<Vec<Qwen4LayerType>> {
    let n = base.num_hidden_layers;
    match text.get("layer_types") {
        None | Some(Value::Null) => {
            // transformers: every `full_attention_interval`-th layer (default 4) is indexed.
            Ok((0..n)
                .map(|i| {
                    if (i + 1).is_multiple_of(base.full_attention_interval) {
                        Qwen4LayerType::IndexedAttention
                    } else {
                        Qwen4LayerType::LinearAttention
                    }
                })
                .collect())
        }
        Some(Value::Array(a)) => {
            if a.len() != n {
                bail!(
                    "{origin}: `layer_types` has {} entries but num_hidden_layers is {n}",
                    a.len()
                );
            }
            a.iter()
                .enumerate()
                .map(|(i, v)| match v.as_str() {
                    Some("linear_attention") => Ok(Qwen4LayerType::LinearAttention),
                    // The released config spells the indexed layers `full_attention`; every
                    // attention layer of this model uses the indexer.
                    Some("indexed_attention" | "full_attention" | "qwen_sparse_attention") => {
                        Ok(Qwen4LayerType::IndexedAttention)
                    }
                    _ => bail!(
                        "{origin}: `layer_types[{i}]` = {v} is not supported (linear_attention, indexed_attention or full_attention)"
                    ),
                })
                .collect()
        }
        Some(other) => bail!("{origin}: `layer_types` must be a list, got {other}"),
    }
}

fn parse_qsa(
    f: &Fields,
    layer_types: &[Qwen4LayerType],
    base: &BaseDims,
    origin: &str,
) -> Result<Option<QsaConfig>> {
    const KEYS: [&str; 5] = [
        "indexer_n_heads",
        "indexer_kv_heads",
        "indexer_head_dim",
        "indexer_budget",
        "indexer_compress_ratio",
    ];
    let has_attention = layer_types.contains(&Qwen4LayerType::IndexedAttention);
    let present: Vec<&str> = KEYS
        .iter()
        .copied()
        .filter(|k| f.value(k).is_some())
        .collect();
    if present.is_empty() && !has_attention {
        return Ok(None);
    }
    if let Some(missing) = KEYS.iter().find(|k| f.value(k).is_none()) {
        bail!(
            "{origin}: missing required key `{missing}` (the QSA indexer of qwen4_exp's attention layers needs all of {})",
            KEYS.join(", ")
        );
    }
    let kv_heads = f.usize_req("indexer_kv_heads")?;
    if kv_heads != 1 {
        bail!("{origin}: `indexer_kv_heads` = {kv_heads}; qwen4_exp's QSA indexer has exactly one key head");
    }
    let qsa = QsaConfig {
        n_heads: f.usize_req("indexer_n_heads")?,
        head_dim: f.usize_req("indexer_head_dim")?,
        budget: f.usize_req("indexer_budget")?,
        compress_ratio: f.usize_req("indexer_compress_ratio")?,
    };
    for (key, v, max) in [
        ("indexer_n_heads", qsa.n_heads, MAX_HEADS),
        ("indexer_head_dim", qsa.head_dim, MAX_HEAD_DIM),
        ("indexer_compress_ratio", qsa.compress_ratio, MAX_WIDTH),
    ] {
        if v == 0 || v > max {
            bail!("{origin}: `{key}` = {v} must be in 1..={max}");
        }
    }
    if qsa.budget == 0 || !qsa.budget.is_multiple_of(qsa.compress_ratio) {
        bail!(
            "{origin}: `indexer_budget` = {} must be a positive multiple of indexer_compress_ratio ({})",
            qsa.budget,
            qsa.compress_ratio
        );
    }
    if qsa.budget > base.max_position_embeddings {
        bail!(
            "{origin}: `indexer_budget` = {} is larger than the context (max_position_embeddings = {}): the sparse attention could never select anything",
            qsa.budget,
            base.max_position_embeddings
        );
    }
    if base.rope_dims > qsa.head_dim {
        bail!(
            "{origin}: the attention's {} rotary dims do not fit the QSA index head (indexer_head_dim = {})",
            base.rope_dims,
            qsa.head_dim
        );
    }
    Ok(Some(qsa))
}

fn parse_ple(
    f: &Fields,
    text: &Map<String, Value>,
    root: &Map<String, Value>,
    layer_types: &[Qwen4LayerType],
    base: &BaseDims,
    origin: &str,
) -> Result<Option<PleConfig>> {
    let ids = match text.get("ple_layer_ids") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_u64().map(|x| x as usize).ok_or_else(|| {
                    anyhow!("{origin}: `ple_layer_ids` must hold positive integers, got {v}")
                })
            })
            .collect::<Result<Vec<_>>>()?,
        Some(other) => bail!("{origin}: `ple_layer_ids` must be a list, got {other}"),
    };
    if ids.is_empty() {
        return Ok(None);
    }
    // mlx-vlm can move the tables out of the safetensors into files a JSON manifest names;
    // without this check such a checkpoint would fail later as "tables missing".
    if !matches!(text.get("ple_storage"), None | Some(Value::Null)) {
        bail!(
            "{origin}: `ple_storage` (n-gram tables in external files, mlx-vlm) is not supported yet: \
             use a conversion that keeps the tables in the model's safetensors"
        );
    }
    if ids.len() > MAX_LAYERS {
        bail!("{origin}: `ple_layer_ids` has more than {MAX_LAYERS} entries");
    }
    let mut layers = vec![];
    for id in ids {
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

    let ngram_size = f.usize_or("ngram_size", 3)?;
    if !(2..=MAX_NGRAM_SIZE).contains(&ngram_size) {
        bail!("{origin}: `ngram_size` = {ngram_size} must be in 2..={MAX_NGRAM_SIZE}");
    }
    let heads_per_ngram = f.usize_or("heads_per_ngram", 8)?;
    if heads_per_ngram == 0 || heads_per_ngram > MAX_HEADS_PER_NGRAM {
        bail!(
            "{origin}: `heads_per_ngram` = {heads_per_ngram} must be in 1..={MAX_HEADS_PER_NGRAM}"
        );
    }
    let embed_dim = f.usize_or("ple_embed_dim", base.hidden_size)?;
    let heads = (ngram_size - 1) * heads_per_ngram;
    if embed_dim == 0 || embed_dim > MAX_WIDTH || !embed_dim.is_multiple_of(heads) {
        bail!(
            "{origin}: `ple_embed_dim` = {embed_dim} must be a positive multiple of the {heads} n-gram heads ((ngram_size − 1) · heads_per_ngram)"
        );
    }
    let conv_kernel = f.usize_or("ple_conv_kernel_size", 4)?;
    if conv_kernel == 0 || conv_kernel > MAX_CONV_KERNEL {
        bail!("{origin}: `ple_conv_kernel_size` = {conv_kernel} must be in 1..={MAX_CONV_KERNEL}");
    }
    let vocab_base = f.usize_or("ngram_vocab_size_base", 20_000_000)? as u64;
    if !(2..=MAX_NGRAM_VOCAB_BASE).contains(&vocab_base) {
        bail!("{origin}: `ngram_vocab_size_base` = {vocab_base} must be in 2..={MAX_NGRAM_VOCAB_BASE}");
    }
    let divisible_by = f.usize_or("make_ngram_vocab_size_divisible_by", 128)? as u64;
    if divisible_by == 0 || divisible_by > 1 << 20 {
        bail!("{origin}: `make_ngram_vocab_size_divisible_by` = {divisible_by} must be in 1..=1048576");
    }
    if base.vocab_size == 0 {
        bail!("{origin}: `vocab_size` must be positive");
    }
    let eos = match text.get("eos_token_id").filter(|v| !v.is_null()) {
        Some(v) => first_id(v),
        None => root.get("eos_token_id").and_then(first_id),
    }
    .ok_or_else(|| {
        anyhow!("{origin}: `eos_token_id` is required when ple_layer_ids is set (it separates the n-gram segments)")
    })?;
    Ok(Some(PleConfig {
        layers,
        embed_dim,
        conv_kernel,
        ngram_size,
        heads_per_ngram,
        vocab_base,
        divisible_by,
        seed: f.usize_or("seed", 1234)? as u64,
        split_parts: f.usize_or("split_ngram_parts", 512)?,
        eos_token_id: eos,
    }))
}

fn first_id(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|x| u32::try_from(x).ok()),
        Value::Array(a) => a.first().and_then(first_id),
        _ => None,
    }
}
