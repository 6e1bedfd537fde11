//! Which model a saved snapshot belongs to. A snapshot is only meaningful for the weights,
//! configuration and dtypes that produced it; loading it into anything else would generate
//! garbage silently.

use crate::Model;
use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// sha256 of config.json's bytes.
    pub config_sha256: String,
    /// sha256 of the checkpoint's weight file list: every `*.safetensors` name and size, and
    /// the safetensors index's bytes (hashing gigabytes of weights on every load would be
    /// slow; a re-quantized or re-converted checkpoint changes names or sizes).
    pub checkpoint_sha256: String,
    /// Storage dtype of the GDN recurrent states (`f32` or `bf16`).
    pub state_dtype: String,
    /// Activation dtype (`f32`, `bf16`, `f16`).
    pub compute_dtype: String,
}

impl ModelIdentity {
    /// The identity of `model`, loaded from the checkpoint folder `dir`.
    pub fn of(dir: &Path, model: &Model) -> Result<Self> {
        let config = dir.join("config.json");
        let config_bytes =
            std::fs::read(&config).with_context(|| format!("cannot read {}", config.display()))?;
        Ok(Self {
            config_sha256: hex(&Sha256::digest(&config_bytes)),
            checkpoint_sha256: checkpoint_hash(dir)?,
            state_dtype: dtype_name(model.gdn_state_dtype().dtype()),
            compute_dtype: dtype_name(model.dtype()),
        })
    }

    /// (field name, value) in the order they are stored and compared.
    pub fn fields(&self) -> [(&'static str, &str); 4] {
        [
            ("config_sha256", &self.config_sha256),
            ("checkpoint_sha256", &self.checkpoint_sha256),
            ("state_dtype", &self.state_dtype),
            ("compute_dtype", &self.compute_dtype),
        ]
    }
}

fn checkpoint_hash(dir: &Path) -> Result<String> {
    let mut files = BTreeMap::new();
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json") {
            // Through symlinks: the Hub cache links every file to a blob.
            let meta = std::fs::metadata(entry.path())
                .with_context(|| format!("cannot read {}", entry.path().display()))?;
            files.insert(name, meta.len());
        }
    }
    let mut hasher = Sha256::new();
    for (name, size) in &files {
        hasher.update(format!("{name}\t{size}\n").as_bytes());
        if name.ends_with(".index.json") {
            let path = dir.join(name);
            let bytes =
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            hasher.update(&bytes);
        }
    }
    Ok(hex(&hasher.finalize()))
}

pub(crate) fn dtype_name(dtype: candle_core::DType) -> String {
    dtype.as_str().to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
