//! Snapshots saved to and loaded from safetensors files (`cache-prompt`, `generate
//! --prompt-cache-file`). The file records which model made it ([`ModelIdentity`]); loading
//! checks it, and checks every tensor against the model: the file is untrusted input.
//!
//! Layout: `tokens` (u32 `[n]`, the prompt the state follows), `layers.{i}.conv` and
//! `layers.{i}.state` for a GDN layer, `layers.{i}.keys` and `layers.{i}.values`
//! (`[1, Nkv, n, Dh]`) for an attention layer; metadata `format`, `format_version` and the
//! identity's fields. Version 2 adds the fields of what a model family keeps beside a layer's
//! state, `layers.{i}.{field}`: the family names, writes, reads and checks them
//! ([`FamilyState`]; `qwen4_exp`'s `ple_window` and `index_keys` are described in
//! `families/qwen4_exp/state.rs`).
//!
//! Version 3 makes the file unable to lie about its contents. Metadata `sha256.<tensor>`
//! holds the sha256 of each tensor's bytes (`tokens` included), checked on load: a flipped bit
//! or a changed token id is refused, naming the tensor, rather than run with a state that no
//! longer matches its tokens. The hash guards against damage and editing by mistake, not
//! against a forger, who can recompute it (the file is trusted as far as its author is).
//! Metadata `chat_template` (`true`/`false`) records whether the tokens are a chat-templated
//! prompt or raw text; the caller compares it with its own run ([`read_snapshot_header`]).
//! Versions 1 and 2 carry neither and cannot be verified: they are refused with a line that
//! says to re-create the file (it is a cache; `cache-prompt` makes it again).

use super::identity::ModelIdentity;
use super::snapshot::{LayerSnapshot, Snapshot};
use crate::cache::{FamilyState, LayerCache};
use crate::{Cache, Model};
use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The `format` metadata value of a prompt-cache file.
pub const SNAPSHOT_FORMAT: &str = "qwen-gdn-prompt-cache";
/// Bumped whenever the layout changes; the version written, and the only one read.
pub const SNAPSHOT_FORMAT_VERSION: &str = "3";
/// Versions without checksums: refused with a hint to re-create the file.
const UNVERIFIABLE_VERSIONS: [&str; 2] = ["1", "2"];
/// The metadata key of a tensor's checksum.
fn checksum_key(tensor: &str) -> String {
    format!("sha256.{tensor}")
}
/// The metadata key recording whether the tokens went through the chat template.
const CHAT_TEMPLATE_KEY: &str = "chat_template";

/// What a prompt-cache file says about itself, read from its header alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// The cached tokens are a chat-templated prompt (`cache-prompt`'s default), not raw text.
    pub chat_template: bool,
}

