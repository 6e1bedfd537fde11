//! One file of a repo into the cache, checked before anything else can see it.
//!
//! As huggingface_hub does: a HEAD of `resolve/<commit>/<file>` gives the blob's name (the
//! ETag: a sha256 for LFS files), its size and where its bytes are; the bytes go to
//! `blobs/<etag>.incomplete` under `blobs/<etag>.lock`; only a file of the announced size
//! (and, for a sha256 ETag, the announced hash) is renamed to `blobs/<etag>` and linked from
//! the snapshot. A failed check deletes the bytes; a cut connection keeps them for the next
//! run only when a sha256 will check them.

use super::cache::RepoCache;
use super::http::{encode, header, join_url, Follow, Http, Purpose};
use super::lock::BlobLock;
use super::names::{check_blob_name, is_commit, sha256_of_etag, unquote_etag};
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// What the HEAD of a file says about it.
pub struct Remote {
    /// Where the bytes are (the CDN for LFS files, else the resolve URL itself).
    pub location: String,
    pub etag: String,
    /// X-Linked-Size, or the Content-Length of a direct answer.
    pub size: Option<u64>,
}

/// Downloads `file` of `repo` at `commit` into the cache unless its blob is there already,
/// and returns its path in the snapshot.
pub fn fetch(
    http: &Http,
    cache: &RepoCache,
    repo: &str,
    commit: &str,
    file: &str,
) -> Result<PathBuf> {
    let url = resolve_url(http, repo, commit, file);
    let remote = head(http, &url, commit).with_context(|| format!("downloading {file}"))?;
    let blobs = cache.blobs();
    std::fs::create_dir_all(&blobs)
        .with_context(|| format!("cannot create {}", blobs.display()))?;
    let blob = blobs.join(&remote.etag);
    if !blob_is_whole(&blob, remote.size) {
        let incomplete = blobs.join(format!("{}.incomplete", remote.etag));
        let _lock = wait_for_lock(&blobs, &remote, &incomplete, file)?;
        // The process we waited for may have fetched it.
        if !blob_is_whole(&blob, remote.size) {
            transfer(http, &remote, file, &incomplete)?;
            std::fs::rename(&incomplete, &blob)
                .with_context(|| format!("cannot move {} into place", blob.display()))?;
        }
    }
    cache.link(commit, file, &remote.etag)
}

/// Where the Hub serves `file` of `repo` at `commit`.
pub fn resolve_url(http: &Http, repo: &str, commit: &str, file: &str) -> String {
    format!(
        "{}/{repo}/resolve/{commit}/{}",
        http.endpoint,
        encode(file, true)
    )
}

/// A blob in place was checked when it was placed; one of the wrong size was placed by a
/// client that did not check (a truncated download) and is fetched again.
fn blob_is_whole(blob: &Path, size: Option<u64>) -> bool {
    match std::fs::metadata(blob) {
        Ok(m) => m.is_file() && size.is_none_or(|s| s == m.len()),
        Err(_) => false,
    }
}

pub fn head(http: &Http, url: &str, commit: &str) -> Result<Remote> {
    let (response, answered) = http
        .send(Purpose::Metadata, true, url, None, Follow::Relative)
        .map_err(anyhow::Error::msg)?;
    let status = response.status();
    let location = if status.is_success() {
        answered.clone()
    } else if status.is_redirection() {
        // Follow::Relative stopped here: the bytes are elsewhere (the CDN).
        let to = header(&response, "location").context("a redirect has a location")?;
        join_url(&answered, &to)
            .with_context(|| format!("{answered}: cannot follow the redirect to {to:?}"))?
    } else {
        bail!("{answered} answered {status}");
    };
    if let Some(sent) = header(&response, "x-repo-commit") {
        if !is_commit(&sent) {
            bail!("{answered} sent X-Repo-Commit {sent:?}, which is not a commit id");
        }
        if sent != commit {
            bail!("{answered} is at commit {sent}, not {commit} as listed; run again");
        }
    }
    let etag = header(&response, "x-linked-etag")
        .or_else(|| header(&response, "etag"))
        .with_context(|| format!("{answered} sent no ETag (is this a Hugging Face Hub?)"))?;
    let etag = unquote_etag(&etag).to_string();
    check_blob_name(&etag).map_err(|why| anyhow::anyhow!("{answered} sent {why}"))?;
    let size = match header(&response, "x-linked-size") {
        Some(v) => Some(parse_size(&v, "X-Linked-Size", &answered)?),
        None if status.is_success() => match header(&response, "content-length") {
            Some(v) => Some(parse_size(&v, "Content-Length", &answered)?),
            None => None,
        },
        None => None,
    };
    Ok(Remote {
        location,
        etag,
        size,
    })
}

pub fn parse_size(value: &str, name: &str, url: &str) -> Result<u64> {
    value
        .parse()
        .with_context(|| format!("{url} sent {name} {value:?}, which is not a byte count"))
}

