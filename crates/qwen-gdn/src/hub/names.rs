//! Names that become paths in the Hugging Face cache, checked before any use.
//!
//! Revisions come from the user, commits and ETags from the server's headers, file names
//! from the repo listing and the safetensors index: all are joined onto cache folders, so a
//! `..`, an absolute path or a backslash in any of them would read or write outside the cache.

// ETags name blobs only when downloading.
#![cfg_attr(not(feature = "hub"), allow(dead_code))]

use anyhow::{bail, Result};

/// A full git commit id as the Hub writes it: 40 lowercase hex digits.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `--revision`: a commit, or a branch or tag name, which may hold `/` (`refs/pr/1` is how
/// the Hub names pull requests) and becomes `refs/<revision>` in the cache.
pub fn check_revision(revision: &str) -> Result<()> {
    if let Err(why) = relative_path(revision) {
        bail!("--revision {revision:?} is not a branch, tag or commit: it {why}");
    }
    // Characters git refuses in ref names; none can name a Hub branch.
    if let Some(c) = revision.chars().find(|c| " ~^:?*[".contains(*c)) {
        bail!("--revision {revision:?} is not a branch, tag or commit: it contains {c:?}");
    }
    Ok(())
}

/// A file of the repo (listing, safetensors index): a relative path inside the repo.
pub fn check_repo_file(name: &str) -> std::result::Result<(), String> {
    relative_path(name).map_err(|why| format!("file name {name:?} {why}"))
}

/// An ETag used as a blob's file name in `blobs/`. The Hub's are git (sha1) and LFS (sha256)
/// hashes; anything beyond letters, digits, `-` and `_` (a `.`, a `/`) is refused, which also
/// keeps blobs apart from our `.incomplete` and `.lock` files beside them.
pub fn check_blob_name(etag: &str) -> std::result::Result<(), String> {
    let legal = !etag.is_empty()
        && etag.len() <= 128
        && etag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if legal {
        Ok(())
    } else {
        Err(format!(
            "ETag {etag:?} cannot name a blob (only letters, digits, '-' and '_')"
        ))
    }
}

/// The ETag header's value without quotes or the weak marker; a sha256 when the file is
/// stored in LFS.
pub fn unquote_etag(raw: &str) -> &str {
    let raw = raw.trim();
    let raw = raw.strip_prefix("W/").unwrap_or(raw);
    raw.trim_matches('"')
}

/// The 32 bytes of a sha256 ETag (64 hex digits), which the content must hash to.
pub fn sha256_of_etag(etag: &str) -> Option<[u8; 32]> {
    if etag.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(etag.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Why `s` is not a plain relative path of `/`-separated names, if it is not.
fn relative_path(s: &str) -> std::result::Result<(), &'static str> {
    if s.is_empty() {
        return Err("is empty");
    }
    if s.contains('\\') {
        return Err("contains a backslash");
    }
    if s.starts_with('/') {
        return Err("is an absolute path");
    }
    if s.chars().any(char::is_control) {
        return Err("contains a control character");
    }
    for part in s.split('/') {
        match part {
            "" => return Err("has an empty path component"),
            "." | ".." => return Err("has a `.` or `..` path component"),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits() {
        assert!(is_commit("0123456789abcdef0123456789abcdef01234567"));
        for s in [
            "0123456789abcdef0123456789abcdef0123456",
            "0123456789ABCDEF0123456789abcdef01234567",
            "../../../../tmp/x",
            "",
        ] {
            assert!(!is_commit(s), "{s}");
        }
    }

    #[test]
    fn revisions() {
        for ok in ["main", "v1.0", "refs/pr/1", "my-branch_2"] {
            check_revision(ok).unwrap();
        }
        for bad in [
            "", "..", "../../..", "/etc", "a\\b", "a/../b", "a//b", "a/", "./a", "a b", "a:b",
            "a\nb",
        ] {
            assert!(check_revision(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn repo_files() {
        for ok in ["config.json", "sub/dir/model-00001-of-00002.safetensors"] {
            check_repo_file(ok).unwrap();
        }
        for bad in ["../x", "a/../../x", "/tmp/x", "a\\..\\x", "", "a/./b"] {
            assert!(check_repo_file(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn blob_names() {
        check_blob_name("a1b2c3-d4_e5").unwrap();
        for bad in ["", "../../x", "a.lock", "a/b", ".", &"f".repeat(129)] {
            assert!(check_blob_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(unquote_etag(" W/\"abc\" "), "abc");
    }

    #[test]
    fn sha256_etags() {
        let hex = "00ff".repeat(16);
        let bytes = sha256_of_etag(&hex).unwrap();
        assert_eq!((bytes[0], bytes[1], bytes[31]), (0x00, 0xff, 0xff));
        assert!(sha256_of_etag(&"0".repeat(40)).is_none());
        assert!(sha256_of_etag(&"zz".repeat(32)).is_none());
    }
}