/// Writes the state of `cache`, which has processed exactly `tokens`, to `path` (through a
/// temporary file, so a crash never leaves half a file), recording whether the tokens are a
/// chat-templated prompt. Replaces an earlier prompt-cache file, but refuses to overwrite any
/// other file.
pub fn save_snapshot(
    path: &Path,
    tokens: &[u32],
    cache: &Cache,
    identity: &ModelIdentity,
    chat_template: bool,
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
        let (mut named, family): (Vec<(&str, Tensor)>, _) = match layer {
            LayerSnapshot::Gdn {
                conv,
                state,
                family,
                ..
            } => (
                [("conv", conv), ("state", state)]
                    .into_iter()
                    .filter_map(|(n, t)| Some((n, t.clone()?)))
                    .collect(),
                family,
            ),
            LayerSnapshot::Attention { kv, family } => (
                kv.iter()
                    .flat_map(|(k, v)| [("keys", k.clone()), ("values", v.clone())])
                    .collect(),
                family,
            ),
        };
        if let Some(family) = family {
            named.extend(family.snapshot_fields()?);
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
        (CHAT_TEMPLATE_KEY.to_string(), chat_template.to_string()),
    ]);
    for (key, value) in identity.fields() {
        metadata.insert(key.to_string(), value.to_string());
    }
    for (name, tensor) in &tensors {
        // The bytes safetensors writes: the tensor's own, little-endian, row-major.
        let bytes = safetensors::View::data(tensor);
        metadata.insert(checksum_key(name), sha256_hex(&bytes));
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
    check_header(path, &metadata)?;
    let field = |key: &str| metadata.get(key).map(String::as_str).unwrap_or("(missing)");
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
    verify_checksum(&shown, &metadata, "tokens", tokens_view.data())?;
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
        verify_checksum(&shown, &metadata, &name, v.data())?;
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
                family,
            } => LayerSnapshot::Gdn {
                state_dtype: *state_dtype,
                conv: Some(load(format!("layers.{i}.conv"), conv.0, conv.1.clone())?),
                state: Some(load(format!("layers.{i}.state"), state.0, state.1.clone())?),
                family: read_family(family, &tokens, i, &mut load)?,
            },
            ExpectedLayer::Attention {
                dtype,
                per_token,
                family,
            } => {
                let mut dims = per_token.clone();
                dims[2] = n;
                LayerSnapshot::Attention {
                    kv: Some((
                        load(format!("layers.{i}.keys"), *dtype, dims.clone())?,
                        load(format!("layers.{i}.values"), *dtype, dims)?,
                    )),
                    family: read_family(family, &tokens, i, &mut load)?,
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

/// Layer `i`'s family state after `tokens`, its fields read by `load` from a `fresh` one.
fn read_family(
    fresh: &Option<Box<dyn FamilyState>>,
    tokens: &[u32],
    i: usize,
    load: &mut impl FnMut(String, DType, Vec<usize>) -> Result<Tensor>,
) -> Result<Option<Box<dyn FamilyState>>> {
    let Some(fresh) = fresh else {
        return Ok(None);
    };
    let state = fresh.load_snapshot_fields(tokens, &mut |field, dtype, dims| {
        load(format!("layers.{i}.{field}"), dtype, dims.to_vec())
    })?;
    Ok(Some(state))
}

/// The header of the prompt-cache file at `path` (format, version and what it records),
/// checked without reading its tensors: cheap enough to run before a model is loaded.
pub fn read_snapshot_header(path: &Path) -> Result<SnapshotHeader> {
    let metadata = header_metadata(path)
        .with_context(|| format!("cannot read prompt cache {}", path.display()))?;
    check_header(path, &metadata)
}

/// The format, the version and the `chat_template` field of a file's metadata.
fn check_header(path: &Path, metadata: &HashMap<String, String>) -> Result<SnapshotHeader> {
    let shown = path.display();
    let field = |key: &str| metadata.get(key).map(String::as_str).unwrap_or("(missing)");
    ensure!(
        field("format") == SNAPSHOT_FORMAT,
        "{shown}: not a qwen-gdn prompt cache file (format is {})",
        field("format")
    );
    let version = field("format_version");
    ensure!(
        !UNVERIFIABLE_VERSIONS.contains(&version),
        "{shown}: prompt cache format version {version} has no checksums and cannot be \
         verified; re-create it with `qwen-gdn cache-prompt`"
    );
    ensure!(
        version == SNAPSHOT_FORMAT_VERSION,
        "{shown}: prompt cache format version {version}, this qwen-gdn reads version \
         {SNAPSHOT_FORMAT_VERSION}"
    );
    let chat_template = match field(CHAT_TEMPLATE_KEY) {
        "true" => true,
        "false" => false,
        other => bail!("{shown}: `{CHAT_TEMPLATE_KEY}` is {other}, expected true or false"),
    };
    Ok(SnapshotHeader { chat_template })
}

/// An error naming the file and the tensor unless `data` hashes to the checksum stored for
/// `name`.
fn verify_checksum(
    shown: &std::path::Display<'_>,
    metadata: &HashMap<String, String>,
    name: &str,
    data: &[u8],
) -> Result<()> {
    let what = if name == "tokens" {
        "the token ids".to_string()
    } else {
        format!("tensor `{name}`")
    };
    let Some(stored) = metadata.get(&checksum_key(name)) else {
        bail!("{shown}: {what} has no checksum (`{}`)", checksum_key(name));
    };
    ensure!(
        *stored == sha256_hex(data),
        "{shown}: checksum mismatch in {what}: the file is damaged; re-create it with \
         `qwen-gdn cache-prompt`"
    );
    Ok(())
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
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
        /// The family's fresh state of this layer, which reads its own fields.
        family: Option<Box<dyn FamilyState>>,
    },
    /// Key (and value) dtype and dims for one position.
    Attention {
        dtype: DType,
        per_token: Vec<usize>,
        family: Option<Box<dyn FamilyState>>,
    },
}

impl ExpectedShapes {
    fn of(model: &Model) -> Result<Self> {
        let fresh = model.new_cache();
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
        let layers = probe
            .layers
            .iter()
            .zip(fresh.layers)
            .map(|(layer, fresh)| -> Result<ExpectedLayer> {
                Ok(match (layer, fresh) {
                    (LayerCache::Gdn(c), LayerCache::Gdn(fresh)) => ExpectedLayer::Gdn {
                        state_dtype: c.state_dtype,
                        conv: shape(&c.conv)?,
                        state: shape(&c.state)?,
                        family: fresh.family,
                    },
                    (LayerCache::Attention(c), LayerCache::Attention(fresh)) => {
                        let (dtype, per_token) = shape(&c.keys())?;
                        ExpectedLayer::Attention {
                            dtype,
                            per_token,
                            family: fresh.family,
                        }
                    }
                    _ => bail!("a layer's cache changed kind after one token"),
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
        let family_bytes =
            |f: &Option<Box<dyn FamilyState>>| f.as_ref().map_or(0, |f| f.max_field_bytes(tokens));
        let layers: u64 = self
            .layers
            .iter()
            .map(|layer| match layer {
                ExpectedLayer::Gdn {
                    conv,
                    state,
                    family,
                    ..
                } => bytes(conv) + bytes(state) + family_bytes(family),
                ExpectedLayer::Attention {
                    dtype,
                    per_token,
                    family,
                } => 2 * bytes(&(*dtype, per_token.clone())) * tokens as u64 + family_bytes(family),
            })
            .sum();
        layers + 4 * tokens as u64 + (1 << 20)
    }
}

/// Whether `path` is a prompt-cache file (of any version), reading only its header.
fn is_prompt_cache_file(path: &Path) -> Result<()> {
    let metadata = header_metadata(path)?;
    ensure!(metadata.get("format").map(String::as_str) == Some(SNAPSHOT_FORMAT));
    Ok(())
}

/// The metadata of the safetensors file at `path`, reading only its header.
fn header_metadata(path: &Path) -> Result<HashMap<String, String>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .context("not a valid safetensors file: shorter than its header")?;
    let n = u64::from_le_bytes(len);
    ensure!(
        n <= MAX_HEADER,
        "not a valid safetensors file: a header of {n} bytes"
    );
    let mut header = vec![0; n as usize];
    file.read_exact(&mut header)
        .context("not a valid safetensors file: shorter than its header")?;
    let header: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| anyhow::anyhow!("not a valid safetensors file: {e}"))?;
    let metadata = header
        .get("__metadata__")
        .and_then(|m| m.as_object())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    Ok(metadata)
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