/// Takes the blob's lock; while another process holds it, shows how far its
/// `.incomplete` file has grown.
fn wait_for_lock(blobs: &Path, remote: &Remote, incomplete: &Path, file: &str) -> Result<BlobLock> {
    let lock = blobs.join(format!("{}.lock", remote.etag));
    let mut bar = None;
    let held = BlobLock::acquire(&lock, || {
        let bar = bar.get_or_insert_with(|| {
            if !crate::ui::progress::visible() {
                eprintln!(
                    "qwen-gdn: waiting for another process downloading {file} (it holds {})",
                    lock.display()
                );
            }
            crate::ui::progress::bytes(remote.size, format!("{file} (another process)"))
        });
        bar.set_position(std::fs::metadata(incomplete).map_or(0, |m| m.len()));
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    held
}

/// Brings `incomplete` to the whole file and checks it; on a failed check it is deleted.
fn transfer(http: &Http, remote: &Remote, file: &str, incomplete: &Path) -> Result<()> {
    let sha256 = sha256_of_etag(&remote.etag);
    // Only a download whose whole content a hash will check is resumed.
    let mut kept = match sha256 {
        Some(_) => std::fs::metadata(incomplete).map_or(0, |m| m.len()),
        None => 0,
    };
    if remote.size.is_some_and(|size| kept >= size) {
        kept = 0;
    }
    let url = &remote.location;
    let fail = |why: String| -> anyhow::Error {
        let _ = std::fs::remove_file(incomplete);
        anyhow::anyhow!("{file} from {url}: {why}; not cached")
    };
    let ranged = kept > 0;
    let (response, answered) = http
        .send(
            Purpose::Download,
            false,
            url,
            ranged.then_some((kept, None)),
            Follow::All,
        )
        .map_err(|why| anyhow::anyhow!("downloading {file}: {why}"))?;
    let status = response.status().as_u16();
    // Every size the answer announces; the file must match all of them.
    let mut sizes: Vec<(u64, String)> = remote
        .size
        .map(|s| (s, "the announced size".to_string()))
        .into_iter()
        .collect();
    let length = match header(&response, "content-length") {
        Some(v) => Some(parse_size(&v, "Content-Length", &answered)?),
        None => None,
    };
    let start = match status {
        200 => {
            // Also the answer to a Range request that the server ignored: start over.
            if let Some(length) = length {
                sizes.push((length, "Content-Length".to_string()));
            }
            0
        }
        206 if ranged => {
            let range = header(&response, "content-range").unwrap_or_default();
            let (first, total) = parse_content_range(&range)
                .ok_or_else(|| fail(format!("answered 206 with Content-Range {range:?}")))?;
            if first != kept {
                return Err(fail(format!(
                    "asked for bytes {kept}- and got bytes {first}-"
                )));
            }
            if let Some(total) = total {
                sizes.push((total, "Content-Range".to_string()));
            }
            if let Some(length) = length {
                sizes.push((kept + length, "Content-Length".to_string()));
            }
            kept
        }
        206 => return Err(fail("answered 206 to a request for the whole file".into())),
        416 if ranged => {
            // The kept bytes do not fit the file any more: start over once.
            std::fs::remove_file(incomplete)
                .with_context(|| format!("cannot remove {}", incomplete.display()))?;
            return transfer(http, remote, file, incomplete);
        }
        _ => return Err(fail(format!("answered {status}"))),
    };
    if sizes.is_empty() && sha256.is_none() {
        return Err(fail(
            "no Content-Length, so a cut-off body could not be told from a whole one".into(),
        ));
    }

    let mut hasher = Sha256::new();
    let mut out = if start == 0 {
        File::create(incomplete)
    } else {
        if sha256.is_some() {
            hash_file(incomplete, &mut hasher)?;
        }
        std::fs::OpenOptions::new().append(true).open(incomplete)
    }
    .with_context(|| format!("cannot write {}", incomplete.display()))?;

    let bar =
        crate::ui::progress::bytes(remote.size.or(sizes.first().map(|s| s.0)), file.to_string());
    bar.set_position(start);
    let mut got = start;
    let read = http.read_body(response.into_body().into_reader(), |chunk| {
        out.write_all(chunk)
            .with_context(|| format!("cannot write {}", incomplete.display()))?;
        if sha256.is_some() {
            hasher.update(chunk);
        }
        got += chunk.len() as u64;
        bar.set_position(got);
        Ok(())
    })?;
    if let Err((why, before)) = read {
        bar.abandon();
        if sha256.is_none() {
            let _ = std::fs::remove_file(incomplete);
        }
        let got = start + before;
        bail!("downloading {file} from {answered}: {why} after {got} bytes; not cached");
    }
    bar.finish_and_clear();
    out.sync_all()
        .with_context(|| format!("cannot write {}", incomplete.display()))?;
    drop(out);

    for (want, source) in &sizes {
        if got != *want {
            return Err(fail(format!("got {got} bytes, but {source} is {want}")));
        }
    }
    if let Some(want) = sha256 {
        let digest: [u8; 32] = hasher.finalize().into();
        if digest != want {
            return Err(fail(format!(
                "the content's sha256 {} is not its ETag {}",
                hex(&digest),
                remote.etag
            )));
        }
    }
    Ok(())
}

fn hash_file(path: &Path, hasher: &mut Sha256) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
    }
}

/// `bytes <first>-<last>/<total|*>` → (first, total).
pub fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let (range, total) = value.strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let (first, last): (u64, u64) = (first.trim().parse().ok()?, last.trim().parse().ok()?);
    if last < first {
        return None;
    }
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    Some((first, total))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges() {
        assert_eq!(parse_content_range("bytes 5-9/10"), Some((5, Some(10))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        for bad in ["bytes 9-5/10", "5-9/10", "bytes x-9/10", "bytes 5-9"] {
            assert_eq!(parse_content_range(bad), None, "{bad}");
        }
    }
}
