//! Where a `qwen4_exp` checkpoint keeps the n-gram table of each per-layer embedding, checked
//! before anything is read (docs/qwen4_exp.md §4.3). The tables are huge (~51B parameters in
//! the release), so they are only located here; rows are gathered from the mapped files.
//!
//! Layouts: transformers writes `…ple.ple_embedding.ngram_embedding.shard_{j}.weight`
//! (torch.chunk sizes), mlx-vlm `…ngram_embedding.shards.{j}.weight` (+ `.scales`/`.biases`
//! when quantized, its own sizes); a single `…ngram_embedding.weight` is accepted too. The
//! shard sizes are read from the files, never derived from `split_ngram_parts`.

use super::ngram_hash::NgramHash;
use super::ngram_row_format::{float_at, float_size, GroupParamsAt, MappedBytes, RowFormat};
use crate::config::qwen4_exp::PleConfig;
use crate::weights::checkpoint::RawLocation;
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

/// With random weights ([`Checkpoint::random`]): registers each PLE layer's table as one
/// shard (`shards.0`, a layout [`locate`] accepts) of the rows the config's hash needs, in the
/// layout config.json declares for it, before [`locate`] looks for the tables by name.
pub fn declare_random(ckpt: &Checkpoint, cfg: &Config) {
    let Some(ple) = cfg.qwen4_exp.as_ref().and_then(|q| q.ple.as_ref()) else {
        return;
    };
    for (p, &layer) in ple.layers.iter().enumerate() {
        let rows = NgramHash::new(ple, p, cfg.vocab_size).rows as usize;
        let shard = format!("model.layers.{layer}.ple.ple_embedding.ngram_embedding.shards.0");
        ckpt.declare_matrix(&shard, &[rows], ple.row_width(), cfg);
    }
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
    for name in &ckpt.names() {
        let name = name.as_str();
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
        // Name the key as this layout spells it, in the file that holds the layer's other
        // PLE tensors.
        let first = if ckpt.raw_hf {
            "shard_0.weight"
        } else {
            "shards.0.weight"
        };
        let (file, key) =
            match ckpt.raw_location(&format!("model.layers.{layer}.ple.key_proj.weight")) {
                Some(sibling) => (
                    sibling.path.display().to_string(),
                    sibling.original.replace(
                        "ple.key_proj.weight",
                        &format!("ple.ple_embedding.ngram_embedding.{first}"),
                    ),
                ),
                None => (dir.clone(), format!("{prefix}{first}")),
            };
        bail!(
            "{file}: qwen4_exp layer {layer} has a per-layer embedding (ple_layer_ids contains {}) but the checkpoint has no n-gram table for it (expected `{key}`, …)",
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
        let shape = shape.as_slice();
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
        if quantized {
            check_declared_quantization(ckpt, cfg, &name, shape, ple.row_width())?;
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

/// A quantized shard's format (what its packed and group shapes imply) must be the one
/// config.json declares for it (mlx-vlm writes a per-shard entry: 4-bit group 32 for rows
/// that group 64 does not divide), else the file and the config disagree on its values.
fn check_declared_quantization(
    ckpt: &Checkpoint,
    cfg: &Config,
    name: &str,
    shape: &[usize],
    width: usize,
) -> Result<()> {
    let weight = location(ckpt, &format!("{name}.weight"))?;
    let scales = ckpt.shape(&format!("{name}.scales")).ok_or_else(|| {
        anyhow!(
            "{}: n-gram table `{}` is quantized but has no `scales` next to it",
            weight.path.display(),
            weight.original
        )
    })?;
    let what = format!(
        "{}: n-gram table `{}`",
        weight.path.display(),
        weight.original
    );
    let (bits, group_size) = RowFormat::affine_layout(&what, shape, &scales, shape[0], width)?;
    let module = weight.original.trim_end_matches(".weight");
    if let Some(spec) = cfg.declared_spec_for(module) {
        ensure!(
            (spec.bits, spec.group_size) == (bits, group_size),
            "{what}: stored as {bits}-bit group {group_size}, but config.json declares {}-bit group {}",
            spec.bits,
            spec.group_size
        );
    }
    Ok(())
}

/// One shard's rows, mapped.
#[derive(Debug)]
struct MappedRows {
    main: MappedBytes,
    rows: u64,
    format: RowFormat,
}

/// A table whose rows are gathered straight from the mapped checkpoint files: the table is
/// never copied whole (the release's is ~100 GB in bf16, ~30 GB at 4 bits).
#[derive(Debug)]
pub struct RowTable {
    shards: Vec<MappedRows>,
    /// First row of each shard.
    offsets: Vec<u64>,
    pub rows: u64,
    pub width: usize,
}

/// The checkpoint files a table's tensors are mapped from, each mapped once.
#[derive(Default)]
struct Maps(Vec<(std::path::PathBuf, Arc<Mmap>)>);

impl Maps {
    fn bytes(&mut self, loc: &RawLocation) -> Result<MappedBytes> {
        let found = self.0.iter().find(|(p, _)| *p == loc.path);
        let map = match (&loc.generated, found) {
            // Random weights: the tensor's own mapping.
            (Some(generated), _) => generated.clone(),
            (None, Some((_, m))) => m.clone(),
            (None, None) => {
                let file = std::fs::File::open(&loc.path)
                    .with_context(|| format!("{}: cannot open", loc.path.display()))?;
                // SAFETY: read-only mapping of a checkpoint file, as Checkpoint does.
                let m = Arc::new(
                    unsafe { Mmap::map(&file) }
                        .with_context(|| format!("{}: cannot map", loc.path.display()))?,
                );
                self.0.push((loc.path.clone(), m.clone()));
                m
            }
        };
        ensure!(loc.end <= map.len(), "{}: truncated", loc.path.display());
        Ok(MappedBytes {
            map,
            start: loc.start,
            end: loc.end,
        })
    }
}

fn location(ckpt: &Checkpoint, name: &str) -> Result<RawLocation> {
    ckpt.raw_location(name)
        .ok_or_else(|| anyhow!("{}: `{name}` vanished", ckpt.dir().display()))
}

/// A float tensor's single value (the FP8 table scale, stored `[]` or `[1]`).
fn scalar(ckpt: &Checkpoint, maps: &mut Maps, name: &str) -> Result<f32> {
    let loc = location(ckpt, name)?;
    let size = float_size(loc.dtype);
    ensure!(
        size.is_some_and(|s| loc.end - loc.start == s) && loc.shape.iter().product::<usize>() == 1,
        "{}: `{}` must be one float, got {:?} {:?}",
        loc.path.display(),
        loc.original,
        loc.dtype,
        loc.shape
    );
    let bytes = maps.bytes(&loc)?;
    let v = float_at(loc.dtype, &bytes.map[bytes.start..bytes.end]);
    ensure!(
        v.is_finite(),
        "{}: `{}` is {v}",
        loc.path.display(),
        loc.original
    );
    Ok(v)
}

impl NgramTable {
    /// Maps the table's shards: float rows, MLX affine rows (`.scales`/`.biases`), or FP8
    /// e4m3 rows with the table's `weight_scale`. Every size is checked against the file.
    pub fn open(&self, ckpt: &Checkpoint, width: usize) -> Result<RowTable> {
        let mut maps = Maps::default();
        let fp8_scale = format!(
            "model.layers.{}.ple.ple_embedding.ngram_embedding.weight_scale",
            self.layer
        );
        let mut shards = vec![];
        let mut offsets = vec![];
        let mut first = 0u64;
        for (name, rows) in &self.shards {
            let loc = location(ckpt, &format!("{name}.weight"))?;
            let what = format!("{}: n-gram table `{}`", loc.path.display(), loc.original);
            let format = if self.quantized {
                ensure!(
                    loc.dtype == Dtype::U32,
                    "{what} is quantized but {:?}; expected U32 packed words",
                    loc.dtype
                );
                let mut params = |part: &str| -> Result<(GroupParamsAt, Vec<usize>)> {
                    let p = location(ckpt, &format!("{name}.{part}")).map_err(|_| {
                        anyhow!("{what} is quantized but has no `{part}` next to it")
                    })?;
                    ensure!(
                        float_size(p.dtype).is_some(),
                        "{}: `{}` is {:?}; expected f32, bf16 or f16",
                        p.path.display(),
                        p.original,
                        p.dtype
                    );
                    let bytes = maps.bytes(&p)?;
                    let n = p.shape.iter().product::<usize>();
                    ensure!(
                        bytes.end - bytes.start == n * float_size(p.dtype).unwrap_or(4),
                        "{}: `{}` holds {} bytes for shape {:?}",
                        p.path.display(),
                        p.original,
                        bytes.end - bytes.start,
                        p.shape
                    );
                    Ok((
                        GroupParamsAt {
                            bytes,
                            dtype: p.dtype,
                        },
                        p.shape,
                    ))
                };
                let (scales, scale_shape) = params("scales")?;
                let (biases, bias_shape) = params("biases")?;
                ensure!(
                    scale_shape == bias_shape,
                    "{what}: scales {scale_shape:?} and biases {bias_shape:?} differ"
                );
                let (bits, group_size) =
                    RowFormat::affine_layout(&what, &loc.shape, &scale_shape, *rows, width)?;
                RowFormat::Affine {
                    bits,
                    group_size,
                    scales,
                    biases,
                }
            } else if loc.dtype == Dtype::U8 {
                ensure!(
                    ckpt.contains(&fp8_scale),
                    "{what} is U8 (FP8) but the checkpoint has no `{fp8_scale}`"
                );
                RowFormat::Fp8E4m3 {
                    scale: scalar(ckpt, &mut maps, &fp8_scale)?,
                }
            } else {
                match float_size(loc.dtype) {
                    Some(_) => RowFormat::Float(loc.dtype),
                    None => bail!(
                        "{what} is {:?}; expected f32, bf16, f16, FP8 (U8 with a weight_scale) or MLX-quantized U32",
                        loc.dtype
                    ),
                }
            };
            let want = rows * format.row_bytes(width);
            ensure!(
                loc.end - loc.start == want,
                "{what} holds {} bytes, expected {rows} rows of {} bytes",
                loc.end - loc.start,
                format.row_bytes(width)
            );
            offsets.push(first);
            first += *rows as u64;
            shards.push(MappedRows {
                main: maps.bytes(&loc)?,
                rows: *rows as u64,
                format,
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
            shard.format.decode(&shard.main, row, dst)?;
        }
        Ok(out)
    }
}
