//! Files the CLI writes appear whole or not at all: the bytes go to a temporary file in the
//! same folder, which is synced and then renamed over the name. A write that fails (a full
//! disk, a size limit) removes the temporary file, so it leaves nothing behind and a retry
//! under the same name works.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;
use tempfile::NamedTempFile;

/// Writes `bytes` to `path`, which must not exist yet: an existing file, of the user's or
/// not, is never replaced (the final rename refuses it atomically).
pub fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let file = written_temporary(path, bytes)?;
    file.persist_noclobber(path)
        .map_err(|e| match e.error.kind() {
            std::io::ErrorKind::AlreadyExists => anyhow::anyhow!(
                "{} already exists; not overwritten (choose another name)",
                path.display()
            ),
            _ => anyhow::Error::new(e.error).context(format!("cannot write {}", path.display())),
        })?;
    Ok(())
}

/// Writes `bytes` to `path`, replacing what is there in one step.
pub fn write_replacing(path: &Path, bytes: &[u8]) -> Result<()> {
    let file = written_temporary(path, bytes)?;
    file.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// A temporary file beside `path` holding `bytes`, synced to the disk. Dropped (on an
/// error), it is removed.
fn written_temporary(path: &Path, bytes: &[u8]) -> Result<NamedTempFile> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(path.file_name().unwrap_or_default());
    prefix.push(".");
    let mut file = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a file in {}", dir.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.as_file().sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_files_never_replace_and_replacing_ones_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_new(&path, b"one").unwrap();
        let err = write_new(&path, b"two").unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        write_replacing(&path, b"three").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"three");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "a temporary file was left: {names:?}");
    }
}
