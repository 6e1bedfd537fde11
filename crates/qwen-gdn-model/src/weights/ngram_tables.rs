//! Where a `qwen4_exp` checkpoint keeps the n-gram table of each per-layer embedding, checked
//! before anything is read (docs/qwen4_exp.md §4.3). The tables are huge (~51B parameters in
//! the release), so they are only located here; rows are gathered from the mapped files.
//!
//! Layouts: transformers writes `…ple.ple_embedding.ngram_embedding.shard_{j}.weight`
//! (torch.chunk sizes), mlx-vlm `…ngram_embedding.shards.{j}.weight` (+ `.scales`/`.biases`
//! when quantized, its own sizes); a single `…ngram_embedding.weight` is accepted too. The
//! shard sizes are read from the files, never derived from `split_ngram_parts`.

use crate::config::qwen4_exp::PleConfig;
use crate::layers::ngram_hash::NgramHash;
use crate::weights::Checkpoint;
use crate::Config;
use anyhow::{anyhow, bail, Result};

/// One layer's table: its shards in row order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramTable {
    pub layer: usize,
    /// (canonical tensor name without `.weight`, rows), in row order.
    pub shards: Vec<(String, usize)>,
    pub rows: u64,
    /// MLX affine-quantized (`.scales` present).
    pub quantized: bool,
}

/// The tables of every PLE layer, or a one-line error naming the first that is missing or
/// malformed. Empty when the model has no PLE layer.
pub fn locate(ckpt: &Checkpoint, cfg: &Config) -> Result<Vec<NgramTable>> {
    let Some(ple) = cfg.qwen4_exp.as_ref().and_then(|q| q.ple.as_ref()) else {
        return Ok(vec![]);
    };
    ple.layers
        .iter()
        .enumerate()
        .map(|(p, &layer)| locate_layer(ckpt, cfg, ple, p, layer))
        .collect()
}

fn locate_layer(
    ckpt: &Checkpoint,
    cfg: &Config,
    ple: &PleConfig,
    ple_index: usize,
    layer: usize,
) -> Result<NgramTable> {
    let dir = ckpt.dir().display().to_string();
    let prefix = format!("model.layers.{layer}.ple.ple_embedding.ngram_embedding.");
    let mut shards: Vec<(usize, String)> = vec![];
    for name in ckpt.names() {
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let Some(base) = rest.strip_suffix(".weight") else {
            continue;
        };
        let index = if base.is_empty() {
            Some(0)
        } else {
            base.strip_prefix("shard_")
                .or_else(|| base.strip_prefix("shards."))
                .and_then(|j| j.parse::<usize>().ok())
        };
        match index {
            Some(j) => shards.push((j, name.strip_suffix(".weight").unwrap_or(name).to_string())),
            None => bail!("{dir}: unexpected n-gram table tensor `{name}`"),
        }
    }
    if shards.is_empty() {
        bail!(
            "{dir}: qwen4_exp layer {layer} has a per-layer embedding (ple_layer_ids contains {}) but the checkpoint has no n-gram table for it (expected {prefix}shard_0.weight, …)",
            layer + 1
        );
    }
    shards.sort();
    for (expected, (j, name)) in shards.iter().enumerate() {
        if *j != expected {
            bail!(
                "{dir}: the n-gram table of layer {layer} lacks shard {expected} (found {name} after it)"
            );
        }
    }
    let want_rows = NgramHash::new(ple, ple_index, cfg.vocab_size).rows;
    let quantized = ckpt.contains(&format!("{}.scales", shards[0].1));
    let mut rows = 0u64;
    let mut table = vec![];
    for (_, name) in shards {
        let weight = format!("{name}.weight");
        let shape = ckpt
            .shape(&weight)
            .ok_or_else(|| anyhow!("{dir}: `{weight}` vanished"))?;
        if shape.len() != 2 {
            bail!(
                "{dir}: n-gram table shard `{weight}` has shape {shape:?}; expected [rows, width]"
            );
        }
        if !quantized && shape[1] != ple.row_width() {
            bail!(
                "{dir}: n-gram table shard `{weight}` rows are {} wide; the config gives ple_embed_dim / heads = {}",
                shape[1],
                ple.row_width()
            );
        }
        rows += shape[0] as u64;
        table.push((name, shape[0]));
    }
    if rows != want_rows {
        bail!(
            "{dir}: the n-gram table of layer {layer} has {rows} rows; the config's hash needs {want_rows} (ngram_vocab_size_base, heads, make_ngram_vocab_size_divisible_by)"
        );
    }
    Ok(NgramTable {
        layer,
        shards: table,
        rows,
        quantized,
    })
}
