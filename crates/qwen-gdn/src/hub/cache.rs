//! One repo in the Hugging Face cache, laid out as huggingface_hub does so that mlx-lm and
//! huggingface-cli share it: `blobs/<etag>` holds each file's bytes once,
//! `snapshots/<commit>/<file>` links to its blob, `refs/<revision>` holds a commit id.
//!
//! Every name joined onto these folders has been checked by [`super::names`]; a ref file read
//! back from the disk is checked again, since an older client may have written anything there.

// Writing to the cache serves downloads only.
#![cfg_attr(not(feature = "hub"), allow(dead_code))]

use super::names::{check_revision, is_commit};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

pub struct RepoCache {
    root: PathBuf,
}

impl RepoCache {
    /// `models--org--name` under the cache folder; `repo` is an `org/name` id.
    pub fn new(cache: &Path, repo: &str) -> Self {
        Self {
            root: cache.join(format!("models--{}", repo.replace('/', "--"))),
        }
    }

    /// The commit `revision` is: itself when it is a commit id, else what its ref holds
    /// (`None` when there is no ref yet).
    pub fn commit_of(&self, revision: &str) -> Result<Option<String>> {
        check_revision(revision)?;
        if is_commit(revision) {
            return Ok(Some(revision.to_string()));
        }
        let path = self.root.join("refs").join(revision);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let commit = text.trim();
        if !is_commit(commit) {
            bail!(
                "{} holds {commit:?}, which is not a commit id; delete the file",
                path.display()
            );
        }
        Ok(Some(commit.to_string()))
    }

    /// Points `refs/<revision>` at `commit`, atomically (a reader never sees half a ref).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        check_revision(revision)?;
        assert!(is_commit(commit), "callers pass checked commits");
        if is_commit(revision) {
            return Ok(());
        }
        let path = self.root.join("refs").join(revision);
        write_atomically(&path, commit.as_bytes())
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        debug_assert!(is_commit(commit));
        self.root.join("snapshots").join(commit)
    }

    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }

    /// `snapshots/<commit>/<file>` → `../../blobs/<etag>` (relative, as huggingface_hub makes
    /// them, so the cache can be moved). Replaces an existing link atomically.
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf> {
        let path = self.snapshot(commit).join(file);
        let parent = path.parent().context("a snapshot file has a folder")?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let up = "../".repeat(2 + file.matches('/').count());
        let target = PathBuf::from(format!("{up}blobs/{etag}"));
        let tmp = tmp_sibling(&path);
        let _ = std::fs::remove_file(&tmp);
        let linked = make_link(&target, &self.blobs().join(etag), &tmp)
            .with_context(|| format!("cannot link {} to its blob", path.display()))
            .and_then(|()| {
                std::fs::rename(&tmp, &path)
                    .with_context(|| format!("cannot move {} into place", path.display()))
            });
        if linked.is_err() {
            // A copied blob (without symlinks) may be partial.
            let _ = std::fs::remove_file(&tmp);
        }
        linked.map(|()| path)
    }
}

#[cfg(unix)]
fn make_link(relative: &Path, _blob: &Path, at: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(relative, at)
}

/// Without symlinks (Windows without developer mode) huggingface_hub copies the blob.
#[cfg(not(unix))]
fn make_link(_relative: &Path, blob: &Path, at: &Path) -> std::io::Result<()> {
    std::fs::copy(blob, at).map(|_| ())
}

/// A name beside `path` that no other writer uses.
fn tmp_sibling(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let parent = path.parent().context("a ref has a folder")?;
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    crate::atomic_file::write_replacing(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn refs_and_links_stay_inside_the_repo_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = RepoCache::new(tmp.path(), "org/name");
        assert_eq!(cache.commit_of("main").unwrap(), None);
        cache.write_ref("refs/pr/1", SHA).unwrap();
        assert_eq!(cache.commit_of("refs/pr/1").unwrap().as_deref(), Some(SHA));
        assert!(tmp
            .path()
            .join("models--org--name/refs/refs/pr/1")
            .is_file());
        assert!(cache.commit_of("../../x").is_err());
        assert!(cache.write_ref("../../x", SHA).is_err());

        std::fs::create_dir_all(cache.blobs()).unwrap();
        std::fs::write(cache.blobs().join("abc"), "data").unwrap();
        let linked = cache.link(SHA, "sub/file.json", "abc").unwrap();
        assert_eq!(std::fs::read_to_string(&linked).unwrap(), "data");
        #[cfg(unix)]
        assert_eq!(
            std::fs::read_link(&linked).unwrap(),
            Path::new("../../../blobs/abc")
        );
    }

    #[test]
    fn a_poisoned_ref_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = RepoCache::new(tmp.path(), "org/name");
        let refs = tmp.path().join("models--org--name/refs");
        std::fs::create_dir_all(&refs).unwrap();
        std::fs::write(refs.join("main"), "../../../../tmp/x").unwrap();
        let err = format!("{:#}", cache.commit_of("main").unwrap_err());
        assert!(err.contains("not a commit id"), "{err}");
    }
}
