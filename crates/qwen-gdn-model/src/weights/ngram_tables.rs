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
use anyhow::{anyhow, bail, ensure, Context, Result};
use memmap2::Mmap;
use safetensors::Dtype;
use std::sync::Arc;

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
    let hash = NgramHash::new(ple, ple_index, cfg.vocab_size);
    // transformers saves the hash constants as buffers: when present they must be the ones
    // computed from config.json, or the checkpoint was trained with another hashing scheme.
    for (what, computed) in [
        ("layer_multipliers", &hash.multipliers),
        ("ngram_heads_vocab_sizes", &hash.head_sizes),
        ("ngram_heads_offsets", &hash.head_offsets),
    ] {
        let name = format!("model.layers.{layer}.ple.ple_embedding.{what}");
        if ckpt.contains(&name) {
            let stored = ckpt.int_data(&name)?;
            let computed: Vec<i64> = computed.iter().map(|&v| v as i64).collect();
            if stored != computed {
                bail!(
                    "{dir}: `{name}` is {stored:?}, but config.json (seed, ngram_vocab_size_base, heads) gives {computed:?}: the checkpoint uses another n-gram hashing"
                );
            }
        }
    }
    let want_rows = hash.rows;
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

/// One shard's rows, mapped.
#[derive(Debug)]
struct MappedRows {
    map: Arc<Mmap>,
    start: usize,
    rows: u64,
    dtype: Dtype,
}

/// A table whose rows are gathered straight from the mapped checkpoint files: the table is
/// never copied whole (the release's is ~100 GB in bf16).
#[derive(Debug)]
pub struct RowTable {
    shards: Vec<MappedRows>,
    /// First row of each shard.
    offsets: Vec<u64>,
    pub rows: u64,
    pub width: usize,
}

impl NgramTable {
    /// Maps the table's shards (unquantized f32 / bf16 / f16 rows).
    pub fn open(&self, ckpt: &Checkpoint, width: usize) -> Result<RowTable> {
        ensure!(
            !self.quantized,
            "{}: quantized n-gram tables (layer {}) are not supported yet",
            ckpt.dir().display(),
            self.layer
        );
        let mut maps: Vec<(std::path::PathBuf, Arc<Mmap>)> = vec![];
        let mut shards = vec![];
        let mut offsets = vec![];
        let mut first = 0u64;
        for (name, rows) in &self.shards {
            let loc = ckpt
                .raw_location(&format!("{name}.weight"))
                .ok_or_else(|| anyhow!("{}: `{name}.weight` vanished", ckpt.dir().display()))?;
            let elem = match loc.dtype {
                Dtype::F32 => 4,
                Dtype::BF16 | Dtype::F16 => 2,
                other => bail!(
                    "{}: n-gram table `{}` is {other:?}; expected f32, bf16 or f16",
                    loc.path.display(),
                    loc.original
                ),
            };
            ensure!(
                loc.end - loc.start == rows * width * elem,
                "{}: n-gram table `{}` holds {} bytes, expected {rows} × {width} × {elem}",
                loc.path.display(),
                loc.original,
                loc.end - loc.start
            );
            let map = match maps.iter().find(|(p, _)| *p == loc.path) {
                Some((_, m)) => m.clone(),
                None => {
                    let file = std::fs::File::open(&loc.path)
                        .with_context(|| format!("{}: cannot open", loc.path.display()))?;
                    // SAFETY: read-only mapping of a checkpoint file, as Checkpoint does.
                    let m = Arc::new(
                        unsafe { Mmap::map(&file) }
                            .with_context(|| format!("{}: cannot map", loc.path.display()))?,
                    );
                    maps.push((loc.path.clone(), m.clone()));
                    m
                }
            };
            ensure!(loc.end <= map.len(), "{}: truncated", loc.path.display());
            offsets.push(first);
            first += *rows as u64;
            shards.push(MappedRows {
                map,
                start: loc.start,
                rows: *rows as u64,
                dtype: loc.dtype,
            });
        }
        Ok(RowTable {
            shards,
            offsets,
            rows: first,
            width,
        })
    }
}

impl RowTable {
    /// The rows `ids` as f32, `[ids.len() × width]` row-major. An id outside the table is an
    /// error (the hash never produces one; a corrupt table size would).
    pub fn gather(&self, ids: &[u64]) -> Result<Vec<f32>> {
        let w = self.width;
        let mut out = vec![0f32; ids.len() * w];
        for (dst, &id) in out.chunks_exact_mut(w).zip(ids) {
            ensure!(
                id < self.rows,
                "n-gram row {id} outside the table ({} rows)",
                self.rows
            );
            let s = self.offsets.partition_point(|&o| o <= id) - 1;
            let shard = &self.shards[s];
            let row = (id - self.offsets[s]) as usize;
            debug_assert!((row as u64) < shard.rows);
            match shard.dtype {
                Dtype::F32 => {
                    let b = &shard.map[shard.start + row * w * 4..][..w * 4];
                    for (d, c) in dst.iter_mut().zip(b.chunks_exact(4)) {
                        *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
                Dtype::BF16 => {
                    let b = &shard.map[shard.start + row * w * 2..][..w * 2];
                    for (d, c) in dst.iter_mut().zip(b.chunks_exact(2)) {
                        *d = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
                    }
                }
                _ => {
                    let b = &shard.map[shard.start + row * w * 2..][..w * 2];
                    for (d, c) in dst.iter_mut().zip(b.chunks_exact(2)) {
                        *d = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                    }
                }
            }
        }
        Ok(out)
    }
}
