//! Memory-mapped safetensors checkpoints, single-file or sharded, and every checkpoint
//! quirk in one place (what mlx-lm's `sanitize` does, mlx-lm-reference.md §5.1):
//!
//! - key prefixes differ per family and per layout (`language_model.model.*` in mlx
//!   Qwen3.5, `model.language_model.*` in raw HF); all are mapped to `model.*` / `lm_head.*`;
//! - `mtp.*` and vision tensors are skipped (with a warning); any other tensor no layer
//!   asks for is an error, and so are layers beyond config.json's `num_hidden_layers`.
//!   [`Checkpoint::open_mtp`] opens the other view: the `mtp.*` tensors alone, whose norm
//!   weights are read in whichever convention each was stored (`norm_convention.rs`);
//! - raw HF layout (detected as mlx-lm does) needs norm weights shifted by +1, conv1d
//!   weights transposed from `[C,1,K]`, and experts stacked (Qwen3-Next stores them one by
//!   one, Qwen3.5-MoE fuses gate and up).
//!
//! Layers ask for tensors by their canonical (mlx) names and get them already sanitized.

use super::affine::{AffineMatrix, GroupParams};
use super::drafter_folder::DrafterFolder;
use super::files::{read_json_text, ModelFolder};
use super::matrix::{FloatData, FloatMatrix, Matrix};
use super::random_weights::{self, Fill, MatrixLayout};
use crate::config::{declared_spec, Config, Family, QuantSpec, Quantization};
use crate::LoadProgress;
use anyhow::{anyhow, bail, ensure, Context, Result};
use candle_core::{Device, Tensor};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, TensorInfo};
use safetensors::SafeTensors;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

struct ShardFile {
    path: PathBuf,
    mmap: Mmap,
    /// Byte offset of the data section (8-byte length + header).
    data_start: usize,
}

struct Entry {
    file: usize,
    info: TensorInfo,
    /// The key as spelled in the file, for error messages and quantization overrides.
    original: String,
    /// With random weights: what the tensor's values are drawn from.
    fill: Option<Fill>,
}

/// Where the tensors' bytes come from: the checkpoint's files, or random weights of the
/// shapes the loaders ask for ([`Checkpoint::random`]).
enum TensorBytes {
    Files(Vec<ShardFile>),
    Random {
        seed: u64,
        /// The tensors handed out as mappings ([`Checkpoint::raw_location`]), made once.
        mapped: Mutex<HashMap<String, Arc<Mmap>>>,
    },
}

/// See [`Checkpoint::raw_location`].
#[derive(Debug, Clone)]
pub struct RawLocation {
    pub path: PathBuf,
    /// Absolute byte offsets in the file.
    pub start: usize,
    pub end: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// The key as spelled in the file.
    pub original: String,
    /// With random weights, the tensor's bytes (there is no file to map).
    pub generated: Option<Arc<Mmap>>,
}

pub struct Checkpoint {
    bytes: TensorBytes,
    /// Every tensor by canonical name; with random weights, those the loaders asked for.
    entries: RwLock<HashMap<String, Arc<Entry>>>,
    /// Canonical names the loaders have asked for (see [`Checkpoint::leftovers`]).
    used: Mutex<HashSet<String>>,
    /// Known extras skipped at open: (kind, how many).
    skipped: Vec<(&'static str, usize)>,
    dir: PathBuf,
    model_type: String,
    /// Raw HF layout (not converted by mlx-lm): apply mlx-lm's sanitize transforms.
    pub raw_hf: bool,
    family: Family,
    progress: Option<LoadProgress>,
    /// Tensor bytes read so far, and those of every tensor the model may read.
    bytes_read: AtomicU64,
    bytes_total: u64,
    /// Repack the matrices the q8 mode runs into its interleaved layout as they are read.
    q8_interleave: bool,
    /// The `mtp.*` view ([`Checkpoint::open_mtp`]): norm weights are detected per tensor.
    mtp_view: bool,
    /// A drafter folder's own `quantization` block, which its quantized tensors must agree
    /// with instead of the main config's (`drafter_folder.rs`).
    declared_quantization: Option<Quantization>,
    /// The files name the head's tensors without `mtp.` (a drafter folder): so do errors.
    unprefixed: bool,
    /// Float matrices are quantized to this as they are read ([`Checkpoint::quantize_floats_to`]).
    quantize_floats: Option<QuantSpec>,
    /// The experts of each MoE block this process reads (an expert-parallel rank's share,
    /// [`crate::ModelPart::Experts`]); `None`: all of them.
    expert_share: Option<Range<usize>>,
}

/// Which tensors a [`Checkpoint`] holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum View {
    /// The model's own: `mtp.*` and other known extras skipped.
    Model,
    /// The multi-token-prediction head's `mtp.*` tensors only.
    Mtp,
    /// mlx-vlm's separate drafter folder: every tensor is the head's, named without `mtp.`
    /// (`drafter_folder.rs`); canonical names get the prefix, as in the [`View::Mtp`] view.
    Drafter,
}

/// Norm weights that HF stores zero-centred and mlx-lm shifts by +1 (the gated GDN norm is
/// not among them).
const SHIFTED_NORMS: [&str; 5] = [
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
];

