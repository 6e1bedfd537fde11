//! The files a checkpoint folder is made of, checked before any is opened or read.
//!
//! A checkpoint is untrusted input: a name in `model.safetensors.index.json` must stay inside
//! the folder (no `..`, no absolute path), every file must be a regular file (opening a FIFO
//! blocks forever, reading `/dev/zero` never ends), and a symlink must resolve into the folder
//! or, for a snapshot of the Hugging Face cache, into that repo's `blobs/`
//! (`models--org--name/snapshots/<commit>/file -> ../../blobs/<hash>`; also one folder down,
//! where `--mtp-from` caches a head).

use anyhow::{anyhow, bail, Context, Result};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// JSON side files (config, index) larger than this are not model metadata.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// A model folder and the places its files may resolve to.
pub struct ModelFolder {
    dir: PathBuf,
    /// Canonical folder, and the cache's `blobs/` when the folder is a snapshot.
    roots: Vec<PathBuf>,
}

impl ModelFolder {
    pub fn new(dir: &Path) -> Result<Self> {
        let canonical = dir
            .canonicalize()
            .with_context(|| format!("{}: cannot open model folder", dir.display()))?;
        let mut roots = vec![canonical.clone()];
        // A snapshot, or a folder of one (the MTP head `--mtp-from` assembles:
        // `snapshots/<commit>/mtp-head/`).
        let snapshots = [
            canonical.parent(),
            canonical.parent().and_then(Path::parent),
        ]
        .into_iter()
        .flatten()
        .find(|p| p.file_name() == Some("snapshots".as_ref()));
        if let Some(snapshots) = snapshots {
            let blobs = snapshots.parent().map(|repo| repo.join("blobs"));
            if let Some(blobs) = blobs.and_then(|b| b.canonicalize().ok()) {
                roots.push(blobs);
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            roots,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `name` as listed in `listed_in` (a relative path inside the folder), checked.
    pub fn listed_file(&self, name: &str, listed_in: &Path) -> Result<PathBuf> {
        let relative = Path::new(name);
        let plain = relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
        if name.is_empty() || !plain {
            bail!(
                "{}: shard path {name:?} leaves the model folder (only plain relative names are allowed)",
                listed_in.display()
            );
        }
        let path = self.dir.join(relative);
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                "{}: missing shard {name} listed in {}",
                path.display(),
                listed_in.display()
            ),
            _ => self.check_file(&path)?,
        }
        Ok(path)
    }

    /// Errors unless `path` is (or links to) a regular file inside the folder's roots.
    pub fn check_file(&self, path: &Path) -> Result<()> {
        let target = path
            .canonicalize()
            .with_context(|| format!("{}: cannot resolve", path.display()))?;
        if !self.roots.iter().any(|root| target.starts_with(root)) {
            bail!(
                "{}: resolves to {}, outside the model folder",
                path.display(),
                target.display()
            );
        }
        check_regular(path)
    }
}

/// Errors unless `path` (symlinks followed) is a regular file.
pub fn check_regular(path: &Path) -> Result<()> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("{}: cannot read", path.display()))?;
    if !meta.is_file() {
        bail!("{}: not a regular file", path.display());
    }
    Ok(())
}

/// The text of a JSON side file: `None` when it does not exist; an error naming it when it is
/// not a regular file or is larger than [`MAX_JSON_BYTES`].
pub fn read_json_text(path: &Path) -> Result<Option<String>> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        _ => check_regular(path)?,
    }
    let file =
        std::fs::File::open(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let mut text = String::new();
    // Reading one byte past the limit tells a file at the limit from a larger one, even when
    // the file grows after it was checked.
    file.take(MAX_JSON_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    if text.len() as u64 > MAX_JSON_BYTES {
        return Err(anyhow!(
            "{}: larger than {} MiB, not model metadata",
            path.display(),
            MAX_JSON_BYTES >> 20
        ));
    }
    Ok(Some(text))
}
