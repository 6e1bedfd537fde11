//! Snapshots saved to and loaded from safetensors files (`cache-prompt`, `generate
//! --prompt-cache-file`). The file records which model made it ([`ModelIdentity`]); loading
//! checks it, and checks every tensor against the model: the file is untrusted input.
//!
//! Layout: `tokens` (u32 `[n]`, the prompt the state follows), `layers.{i}.conv` and
//! `layers.{i}.state` for a GDN layer, `layers.{i}.keys` and `layers.{i}.values`
//! (`[1, Nkv, n, Dh]`) for an attention layer; metadata `format`, `format_version` and the
//! identity's fields. Version 2 adds `qwen4_exp`'s state: `layers.{i}.ple_window` (f32
//! `[(K−1)·N, S·H]`, the PLE conv window) on a GDN layer with per-layer embeddings, and
//! `layers.{i}.index_keys` (f32 `[n div c + n mod c, Di]`: the QSA indexer's pooled block
//! keys, then the raw keys of the incomplete block) on a QSA layer. The n-gram context is
//! not stored: it is the last `N − 1` of the tokens (eos before the first), so it is rebuilt
//! from `tokens`. A version-1 file is a version-2 file without these, and still loads.

use super::identity::ModelIdentity;
use super::snapshot::{LayerSnapshot, Snapshot};
use crate::cache::LayerCache;
use crate::layers::ple::PleState;
use crate::layers::qsa_indexer::IndexerCache;
use crate::{Cache, Model};
use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The `format` metadata value of a prompt-cache file.
pub const SNAPSHOT_FORMAT: &str = "qwen-gdn-prompt-cache";
/// Bumped whenever the layout changes; the version written.
pub const SNAPSHOT_FORMAT_VERSION: &str = "2";
/// The versions read: 1 is 2 without the `qwen4_exp` tensors (no other family has them).
const READABLE_VERSIONS: [&str; 2] = ["1", "2"];