/// The files that make up the checkpoint in `dir`, each checked by [`ModelFolder`].
fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>> {
    let folder = ModelFolder::new(dir)?;
    let index = dir.join("model.safetensors.index.json");
    if let Some(text) = read_json_text(&index)? {
        folder.check_file(&index)?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| anyhow!("{}: invalid JSON: {e}", index.display()))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| anyhow!("{}: missing `weight_map`", index.display()))?;
        let mut shards = Vec::with_capacity(map.len());
        for (tensor, file) in map {
            shards.push(file.as_str().ok_or_else(|| {
                anyhow!(
                    "{}: `weight_map` gives tensor {tensor} the file {file}, which is not a file name",
                    index.display()
                )
            })?);
        }
        if shards.is_empty() {
            bail!(
                "{}: `weight_map` is empty: the index lists no tensors and no shard files",
                index.display()
            );
        }
        shards.sort();
        shards.dedup();
        return shards
            .into_iter()
            .map(|name| folder.listed_file(name, &index))
            .collect();
    }
    let single = dir.join("model.safetensors");
    if std::fs::symlink_metadata(&single).is_ok() {
        folder.check_file(&single)?;
        return Ok(vec![single]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("{}: cannot list model folder", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    found.sort();
    if found.is_empty() {
        bail!(
            "{}: no model.safetensors or model.safetensors.index.json",
            dir.display()
        );
    }
    for path in &found {
        folder.check_file(path)?;
    }
    Ok(found)
}

/// Tensors a checkpoint may carry that the text model never uses: they are skipped with a
/// warning, where any other tensor left over is an error. `name` is the canonical name.
fn known_extra(key: &str, name: &str, config: &Config) -> Option<&'static str> {
    if key.contains("mtp.") {
        Some("multi-token prediction (mtp.*)")
    } else if key.starts_with("vision_tower")
        || key.starts_with("model.visual")
        || key.starts_with("visual.")
    {
        Some("vision tower")
    } else if config.tie_word_embeddings && name.starts_with("lm_head.") {
        // mlx-lm drops it too: the tied head is the embedding.
        Some("lm_head (tie_word_embeddings is set)")
    } else if key.ends_with("rotary_emb.inv_freq") {
        // A buffer some exporters save; RoPE is computed from config.json.
        Some("rotary_emb.inv_freq")
    } else {
        None
    }
}

/// Maps a key as stored to its canonical mlx name.
fn canonical_name(key: &str, family: Family) -> String {
    if family == Family::Qwen3Next {
        return key.to_string();
    }
    let name = if let Some(rest) = key.strip_prefix("model.language_model.") {
        format!("model.{rest}")
    } else if let Some(rest) = key.strip_prefix("language_model.") {
        rest.to_string()
    } else {
        key.to_string()
    };
    name
}

/// The decoder layer a canonical name belongs to (`model.layers.<i>.…`).
fn layer_index(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("model.layers.")?;
    rest.split('.').next()?.parse().ok()
}

impl Checkpoint {
    pub fn open(dir: &Path, config: &Config) -> Result<Self> {
        Self::open_view(dir, config, View::Model)
    }

    /// The checkpoint's multi-token-prediction head: its `mtp.*` tensors alone (canonical
    /// names keep the `mtp.` prefix), or `None` when it has none. Every norm weight read from
    /// this view is taken as stored zero-centred or shifted, whichever its values say
    /// ([`super::norm_convention`]): conversions disagree on whether they shifted the head's.
    /// mlx-vlm's separate drafter folder (`model_type: qwen4_exp_mtp`) is read as that view.
    pub fn open_mtp(dir: &Path, config: &Config) -> Result<Option<Self>> {
        let drafter = DrafterFolder::read(dir, config)?;
        let view = match drafter {
            Some(_) => View::Drafter,
            None => View::Mtp,
        };
        let mut ckpt = Self::open_view(dir, config, view)?;
        ckpt.unprefixed = drafter.is_some();
        ckpt.declared_quantization = drafter.map(|d| d.quantization);
        let empty = ckpt.entries().is_empty();
        Ok((!empty).then_some(ckpt))
    }

    fn open_view(dir: &Path, config: &Config, view: View) -> Result<Self> {
        let mut files = vec![];
        let mut entries = HashMap::new();
        let mut skipped = vec![];
        for path in shard_paths(dir)? {
            let file = std::fs::File::open(&path)
                .with_context(|| format!("{}: cannot open", path.display()))?;
            // SAFETY: the mapping is read-only; a checkpoint modified while we run is the
            // user's error and at worst yields wrong numbers, as with any mmap-based loader.
            let mmap = unsafe { Mmap::map(&file) }
                .with_context(|| format!("{}: cannot map", path.display()))?;
            let (header_len, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| {
                anyhow!(
                    "{}: not a valid safetensors file (truncated or corrupt: {e})",
                    path.display()
                )
            })?;
            let idx = files.len();
            for (key, info) in meta.tensors() {
                let name = match view {
                    View::Drafter if !key.starts_with("mtp.") => format!("mtp.{key}"),
                    _ => canonical_name(&key, config.family),
                };
                if view != View::Model {
                    if !name.starts_with("mtp.") {
                        continue;
                    }
                } else if let Some(kind) = known_extra(&key, &name, config) {
                    match skipped.iter_mut().find(|(k, _)| *k == kind) {
                        Some((_, n)) => *n += 1,
                        None => skipped.push((kind, 1)),
                    }
                    continue;
                }
                entries.insert(
                    name,
                    Arc::new(Entry {
                        file: idx,
                        info: info.clone(),
                        original: key,
                        fill: None,
                    }),
                );
            }
            files.push(ShardFile {
                path,
                mmap,
                data_start: 8 + header_len,
            });
        }
        let conv_is_raw = entries.iter().any(|(k, e)| {
            k.ends_with("conv1d.weight") && e.info.shape.last().is_some_and(|&d| d != 1)
        });
        let raw_hf = conv_is_raw
            || (config.family == Family::Qwen3Next
                && entries.contains_key("model.layers.0.mlp.experts.0.up_proj.weight"));
        let bytes_total = entries
            .values()
            .map(|e| (e.info.data_offsets.1 - e.info.data_offsets.0) as u64)
            .sum();
        // A config that names fewer layers than the checkpoint holds would run part of the
        // model and produce plausible-looking garbage.
        if let Some(last) = entries.keys().filter_map(|k| layer_index(k)).max() {
            if last >= config.num_hidden_layers {
                bail!(
                    "{}: num_hidden_layers is {} but the checkpoint holds layers up to model.layers.{last}",
                    dir.join("config.json").display(),
                    config.num_hidden_layers
                );
            }
        }
        Ok(Self {
            bytes: TensorBytes::Files(files),
            entries: RwLock::new(entries),
            used: Mutex::new(HashSet::new()),
            skipped,
            dir: dir.to_path_buf(),
            model_type: config.model_type.clone(),
            raw_hf,
            family: config.family,
            progress: None,
            bytes_read: AtomicU64::new(0),
            bytes_total,
            q8_interleave: false,
            mtp_view: view != View::Model,
            declared_quantization: None,
            unprefixed: false,
            quantize_floats: None,
            expert_share: None,
        })
    }

    /// Keeps in view only the tensors `part` owns (a pipeline stage's layers and ends, or an
    /// expert share's tensors): the others can no longer be read (asking for one is a "missing
    /// tensor" error, so a stage that strays is caught), nor are they counted as unused by
    /// [`Checkpoint::leftovers`] or in the bytes the progress bar waits for. Their pages are
    /// never touched: a tensor is read only when a loader asks for it. An expert share also
    /// reads stacked expert tensors for its own experts' rows only ([`Checkpoint::experts`]).
    pub fn restrict_to(&mut self, part: &crate::ModelPart, tied: bool) {
        self.expert_share = part.expert_share();
        let entries = self.entries.get_mut().unwrap_or_else(|e| e.into_inner());
        entries.retain(|name, _| part.owns(name, tied));
        let share = &self.expert_share;
        self.bytes_total = entries
            .iter()
            .map(|(name, e)| {
                let lead = share.clone().filter(|_| is_expert_stack(name));
                let (a, b) = byte_range(&e.info, lead);
                (b - a) as u64
            })
            .sum();
    }

    /// Tensor bytes the loaders have read from the files so far (a stacked expert tensor read
    /// for an expert share counts its share's rows only).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// A hash of every tensor's name, dtype, shape and byte range, from the headers alone
    /// (no tensor data is read): what ranks compare before they run a plan together, since
    /// each stage reads only its own tensors' data.
    pub fn header_fingerprint(&self) -> u64 {
        use sha2::{Digest, Sha256};
        let entries = self.entries();
        let mut names: Vec<&String> = entries.keys().collect();
        names.sort_unstable();
        let mut hash = Sha256::new();
        for name in names {
            let e = &entries[name];
            hash.update(format!(
                "{name} {:?} {:?} {:?} {}\n",
                e.info.dtype,
                e.info.shape,
                e.info.data_offsets,
                match &self.bytes {
                    TensorBytes::Files(files) => files[e.file]
                        .path
                        .file_name()
                        .map_or(String::new(), |f| f.to_string_lossy().into_owned()),
                    TensorBytes::Random { seed, .. } => format!("random {seed}"),
                }
            ));
        }
        u64::from_le_bytes(hash.finalize()[..8].try_into().expect("8 bytes"))
    }

    /// Random weights of the shapes the loaders ask for, in the layout an mlx conversion of
    /// `config` stores them (`random_weights.rs`), seeded by `seed`: each tensor is made
    /// when a loader reads it and dropped once copied, so the host holds one at a time.
    pub fn random(config: &Config, seed: u64) -> Self {
        Self {
            bytes: TensorBytes::Random {
                seed,
                mapped: Mutex::new(HashMap::new()),
            },
            entries: RwLock::new(HashMap::new()),
            used: Mutex::new(HashSet::new()),
            skipped: vec![],
            dir: PathBuf::from(format!("random weights (seed {seed})")),
            model_type: config.model_type.clone(),
            raw_hf: false,
            family: config.family,
            progress: None,
            bytes_read: AtomicU64::new(0),
            bytes_total: 0,
            q8_interleave: false,
            mtp_view: false,
            declared_quantization: None,
            unprefixed: false,
            quantize_floats: None,
            expert_share: None,
        }
    }

    /// Whether the tensors are random ([`Checkpoint::random`]) rather than read from files.
    pub fn is_random(&self) -> bool {
        matches!(self.bytes, TensorBytes::Random { .. })
    }

    /// With random weights, registers the tensor `name` (canonical) as a loader expects it;
    /// a tensor already registered (or any, when reading files) is left as it is.
    fn declare(&self, name: &str, dtype: Dtype, shape: Vec<usize>, fill: Fill) {
        if !self.is_random() {
            return;
        }
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if entries.contains_key(name) {
            return;
        }
        let len = shape.iter().product::<usize>() * dtype.bitsize() / 8;
        let info = TensorInfo {
            dtype,
            shape,
            data_offsets: (0, len),
        };
        let original = random_weights::stored_key(self.family, name);
        entries.insert(
            name.to_string(),
            Arc::new(Entry {
                file: 0,
                info,
                original,
                fill: Some(fill),
            }),
        );
    }

    /// With random weights, a float tensor: its fill from its name unless `fill` is given.
    fn declare_float(&self, name: &str, shape: &[usize], fill: Option<Fill>) {
        let dtype = random_weights::float_dtype(self.family, name);
        let fill = fill.unwrap_or_else(|| random_weights::float_fill(name));
        self.declare(name, dtype, shape.to_vec(), fill);
    }

    /// With random weights, the matrix `module` of `[lead.., cols]` in the layout an mlx
    /// conversion gives it: packed words, scales and biases, or a float weight.
    pub(crate) fn declare_matrix(
        &self,
        module: &str,
        lead_rows: &[usize],
        cols: usize,
        config: &Config,
    ) {
        if !self.is_random() {
            return;
        }
        let with_last = |last: usize| {
            let mut shape = lead_rows.to_vec();
            shape.push(last);
            shape
        };
        match random_weights::layout(config, module, cols) {
            MatrixLayout::Affine(spec) => {
                let (scales, biases) = random_weights::group_fills(spec.bits);
                let groups = with_last(cols / spec.group_size);
                let packed = with_last(cols * spec.bits / 32);
                self.declare(&format!("{module}.weight"), Dtype::U32, packed, Fill::Words);
                self.declare(
                    &format!("{module}.scales"),
                    Dtype::BF16,
                    groups.clone(),
                    scales,
                );
                self.declare(&format!("{module}.biases"), Dtype::BF16, groups, biases);
            }
            MatrixLayout::Float => self.declare_float(
                &format!("{module}.weight"),
                &with_last(cols),
                Some(Fill::Normal { std: 0.02 }),
            ),
        }
    }

    /// A random tensor's bytes in an anonymous mapping, for the readers that gather rows from
    /// a mapping themselves (the n-gram tables).
    fn generate_mapped(&self, seed: u64, e: &Entry) -> Result<Mmap> {
        let (a, b) = e.info.data_offsets;
        let mut map = memmap2::MmapMut::map_anon((b - a).max(1))
            .with_context(|| format!("{}: cannot map {} bytes", self.location(e), b - a))?;
        let fill = e.fill.unwrap_or(Fill::Words);
        random_weights::fill_bytes(seed, &e.original, e.info.dtype, fill, &mut map[..b - a]);
        Ok(map.make_read_only()?)
    }

    /// From now on, 4-bit matrices that the 8-bit-activation kernel takes are read into its
    /// interleaved layout (`AffineMatrix::into_q8_interleaved`), each as it is read, so that
    /// only one copy of a tensor's words is ever held beyond the mapped file.
    pub fn interleave_for_q8(&mut self, on: bool) {
        self.q8_interleave = on;
    }

    /// From now on, reports the bytes read to `progress`.
    pub fn report_progress(&mut self, progress: Option<LoadProgress>) {
        self.progress = progress;
    }

    /// Once the model is built: an error listing the tensors no loader asked for (a
    /// checkpoint of another architecture, or a config that does not describe it), else a
    /// warning about the known extras that were skipped, if any.
    pub fn leftovers(&self) -> Result<Option<String>> {
        let used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let entries = self.entries();
        let mut unused: Vec<&str> = entries
            .iter()
            .filter(|(name, _)| !used.contains(*name))
            .map(|(_, e)| e.original.as_str())
            .collect();
        if !unused.is_empty() {
            unused.sort_unstable();
            const SHOWN: usize = 8;
            let more = match unused.len().saturating_sub(SHOWN) {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            let shown: Vec<String> = unused
                .iter()
                .take(SHOWN)
                .map(|k| format!("`{k}`"))
                .collect();
            bail!(
                "{}: {} tensor(s) that this {} config does not use: {}{more}",
                self.dir.display(),
                unused.len(),
                self.model_type,
                shown.join(", ")
            );
        }
        if self.skipped.is_empty() {
            return Ok(None);
        }
        let kinds: Vec<String> = self
            .skipped
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        Ok(Some(format!(
            "{}: ignoring tensors the text model does not use: {}",
            self.dir.display(),
            kinds.join(", ")
        )))
    }

    /// The tensors the loaders asked for, as stored: (canonical name, dtype, shape), sorted.
    pub fn used_layout(&self) -> Vec<(String, String, Vec<usize>)> {
        let used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = self
            .entries()
            .iter()
            .filter(|(name, _)| used.contains(*name))
            .map(|(name, e)| {
                (
                    name.clone(),
                    format!("{:?}", e.info.dtype),
                    e.info.shape.clone(),
                )
            })
            .collect();
        out.sort();
        out
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries().contains_key(name)
    }

    /// Canonical names of every tensor the checkpoint holds (extras excluded), unordered.
    pub fn names(&self) -> Vec<String> {
        self.entries().keys().cloned().collect()
    }

    fn entries(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<Entry>>> {
        self.entries.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The folder the checkpoint was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// An integer tensor (I64 or I32: buffers some exporters save) as i64 values.
    pub fn int_data(&self, name: &str) -> Result<Vec<i64>> {
        let e = self.entry(name)?;
        let elem = match e.info.dtype {
            Dtype::I64 => 8,
            Dtype::I32 => 4,
            other => bail!(
                "{}: dtype {other:?}, expected an integer tensor",
                self.location(&e)
            ),
        };
        Ok(self.with_bytes(&e, |b| {
            b.chunks_exact(elem)
                .map(|c| match c.len() {
                    8 => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
                    _ => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64,
                })
                .collect()
        }))
    }

    /// Where a tensor's bytes are (file, absolute byte range) with its dtype and shape, for
    /// readers that map and gather from huge tensors themselves (the n-gram tables). Counts
    /// the tensor as used.
    pub fn raw_location(&self, name: &str) -> Option<RawLocation> {
        let e = self.entry(name).ok()?;
        let (a, b) = e.info.data_offsets;
        let (path, start, generated) = match &self.bytes {
            TensorBytes::Files(files) => {
                let f = &files[e.file];
                (f.path.clone(), f.data_start, None)
            }
            TensorBytes::Random { seed, mapped } => {
                let mut mapped = mapped.lock().unwrap_or_else(|e| e.into_inner());
                let map = match mapped.get(name) {
                    Some(map) => map.clone(),
                    None => {
                        let map = Arc::new(self.generate_mapped(*seed, &e).ok()?);
                        mapped.insert(name.to_string(), map.clone());
                        map
                    }
                };
                (self.dir.clone(), 0, Some(map))
            }
        };
        Some(RawLocation {
            path,
            start: start + a,
            end: start + b,
            dtype: e.info.dtype,
            shape: e.info.shape.clone(),
            original: e.original.clone(),
            generated,
        })
    }

    /// The stored shape of a tensor (canonical name), without reading it.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.entries().get(name).map(|e| e.info.shape.clone())
    }

    /// The folder's config.json, for error messages about the config.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.json")
    }

    fn entry(&self, name: &str) -> Result<Arc<Entry>> {
        let entries = self.entries();
        if entries.contains_key(name) {
            let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
            if !used.contains(name) {
                used.insert(name.to_string());
            }
        }
        // As the files spell it.
        let spelled = match self.unprefixed {
            true => name.strip_prefix("mtp.").unwrap_or(name),
            false => name,
        };
        entries.get(name).cloned().ok_or_else(|| match &self.bytes {
            TensorBytes::Files(files) => {
                let files: Vec<String> =
                    files.iter().map(|f| f.path.display().to_string()).collect();
                anyhow!("missing tensor `{spelled}` in {}", files.join(", "))
            }
            TensorBytes::Random { .. } => {
                anyhow!("missing tensor `{spelled}` in {}", self.dir.display())
            }
        })
    }

    fn location(&self, e: &Entry) -> String {
        match &self.bytes {
            TensorBytes::Files(files) => format!(
                "tensor `{}` in {}",
                e.original,
                files[e.file].path.display()
            ),
            TensorBytes::Random { .. } => {
                format!("tensor `{}` of {}", e.original, self.dir.display())
            }
        }
    }

    /// Runs `copy` on the tensor's bytes, then gives the mapped pages back to the kernel.
    ///
    /// Every loader copies what it reads (into host matrices or device buffers), so keeping
    /// the pages resident would hold the checkpoint in memory twice, and peak RSS at twice
    /// its size. The mapping is read-only and backed by the file, so a later read of the same
    /// range (a tensor read twice, a neighbour sharing the edge page) faults it back in.
    fn with_bytes<T>(&self, e: &Entry, copy: impl FnOnce(&[u8]) -> T) -> T {
        self.with_leading(e, None, copy)
    }

    /// [`Checkpoint::with_bytes`] of the rows `lead` of the tensor's leading axis only (the
    /// experts of a stacked expert tensor), or of all of it. The caller has checked the shape.
    fn with_leading<T>(
        &self,
        e: &Entry,
        lead: Option<Range<usize>>,
        copy: impl FnOnce(&[u8]) -> T,
    ) -> T {
        let (start, end) = e.info.data_offsets;
        let (a, b) = byte_range(&e.info, lead);
        let f = match &self.bytes {
            TensorBytes::Files(files) => &files[e.file],
            TensorBytes::Random { seed, .. } => {
                // One tensor's bytes at a time: made, copied by the loader, dropped.
                let fill = e.fill.unwrap_or(Fill::Words);
                let bytes =
                    random_weights::bytes(*seed, &e.original, e.info.dtype, fill, end - start);
                return copy(&bytes[a - start..b - start]);
            }
        };
        let out = copy(&f.mmap[f.data_start + a..f.data_start + b]);
        let len = (b - a) as u64;
        let done = self.bytes_read.fetch_add(len, Ordering::Relaxed) + len;
        if let Some(progress) = &self.progress {
            // A tensor read twice must not push the count past the total.
            progress.report(done.min(self.bytes_total), self.bytes_total);
        }
        #[cfg(unix)]
        // SAFETY: no slice of this range outlives `copy`; dropping pages of a read-only
        // file mapping only makes the next access read them from the file again. Failure
        // (an unsupported advice) leaves the pages resident, which is merely what we had.
        let _ = unsafe {
            f.mmap.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                f.data_start + a,
                b - a,
            )
        };
        out
    }

    fn check_shape(&self, e: &Entry, want: &[usize]) -> Result<()> {
        if e.info.shape != want {
            bail!(
                "{}: shape {:?}, expected {:?}",
                self.location(e),
                e.info.shape,
                want
            );
        }
        Ok(())
    }

    /// Float tensor data converted to f32, with its shape checked.
    fn f32_data(&self, name: &str, want: &[usize]) -> Result<Vec<f32>> {
        self.f32_rows(name, want, None)
    }

    /// [`Checkpoint::f32_data`] of the rows `lead` of the leading axis only, or of all.
    fn f32_rows(&self, name: &str, want: &[usize], lead: Option<Range<usize>>) -> Result<Vec<f32>> {
        let e = self.entry(name)?;
        self.check_shape(&e, want)?;
        let len = match &lead {
            Some(rows) => want[1..].iter().product::<usize>() * rows.len(),
            None => want.iter().product(),
        };
        self.float_rows(&e, lead).map(|d| {
            let mut out = vec![0f32; len];
            match d {
                FloatData::F32(v) => out.copy_from_slice(&v),
                FloatData::Bf16(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = x.to_f32()),
                FloatData::F16(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = x.to_f32()),
            }
            out
        })
    }

    /// Quantization scales or biases in their stored dtype, shape checked; the rows `lead` of
    /// the leading axis only, or all.
    fn group_params(
        &self,
        e: &Entry,
        want: &[usize],
        lead: Option<Range<usize>>,
    ) -> Result<GroupParams> {
        self.check_shape(e, want)?;
        Ok(match self.float_rows(e, lead)? {
            FloatData::F32(v) => v.into(),
            FloatData::Bf16(v) => v.into(),
            FloatData::F16(v) => v.into(),
        })
    }

    fn float_data(&self, e: &Entry) -> Result<FloatData> {
        self.float_rows(e, None)
    }

    /// [`Checkpoint::float_data`] of the rows `lead` of the leading axis only, or of all.
    fn float_rows(&self, e: &Entry, lead: Option<Range<usize>>) -> Result<FloatData> {
        self.with_leading(e, lead, |raw| self.decode_floats(e, raw))
    }

    fn decode_floats(&self, e: &Entry, raw: &[u8]) -> Result<FloatData> {
        Ok(match e.info.dtype {
            Dtype::F32 => FloatData::F32(
                raw.chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
            ),
            Dtype::BF16 => FloatData::Bf16(
                raw.chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            Dtype::F16 => FloatData::F16(
                raw.chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            other => bail!(
                "{}: dtype {other:?}, expected a float tensor (f32, bf16 or f16)",
                self.location(e)
            ),
        })
    }

    /// A plain float tensor (A_log, dt_bias, gated-norm weight...), as f32 on `device`.
    pub fn tensor(&self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        self.declare_float(name, shape, None);
        let data = self.f32_data(name, shape)?;
        Ok(Tensor::from_vec(data, shape, device)?)
    }

    /// A norm weight that every known layout of its model stores zero-centred (`qwen4_exp`'s
    /// hyper-connection and indexer norms, which neither its HF nor its mlx-vlm layout
    /// shifts): `1 + w`, added in f32 as both references do. In the MTP view the values decide
    /// instead, as for every head norm ([`super::norm_convention`]): a conversion that shifted
    /// them would otherwise only lower the drafts' acceptance.
    pub fn centred_norm(&self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        self.declare_float(name, shape, None);
        let mut data = self.f32_data(name, shape)?;
        if !self.mtp_view || super::norm_convention::zero_centred(&data) {
            data.iter_mut().for_each(|v| *v += 1.0);
        }
        Ok(Tensor::from_vec(data, shape, device)?)
    }

    /// An RMSNorm weight, used as a plain multiplier (shifted by +1 here for raw HF layout).
    /// `qwen4_exp`'s `q_norm`/`k_norm` are zero-centred in both of its layouts (mlx-vlm adds 1
    /// at run time, not in the checkpoint), so they get `1 + w`, in f32 as both references
    /// compute it.
    pub fn norm(&self, name: &str, dim: usize, device: &Device) -> Result<Tensor> {
        let qwen4_exp = self.model_type.starts_with("qwen4_exp");
        let zero_centred = qwen4_exp
            && [".q_norm.weight", ".k_norm.weight"]
                .iter()
                .any(|s| name.ends_with(s));
        // Random norms are 1 where the model uses the weight as it is, 0 where it adds 1.
        let one = Fill::Constant(if zero_centred { 0.0 } else { 1.0 });
        self.declare_float(name, &[dim], Some(one));
        let mut data = self.f32_data(name, &[dim])?;
        if self.mtp_view {
            // In f32, as the reference computes 1 + w.
            if super::norm_convention::zero_centred(&data) {
                data.iter_mut().for_each(|v| *v += 1.0);
            }
        } else if qwen4_exp
            && [".q_norm.weight", ".k_norm.weight"]
                .iter()
                .any(|s| name.ends_with(s))
        {
            data.iter_mut().for_each(|v| *v += 1.0);
        } else if self.raw_hf && SHIFTED_NORMS.iter().any(|s| name.ends_with(s)) {
            // mlx-lm adds 1 in the checkpoint dtype; round the same way so both match.
            let dtype = self.entry(name)?.info.dtype;
            for v in data.iter_mut() {
                *v = match dtype {
                    Dtype::BF16 => bf16::from_f32(*v + 1.0).to_f32(),
                    Dtype::F16 => f16::from_f32(*v + 1.0).to_f32(),
                    _ => *v + 1.0,
                };
            }
        }
        Ok(Tensor::from_vec(data, dim, device)?)
    }

    /// The depthwise conv1d weight as `[channels, kernel]` (mlx `[C,K,1]`, HF `[C,1,K]`).
    pub fn conv1d(
        &self,
        name: &str,
        channels: usize,
        kernel: usize,
        device: &Device,
    ) -> Result<Tensor> {
        self.declare_float(name, &[channels, kernel, 1], None);
        let e = self.entry(name)?;
        let (mlx, hf) = ([channels, kernel, 1], [channels, 1, kernel]);
        let shape: &[usize] = if e.info.shape == hf && kernel != 1 {
            &hf
        } else {
            &mlx
        };
        let data = self.f32_data(name, shape)?;
        Ok(Tensor::from_vec(data, (channels, kernel), device)?)
    }

    /// A linear layer's weight `[rows, cols]`: quantized when `<module>.scales` exists.
    pub fn matrix(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
        config: &Config,
    ) -> Result<Matrix> {
        self.declare_matrix(module, &[rows], cols, config);
        if self.contains(&format!("{module}.scales")) {
            return self.affine(module, &[rows], cols, config, None);
        }
        let e = self.entry(&format!("{module}.weight"))?;
        self.check_shape(&e, &[rows, cols])?;
        self.float_matrix(FloatMatrix::new(1, rows, cols, self.float_data(&e)?)?)
    }

    /// From now on, float matrices (linear and expert weights) are quantized to `spec` as they
    /// are read, those whose width splits into its groups: an MTP head from an unquantized
    /// checkpoint (`--mtp-from`) then runs at the main checkpoint's bits.
    pub fn quantize_floats_to(&mut self, spec: Option<QuantSpec>) {
        self.quantize_floats = spec;
    }

    /// Whether the folder is a drafter quantized by its maker (its own `quantization` block):
    /// its float tensors were kept float on purpose (mlx-vlm keeps the router gate, and every
    /// matrix whose width does not split into groups) and stay so.
    pub fn declares_its_own_quantization(&self) -> bool {
        self.declared_quantization
            .as_ref()
            .is_some_and(|(global, overrides)| {
                global.is_some() || overrides.iter().any(|(_, s)| s.is_some())
            })
    }

    /// `m`, quantized when [`Checkpoint::quantize_floats_to`] asks for it.
    fn float_matrix(&self, m: FloatMatrix) -> Result<Matrix> {
        let Some(spec) = self.quantize_floats else {
            return Ok(Matrix::Float(m));
        };
        let (experts, rows, cols) = (m.experts, m.rows, m.cols);
        let mut data = vec![0f32; experts * rows * cols];
        m.data.copy_into(0, &mut data);
        let quantized = super::quantize_on_load::quantize(
            &data,
            [experts, rows, cols],
            spec.bits,
            spec.group_size,
        );
        Ok(match quantized {
            Some(q) if self.q8_interleave => Matrix::Affine(q.into_q8_interleaved()),
            Some(q) => Matrix::Affine(q),
            None => Matrix::Float(m),
        })
    }

    /// Optional bias of a linear layer.
    pub fn bias(&self, module: &str, rows: usize) -> Result<Option<Vec<f32>>> {
        let name = format!("{module}.bias");
        if !self.contains(&name) {
            return Ok(None);
        }
        self.f32_data(&name, &[rows]).map(Some)
    }

    /// Quantized `[lead.., rows, cols]`; bits and group size follow from the packed shapes
    /// and must agree with config.json's `quantization` block where it names them. `lead`: of
    /// a stack (`lead_rows` `[experts, rows]`), the experts to read (all when `None`).
    fn affine(
        &self,
        module: &str,
        lead_rows: &[usize],
        cols: usize,
        config: &Config,
        lead: Option<Range<usize>>,
    ) -> Result<Matrix> {
        let w = self.entry(&format!("{module}.weight"))?;
        let s = self.entry(&format!("{module}.scales"))?;
        let b = self.entry(&format!("{module}.biases")).map_err(|_| {
            anyhow!(
                "{}: quantized without `.biases` (only MLX affine quantization is supported)",
                self.location(&s)
            )
        })?;
        let rank = lead_rows.len() + 1;
        let packed_cols = *w.info.shape.last().unwrap_or(&0);
        let groups = *s.info.shape.last().unwrap_or(&0);
        if w.info.shape.len() != rank
            || w.info.shape[..rank - 1] != *lead_rows
            || packed_cols == 0
            || groups == 0
        {
            bail!(
                "{}: shape {:?} does not fit a quantized {:?}x{cols} weight",
                self.location(&w),
                w.info.shape,
                lead_rows
            );
        }
        if w.info.dtype != Dtype::U32 {
            bail!(
                "{}: quantized weights must be uint32, got {:?}",
                self.location(&w),
                w.info.dtype
            );
        }
        let bits = packed_cols * 32 / cols;
        let group_size = cols / groups;
        if packed_cols * 32 != bits * cols || groups * group_size != cols {
            bail!(
                "{}: packed width {packed_cols} and {groups} groups do not fit {cols} inputs",
                self.location(&w)
            );
        }
        let module_path = w.original.trim_end_matches(".weight");
        let declared = match &self.declared_quantization {
            Some((global, overrides)) => declared_spec((global, overrides), module_path),
            None => config.declared_spec_for(module_path),
        };
        if let Some(spec) = declared {
            if (spec.bits, spec.group_size) != (bits, group_size) {
                bail!(
                    "{}: stored as {bits}-bit group {group_size}, but {} declares {}-bit group {}",
                    self.location(&w),
                    match self.declared_quantization {
                        Some(_) => self.config_path().display().to_string(),
                        None => "config.json".to_string(),
                    },
                    spec.bits,
                    spec.group_size
                );
            }
        }
        let mut group_shape = lead_rows.to_vec();
        group_shape.push(groups);
        self.check_shape(&s, &group_shape)?;
        self.check_shape(&b, &group_shape)?;
        let packed: Vec<u32> = self.with_leading(&w, lead.clone(), |raw| {
            raw.chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        });
        let scales = self.group_params(&s, &group_shape, lead.clone())?;
        let biases = self.group_params(&b, &group_shape, lead.clone())?;
        let (experts, rows) = match lead_rows {
            [r] => (1, *r),
            [e, r] => (lead.map_or(*e, |l| l.len()), *r),
            _ => unreachable!("matrices have one or two leading axes"),
        };
        AffineMatrix::new(
            bits,
            group_size,
            [experts, rows, cols],
            packed,
            scales,
            biases,
        )
        .map(|m| match self.q8_interleave {
            true => Matrix::Affine(m.into_q8_interleaved()),
            false => Matrix::Affine(m),
        })
        .with_context(|| self.location(&w))
    }

    /// Stacked expert weights `[experts, rows, cols]` for projection `proj` (`gate_proj`,
    /// `up_proj` or `down_proj`) of the MoE block at `mlp` (e.g. `model.layers.3.mlp`); with an
    /// expert share ([`crate::ModelPart::Experts`]), `[share, rows, cols]`: the share's experts
    /// only, the others' bytes not read.
    pub fn experts(
        &self,
        mlp: &str,
        proj: &str,
        experts: usize,
        rows: usize,
        cols: usize,
        config: &Config,
    ) -> Result<Matrix> {
        let share = self.expert_share.clone().unwrap_or(0..experts);
        ensure!(
            !share.is_empty() && share.end <= experts,
            "experts {share:?} asked of a block of {experts} experts ({mlp})"
        );
        let lead = Some(share.clone());
        let stacked = format!("{mlp}.switch_mlp.{proj}");
        self.declare_matrix(&stacked, &[experts, rows], cols, config);
        if self.contains(&format!("{stacked}.scales")) {
            return self.affine(&stacked, &[experts, rows], cols, config, lead);
        }
        // A block stored stacked (mlx, mlx-vlm's drafter) that lacks this projection's stack:
        // that stack is what is missing, not the raw layouts tried below.
        let stacks = ["gate_proj", "up_proj", "down_proj"]
            .iter()
            .any(|p| self.contains(&format!("{mlp}.switch_mlp.{p}.weight")));
        if stacks || self.contains(&format!("{stacked}.weight")) {
            let e = self.entry(&format!("{stacked}.weight"))?;
            self.check_shape(&e, &[experts, rows, cols])?;
            let data = self.float_rows(&e, lead)?;
            return self.float_matrix(FloatMatrix::new(share.len(), rows, cols, data)?);
        }
        // One tensor per expert: raw Qwen3-Next, and the official qwen4_exp checkpoint.
        // (An expert share holds its own experts' tensors only: look for its first.)
        let per_expert = self.contains(&format!("{mlp}.experts.{}.{proj}.weight", share.start));
        let data = match self.family {
            // Stacked here.
            Family::Qwen3Next | Family::Qwen35
                if per_expert || self.family == Family::Qwen3Next =>
            {
                let mut data = vec![];
                for i in share.clone() {
                    data.extend(
                        self.f32_data(&format!("{mlp}.experts.{i}.{proj}.weight"), &[rows, cols])?,
                    );
                }
                data
            }
            // Raw Qwen3.5-MoE: `gate_up_proj [E, 2*I, H]` (gate first) and `down_proj [E, H, I]`.
            Family::Qwen35 if proj == "down_proj" => self.f32_rows(
                &format!("{mlp}.experts.down_proj"),
                &[experts, rows, cols],
                lead,
            )?,
            _ => {
                let fused = self.f32_rows(
                    &format!("{mlp}.experts.gate_up_proj"),
                    &[experts, 2 * rows, cols],
                    lead,
                )?;
                let half = if proj == "gate_proj" { 0 } else { rows };
                (0..share.len())
                    .flat_map(|e| {
                        let start = (e * 2 * rows + half) * cols;
                        fused[start..start + rows * cols].iter().copied()
                    })
                    .collect()
            }
        };
        self.float_matrix(FloatMatrix::new(
            share.len(),
            rows,
            cols,
            FloatData::F32(data),
        )?)
    }
}

/// The byte range, within the data section, of the rows `lead` of the tensor's leading axis
/// (the experts of a stacked expert tensor), or of the whole tensor.
fn byte_range(info: &TensorInfo, lead: Option<Range<usize>>) -> (usize, usize) {
    let (start, end) = info.data_offsets;
    match (lead, info.shape.first()) {
        (Some(rows), Some(&all)) if all > 0 => {
            let row = (end - start) / all;
            (start + rows.start * row, start + rows.end * row)
        }
        _ => (start, end),
    }
}

/// A tensor stacking every expert of a MoE block on its leading axis (mlx's `switch_mlp`
/// stacks, raw Qwen3.5-MoE's `experts.gate_up_proj` and `experts.down_proj`).
fn is_expert_stack(name: &str) -> bool {
    name.contains(".switch_mlp.")
        || name.ends_with(".experts.gate_up_proj")
        || name.ends_with(".experts.down_proj")
}