/// Writes the state of `cache`, which has processed exactly `tokens`, to `path` (through a
/// temporary file, so a crash never leaves half a file). Replaces an earlier prompt-cache
/// file, but refuses to overwrite any other file.
pub fn save_snapshot(
    path: &Path,
    tokens: &[u32],
    cache: &Cache,
    identity: &ModelIdentity,
) -> Result<()> {
    ensure!(
        cache.offset == tokens.len() && !tokens.is_empty(),
        "{}: the cache has processed {} tokens, not the {} given",
        path.display(),
        cache.offset,
        tokens.len()
    );
    if path.exists() && is_prompt_cache_file(path).is_err() {
        bail!(
            "{} exists and is not a qwen-gdn prompt cache file; not overwriting it",
            path.display()
        );
    }
    let snapshot = Snapshot::capture(cache)?;
    let mut tensors: BTreeMap<String, Tensor> = BTreeMap::new();
    tensors.insert(
        "tokens".into(),
        Tensor::from_slice(tokens, tokens.len(), &Device::Cpu)?,
    );
    for (i, layer) in snapshot.layers.iter().enumerate() {
        let mut named: Vec<(&str, Tensor)> = match layer {
            LayerSnapshot::Gdn {
                conv, state, ple, ..
            } => [
                ("conv", conv.as_ref()),
                ("state", state.as_ref()),
                ("ple_window", ple.as_ref().map(|p| &p.window)),
            ]
            .into_iter()
            .filter_map(|(n, t)| Some((n, t?.clone())))
            .collect(),
            LayerSnapshot::Attention { kv, .. } => kv
                .iter()
                .flat_map(|(k, v)| [("keys", k.clone()), ("values", v.clone())])
                .collect(),
        };
        if let LayerSnapshot::Attention {
            indexer: Some(ix), ..
        } = layer
        {
            named.push(("index_keys", index_keys_tensor(ix)?));
        }
        for (name, t) in named {
            tensors.insert(format!("layers.{i}.{name}"), t.to_device(&Device::Cpu)?);
        }
    }
    let mut metadata = HashMap::from([
        ("format".to_string(), SNAPSHOT_FORMAT.to_string()),
        (
            "format_version".to_string(),
            SNAPSHOT_FORMAT_VERSION.to_string(),
        ),
    ]);
    for (key, value) in identity.fields() {
        metadata.insert(key.to_string(), value.to_string());
    }
    let tmp = temporary_path(path);
    let written = safetensors::serialize_to_file(&tensors, Some(metadata), &tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Reads a prompt-cache file made for `model` (whose identity is `identity`): the tokens it
/// holds the state after, and that state as a snapshot on the model's device. Any problem is
/// a one-line error naming the file and what is wrong.
pub fn load_snapshot(
    path: &Path,
    model: &Model,
    identity: &ModelIdentity,
) -> Result<(Vec<u32>, Snapshot)> {
    let shown = path.display();
    let expected = ExpectedShapes::of(model)?;
    let max_tokens = model.config().max_position_embeddings;
    let limit = expected.file_bytes(max_tokens);
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read prompt cache {shown}"))?
        .len();
    ensure!(
        size <= limit,
        "{shown}: {size} bytes, more than a prompt cache of this model can take ({limit})"
    );
    let bytes = std::fs::read(path).with_context(|| format!("cannot read prompt cache {shown}"))?;
    let metadata = metadata_of(&bytes).with_context(|| format!("{shown}"))?;
    let field = |key: &str| metadata.get(key).map(String::as_str).unwrap_or("(missing)");
    ensure!(
        field("format") == SNAPSHOT_FORMAT,
        "{shown}: not a qwen-gdn prompt cache file (format is {})",
        field("format")
    );
    ensure!(
        READABLE_VERSIONS.contains(&field("format_version")),
        "{shown}: prompt cache format version {}, this qwen-gdn reads versions {}",
        field("format_version"),
        READABLE_VERSIONS.join(" and ")
    );
    for (key, ours) in identity.fields() {
        ensure!(
            field(key) == ours,
            "{shown}: made for another model: {key} is {}, this model's is {ours}",
            field(key)
        );
    }
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{shown}: not a valid safetensors file: {e}"))?;

    let view = |name: &str| {
        st.tensor(name)
            .map_err(|_| anyhow::anyhow!("{shown}: tensor `{name}` is missing"))
    };
    let tokens_view = view("tokens")?;
    ensure!(
        tokens_view.dtype() == safetensors::Dtype::U32 && tokens_view.shape().len() == 1,
        "{shown}: `tokens` must be a u32 vector, not {:?} {:?}",
        tokens_view.dtype(),
        tokens_view.shape()
    );
    let n = tokens_view.shape()[0];
    ensure!(
        (1..=max_tokens).contains(&n),
        "{shown}: holds {n} tokens; expected 1 to {max_tokens} (the model's context)"
    );
    let tokens: Vec<u32> = tokens_view
        .data()
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let vocab = model.config().vocab_size;
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        bail!("{shown}: token id {bad} is outside the vocabulary ({vocab})");
    }

    let mut names: Vec<String> = vec!["tokens".into()];
    let device = model.device();
    let mut load = |name: String, dtype: DType, dims: Vec<usize>| -> Result<Tensor> {
        let v = view(&name)?;
        let file_dtype = DType::try_from(v.dtype()).ok();
        ensure!(
            file_dtype == Some(dtype) && v.shape() == dims.as_slice(),
            "{shown}: tensor `{name}` is {:?} {:?}; this model needs {} {dims:?}",
            v.dtype(),
            v.shape(),
            dtype.as_str()
        );
        names.push(name);
        Ok(Tensor::from_raw_buffer(v.data(), dtype, &dims, device)?)
    };
    let mut layers = Vec::new();
    for (i, layer) in expected.layers.iter().enumerate() {
        layers.push(match layer {
            ExpectedLayer::Gdn {
                state_dtype,
                conv,
                state,
                ple,
            } => LayerSnapshot::Gdn {
                state_dtype: *state_dtype,
                conv: Some(load(format!("layers.{i}.conv"), conv.0, conv.1.clone())?),
                state: Some(load(format!("layers.{i}.state"), state.0, state.1.clone())?),
                ple: match ple {
                    Some(initial) => Some(PleState {
                        context: context_after(&initial.context, &tokens),
                        window: load(
                            format!("layers.{i}.ple_window"),
                            initial.window.dtype(),
                            initial.window.dims().to_vec(),
                        )?,
                    }),
                    None => None,
                },
            },
            ExpectedLayer::Attention {
                dtype,
                per_token,
                indexer,
            } => {
                let mut dims = per_token.clone();
                dims[2] = n;
                LayerSnapshot::Attention {
                    kv: Some((
                        load(format!("layers.{i}.keys"), *dtype, dims.clone())?,
                        load(format!("layers.{i}.values"), *dtype, dims)?,
                    )),
                    indexer: match indexer {
                        Some(shape) => {
                            let (blocks, tail) = (n / shape.ratio, n % shape.ratio);
                            let keys = load(
                                format!("layers.{i}.index_keys"),
                                DType::F32,
                                vec![blocks + tail, shape.dim],
                            )?
                            .to_device(&Device::Cpu)?
                            .to_vec2::<f32>()?;
                            let (blocks, tail) = keys.split_at(blocks);
                            Some(IndexerCache {
                                blocks: blocks.to_vec(),
                                tail: tail.to_vec(),
                                len: n,
                            })
                        }
                        None => None,
                    },
                }
            }
        });
    }
    if let Some(extra) = st
        .names()
        .into_iter()
        .find(|k| !names.iter().any(|n| n == k))
    {
        bail!("{shown}: unexpected tensor `{extra}`");
    }
    Ok((tokens, Snapshot { offset: n, layers }))
}

/// [`load_snapshot`], restored into a live cache.
pub fn load_cache(
    path: &Path,
    model: &Model,
    identity: &ModelIdentity,
) -> Result<(Vec<u32>, Cache)> {
    let (tokens, snapshot) = load_snapshot(path, model, identity)?;
    Ok((tokens, snapshot.restore()?))
}

/// What each layer's cached tensors look like for this model, taken from a cache that has run
/// one token (so no shape rule is written twice).
struct ExpectedShapes {
    layers: Vec<ExpectedLayer>,
}

enum ExpectedLayer {
    Gdn {
        state_dtype: gdn_ops::StateDtype,
        conv: (DType, Vec<usize>),
        state: (DType, Vec<usize>),
        /// `qwen4_exp` PLE layers: a fresh state (the initial n-gram context, the window's
        /// shape and dtype).
        ple: Option<PleState>,
    },
    /// Key (and value) dtype and dims for one position.
    Attention {
        dtype: DType,
        per_token: Vec<usize>,
        /// `qwen4_exp` QSA layers.
        indexer: Option<IndexShape>,
    },
}

/// The indexer's keys: `dim` floats each, one block key per `ratio` tokens.
struct IndexShape {
    dim: usize,
    ratio: usize,
}

impl ExpectedShapes {
    fn of(model: &Model) -> Result<Self> {
        let mut probe = model.new_cache();
        model
            .forward_last(&[0], &mut probe)
            .context("running one token to learn the cache's shapes")?;
        let shape = |t: &Option<Tensor>| -> Result<(DType, Vec<usize>)> {
            let t = t
                .as_ref()
                .context("a layer kept no state after one token")?;
            Ok((t.dtype(), t.dims().to_vec()))
        };
        let ratio = model
            .config()
            .qwen4_exp
            .as_ref()
            .and_then(|q| q.qsa)
            .map(|q| q.compress_ratio);
        let fresh = model.qwen4_exp().map(|d| &d.layers);
        let layers = probe
            .layers
            .iter()
            .enumerate()
            .map(|(i, layer)| -> Result<ExpectedLayer> {
                Ok(match layer {
                    LayerCache::Gdn(c) => ExpectedLayer::Gdn {
                        state_dtype: c.state_dtype,
                        conv: shape(&c.conv)?,
                        state: shape(&c.state)?,
                        ple: fresh
                            .and_then(|layers| layers.get(i)?.ple.as_ref())
                            .map(|p| p.new_state())
                            .transpose()?,
                    },
                    LayerCache::Attention(c) => {
                        let (dtype, per_token) = shape(&c.keys())?;
                        let indexer = match (&c.indexer, ratio) {
                            (Some(ix), Some(ratio)) => Some(IndexShape {
                                dim: ix
                                    .tail
                                    .first()
                                    .context("the QSA indexer kept no key after one token")?
                                    .len(),
                                ratio,
                            }),
                            _ => None,
                        };
                        ExpectedLayer::Attention {
                            dtype,
                            per_token,
                            indexer,
                        }
                    }
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self { layers })
    }

    /// The largest file a state of `tokens` tokens makes (plus room for the header).
    fn file_bytes(&self, tokens: usize) -> u64 {
        let bytes = |(dtype, dims): &(DType, Vec<usize>)| {
            (dims.iter().product::<usize>() * dtype.size_in_bytes()) as u64
        };
        let layers: u64 = self
            .layers
            .iter()
            .map(|layer| match layer {
                ExpectedLayer::Gdn {
                    conv, state, ple, ..
                } => {
                    let window = ple
                        .as_ref()
                        .map_or(0, |p| bytes(&(p.window.dtype(), p.window.dims().to_vec())));
                    bytes(conv) + bytes(state) + window
                }
                ExpectedLayer::Attention {
                    dtype,
                    per_token,
                    indexer,
                } => {
                    let index = indexer
                        .as_ref()
                        .map_or(0, |ix| (4 * ix.dim * (tokens / ix.ratio + ix.ratio)) as u64);
                    2 * bytes(&(*dtype, per_token.clone())) * tokens as u64 + index
                }
            })
            .sum();
        layers + 4 * tokens as u64 + (1 << 20)
    }
}

/// The indexer's keys as one `[blocks + tail, Di]` f32 tensor: the pooled block keys, then
/// the raw keys of the incomplete block (never empty: a saved cache has run a token).
fn index_keys_tensor(ix: &IndexerCache) -> Result<Tensor> {
    let rows = ix.blocks.len() + ix.tail.len();
    let dim = ix
        .blocks
        .iter()
        .chain(&ix.tail)
        .map(Vec::len)
        .next()
        .unwrap_or(0);
    ensure!(
        ix.blocks.iter().chain(&ix.tail).all(|k| k.len() == dim),
        "QSA indexer keys of unequal widths"
    );
    let flat: Vec<f32> = ix
        .blocks
        .iter()
        .chain(&ix.tail)
        .flatten()
        .copied()
        .collect();
    Ok(Tensor::from_vec(flat, (rows, dim), &Device::Cpu)?)
}

/// The n-gram context after `tokens` from a fresh `initial` one: its last `initial.len()`
/// ids (the PLE keeps the last `N − 1` tokens, eos before the first).
fn context_after(initial: &[u32], tokens: &[u32]) -> Vec<u32> {
    let all: Vec<u32> = initial.iter().chain(tokens).copied().collect();
    all[all.len() - initial.len()..].to_vec()
}

/// Whether `path` is a prompt-cache file, reading only its header.
fn is_prompt_cache_file(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len)?;
    let n = u64::from_le_bytes(len);
    ensure!(n <= MAX_HEADER, "header too large");
    let mut header = vec![0; n as usize];
    file.read_exact(&mut header)?;
    let header: serde_json::Value = serde_json::from_slice(&header)?;
    let format = header.get("__metadata__").and_then(|m| m.get("format"));
    ensure!(format.and_then(|f| f.as_str()) == Some(SNAPSHOT_FORMAT));
    Ok(())
}

/// safetensors' own bound on a header.
const MAX_HEADER: u64 = 100_000_000;

fn metadata_of(bytes: &[u8]) -> Result<HashMap<String, String>> {
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| anyhow::anyhow!("not a valid safetensors file: {e}"))?;
    Ok(header.metadata().clone().unwrap_or_default())
}

fn temporary_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}
