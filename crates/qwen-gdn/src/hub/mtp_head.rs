//! `--mtp-from <repo>`: the multi-token-prediction head of a Hub checkpoint, without its
//! shards. mlx-lm's conversions drop the `mtp.*` tensors; the original checkpoint has them,
//! spread over shards of many gigabytes. From the safetensors index and each shard's header
//! (two small Range requests) we know where every `mtp.*` tensor's bytes are, and fetch only
//! those ranges.
//!
//! The bytes are assembled into one safetensors file (the original keys, dtypes and shapes;
//! the tensors in the order they were fetched) and cached in the source repo's folder of the
//! Hugging Face cache, as the other downloads are: `blobs/<sha256 of the assembled file>`,
//! linked from `snapshots/<commit>/mtp-head/model.safetensors`, and beside it `ranges.json`,
//! the record of what was assembled from where (each shard's ETag and size, the byte ranges,
//! the assembled file's size and sha256). The head belongs to the source commit, not to the
//! converted model, so one cached head serves every conversion of it.
//!
//! Checks, as for every download: a ranged answer must be 206 with exactly the Content-Range
//! asked for, of a shard of the announced size, and exactly as long; an answer of the whole
//! shard (a server that ignores Range) is refused before its body is read. The assembled file
//! is written to `blobs/<…>.incomplete` under the blob lock and renamed into place only whole;
//! a cached head is reused only when its blob has the size and name its record gives.

use super::cache::RepoCache;
use super::download::{self, head, hex, parse_content_range, parse_size, Remote};
use super::http::{header, Follow, Http, Purpose};
use super::lock::BlobLock;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The folder, inside a snapshot, that holds the assembled head.
pub const HEAD_FOLDER: &str = "mtp-head";
const HEAD_FILE: &str = "model.safetensors";
const RECORD_FILE: &str = "ranges.json";
const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";
/// safetensors' own limit on a header.
const MAX_HEADER_BYTES: u64 = 100 << 20;

/// What [`fetch`] found.
pub enum Head {
    /// The folder holding the head (`mtp-head/` of the snapshot).
    Found(PathBuf),
    /// The repo has no `mtp.*` tensors.
    Absent,
    /// No `mtp.*` tensors and no embedding either: not a whole model, perhaps mlx-vlm's
    /// separate drafter (its head's tensors without the prefix; its config.json says).
    NotAModel,
}

/// `ranges.json`: what the cached head was assembled from.
#[derive(Serialize, Deserialize)]
struct Record {
    repo: String,
    commit: String,
    /// The assembled file's size and sha256 (also its blob's name).
    size: u64,
    sha256: String,
    /// Bytes fetched, headers included.
    fetched: u64,
    shards: Vec<ShardRecord>,
}

#[derive(Serialize, Deserialize)]
struct ShardRecord {
    file: String,
    etag: String,
    size: Option<u64>,
    /// Inclusive byte ranges of the shard, as requested (headers first).
    ranges: Vec<(u64, u64)>,
}

/// One tensor of a shard's header.
#[derive(Deserialize, Serialize, Clone)]
#[serde(deny_unknown_fields)]
struct TensorEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: (u64, u64),
}

/// An `mtp.*` tensor whose bytes are at `start..end` of its shard.
struct Wanted {
    key: String,
    entry: TensorEntry,
    start: u64,
    end: u64,
}

/// `mtp.…` with only `model.` / `language_model.` before it: raw HF (`mtp.fc.weight`) and
/// MLX (`language_model.mtp.fc.weight`) spell the head so.
pub fn is_mtp_key(key: &str) -> bool {
    let parts: Vec<&str> = key.split('.').collect();
    match parts.iter().position(|p| *p == "mtp") {
        Some(at) => parts[..at]
            .iter()
            .all(|p| *p == "model" || *p == "language_model"),
        None => false,
    }
}

/// The cached head of `repo` at `commit`, when a whole one is there.
pub fn cached(cache: &RepoCache, commit: &str) -> Option<PathBuf> {
    let dir = cache.snapshot(commit).join(HEAD_FOLDER);
    let record: Record =
        serde_json::from_slice(&std::fs::read(dir.join(RECORD_FILE)).ok()?).ok()?;
    let blob = cache.blobs().join(&record.sha256);
    let whole = std::fs::metadata(&blob).is_ok_and(|m| m.is_file() && m.len() == record.size);
    let linked =
        std::fs::canonicalize(dir.join(HEAD_FILE)).ok() == std::fs::canonicalize(&blob).ok();
    (whole && linked).then_some(dir)
}

/// Fetches the `mtp.*` tensors of `repo` at `commit` (whose listing holds `files`) into the
/// cache, unless a whole copy is there.
pub fn fetch(
    http: &Http,
    cache: &RepoCache,
    repo: &str,
    commit: &str,
    files: &std::collections::HashSet<String>,
) -> Result<Head> {
    if let Some(dir) = cached(cache, commit) {
        return Ok(Head::Found(dir));
    }
    // Which shards hold the head: the index says, or the one file there is.
    let shards: Vec<String> = if files.contains(INDEX) {
        let index = download::fetch(http, cache, repo, commit, INDEX)?;
        mtp_shards(&index)?
    } else if files.contains(SINGLE) {
        vec![SINGLE.to_string()]
    } else {
        bail!("{repo} has neither {INDEX} nor {SINGLE}");
    };
    let mut sources = Vec::new();
    let mut fetched = 0u64;
    let mut metadata = None;
    let mut embedding = false;
    for shard in &shards {
        let url = download::resolve_url(http, repo, commit, shard);
        let remote = head(http, &url, commit).with_context(|| format!("{repo}: {shard}"))?;
        let (header_len, tensors, meta, embeds) = read_header(http, &remote, shard)?;
        embedding |= embeds;
        fetched += 8 + header_len;
        metadata = metadata.or(meta);
        let data_start = 8 + header_len;
        let mut wanted: Vec<Wanted> = tensors
            .into_iter()
            .filter(|(key, _)| is_mtp_key(key))
            .map(|(key, entry)| Wanted {
                start: data_start + entry.data_offsets.0,
                end: data_start + entry.data_offsets.1,
                key,
                entry,
            })
            .collect();
        wanted.sort_by_key(|w| w.start);
        if let (Some(last), Some(size)) = (wanted.last(), remote.size) {
            if last.end > size {
                bail!(
                    "{shard} of {repo}: tensor {} ends at byte {} of a {size}-byte file",
                    last.key,
                    last.end
                );
            }
        }
        sources.push((shard.clone(), remote, header_len, wanted));
    }
    let tensor_count: usize = sources.iter().map(|s| s.3.len()).sum();
    if tensor_count == 0 {
        // A sharded repo's index named no shard: a whole model without a head.
        return Ok(match embedding || shards.is_empty() {
            true => Head::Absent,
            false => Head::NotAModel,
        });
    }
    assemble(http, cache, repo, commit, sources, metadata, fetched).map(Head::Found)
}

/// The shards the index maps `mtp.*` tensors to, in first-seen order.
fn mtp_shards(index: &Path) -> Result<Vec<String>> {
    super::shard_names_of(index, is_mtp_key)
}

type Header = (
    u64,
    BTreeMap<String, TensorEntry>,
    Option<serde_json::Value>,
    bool,
);

/// The shard's header: its length, its `mtp.*` tensors, its `__metadata__`, and whether it
/// holds an embedding (`embed_tokens`: a whole model's shard).
fn read_header(http: &Http, remote: &Remote, shard: &str) -> Result<Header> {
    let mut first = Vec::new();
    get_range(http, remote, shard, 0, 7, &mut first)?;
    let len = u64::from_le_bytes(first.try_into().expect("8 bytes were checked"));
    let fits = remote.size.is_none_or(|size| 8 + len <= size);
    if len == 0 || len > MAX_HEADER_BYTES || !fits {
        bail!("{shard}: a safetensors header of {len} bytes cannot be right");
    }
    let mut text = Vec::new();
    get_range(http, remote, shard, 8, 8 + len - 1, &mut text)?;
    let mut json: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&text)
        .with_context(|| format!("{shard}: the safetensors header is not a JSON object"))?;
    let metadata = json.remove("__metadata__");
    let embedding = json.keys().any(|k| k.contains("embed_tokens."));
    let mut tensors = BTreeMap::new();
    for (key, value) in json {
        if !is_mtp_key(&key) {
            continue;
        }
        let entry: TensorEntry = serde_json::from_value(value)
            .with_context(|| format!("{shard}: tensor {key} in the header"))?;
        let bytes = dtype_bytes(&entry.dtype)
            .with_context(|| format!("{shard}: tensor {key} has dtype {}", entry.dtype))?;
        let (a, b) = entry.data_offsets;
        let want = entry.shape.iter().product::<usize>() as u64 * bytes;
        if b < a || b - a != want {
            bail!(
                "{shard}: tensor {key} spans bytes {a}..{b}, but {:?} {} takes {want}",
                entry.shape,
                entry.dtype
            );
        }
        tensors.insert(key, entry);
    }
    Ok((len, tensors, metadata, embedding))
}

fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

/// Appends bytes `first..=last` of the shard to `out`, checking the answer is exactly them.
fn get_range(
    http: &Http,
    remote: &Remote,
    shard: &str,
    first: u64,
    last: u64,
    out: &mut impl Write,
) -> Result<u64> {
    let url = &remote.location;
    let refuse = |why: String| {
        anyhow::anyhow!("{shard} from {url}, bytes {first}-{last}: {why}; not cached")
    };
    let (response, answered) = http
        .send(
            Purpose::Download,
            false,
            url,
            Some((first, Some(last))),
            Follow::All,
        )
        .map_err(|why| anyhow::anyhow!("{shard}: {why}"))?;
    let status = response.status().as_u16();
    if status != 206 {
        // A 200 is the whole shard: its body is never read.
        return Err(refuse(format!(
            "answered {status}, not 206 (partial content)"
        )));
    }
    let range = header(&response, "content-range").unwrap_or_default();
    let Some((got_first, total)) = parse_content_range(&range) else {
        return Err(refuse(format!("answered with Content-Range {range:?}")));
    };
    let expected = format!("bytes {first}-{last}/");
    if got_first != first || !range.starts_with(&expected) {
        return Err(refuse(format!("answered with Content-Range {range:?}")));
    }
    if let (Some(total), Some(size)) = (total, remote.size) {
        if total != size {
            return Err(refuse(format!(
                "the shard is {total} bytes there, but {size} were announced"
            )));
        }
    }
    let want = last - first + 1;
    if let Some(length) = header(&response, "content-length") {
        let length = parse_size(&length, "Content-Length", &answered)?;
        if length != want {
            return Err(refuse(format!("Content-Length is {length}")));
        }
    }
    // One byte more than asked tells an overlong body from a whole one.
    let body = response.into_body().into_reader().take(want + 1);
    let mut got = 0u64;
    let read = http.read_body(body, |chunk| {
        got += chunk.len() as u64;
        if got > want {
            return Err(refuse(format!("sent more than the {want} bytes asked for")));
        }
        Ok(out.write_all(chunk)?)
    })?;
    if let Err((why, before)) = read {
        return Err(refuse(format!("{why} after {before} bytes")));
    }
    if got != want {
        return Err(refuse(format!("sent {got} of the {want} bytes asked for")));
    }
    Ok(got)
}

/// A writer that hashes what it writes.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes the head's safetensors file (header, then each run of contiguous tensors fetched in
/// one request), checks it, and places it in the cache with its record.
fn assemble(
    http: &Http,
    cache: &RepoCache,
    repo: &str,
    commit: &str,
    sources: Vec<(String, Remote, u64, Vec<Wanted>)>,
    metadata: Option<serde_json::Value>,
    mut fetched: u64,
) -> Result<PathBuf> {
    // The new header: the tensors in fetch order, packed.
    let mut header = serde_json::Map::new();
    if let Some(meta) = metadata {
        header.insert("__metadata__".into(), meta);
    }
    let mut offset = 0u64;
    for (_, _, _, wanted) in &sources {
        for w in wanted {
            let mut entry = w.entry.clone();
            let len = w.end - w.start;
            entry.data_offsets = (offset, offset + len);
            offset += len;
            header.insert(w.key.clone(), serde_json::to_value(entry)?);
        }
    }
    let mut header = serde_json::to_vec(&header)?;
    // safetensors pads the header with spaces to a multiple of 8.
    header.resize(header.len().next_multiple_of(8), b' ');
    let size = 8 + header.len() as u64 + offset;

    let blobs = cache.blobs();
    std::fs::create_dir_all(&blobs)
        .with_context(|| format!("cannot create {}", blobs.display()))?;
    let name = format!("mtp-head-{}", &commit[..12]);
    let incomplete = blobs.join(format!("{name}.incomplete"));
    let _lock = BlobLock::acquire(&blobs.join(format!("{name}.lock")), || {})?;
    let file = std::fs::File::create(&incomplete)
        .with_context(|| format!("cannot write {}", incomplete.display()))?;
    let mut out = Hashing {
        inner: std::io::BufWriter::new(file),
        hasher: Sha256::new(),
        written: 0,
    };
    let bar = crate::ui::progress::bytes(Some(size), format!("MTP head of {repo}"));
    let mut written = || -> Result<Vec<ShardRecord>> {
        out.write_all(&(header.len() as u64).to_le_bytes())?;
        out.write_all(&header)?;
        let mut records = Vec::new();
        for (shard, remote, header_len, wanted) in &sources {
            let mut ranges = vec![(0, 7), (8, 8 + header_len - 1)];
            for run in runs(wanted) {
                get_range(http, remote, shard, run.0, run.1 - 1, &mut out)?;
                ranges.push((run.0, run.1 - 1));
                fetched += run.1 - run.0;
                bar.set_position(out.written);
            }
            records.push(ShardRecord {
                file: shard.clone(),
                etag: remote.etag.clone(),
                size: remote.size,
                ranges,
            });
        }
        out.flush()?;
        Ok(records)
    };
    let records = written();
    bar.finish_and_clear();
    let records = match records {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&incomplete);
            return Err(e);
        }
    };
    let Hashing {
        inner,
        hasher,
        written,
    } = out;
    inner
        .into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .with_context(|| format!("cannot write {}", incomplete.display()))?;
    if written != size {
        let _ = std::fs::remove_file(&incomplete);
        bail!("the assembled MTP head of {repo} is {written} bytes, not {size}; not cached");
    }
    let sha256 = hex(&hasher.finalize());
    let blob = blobs.join(&sha256);
    std::fs::rename(&incomplete, &blob)
        .with_context(|| format!("cannot move {} into place", blob.display()))?;
    let file = format!("{HEAD_FOLDER}/{HEAD_FILE}");
    let linked = cache.link(commit, &file, &sha256)?;
    let dir = linked
        .parent()
        .context("the head has a folder")?
        .to_path_buf();
    let record = Record {
        repo: repo.to_string(),
        commit: commit.to_string(),
        size,
        sha256,
        fetched,
        shards: records,
    };
    crate::atomic_file::write_replacing(
        &dir.join(RECORD_FILE),
        &serde_json::to_vec_pretty(&record)?,
    )?;
    let ranges: usize = record.shards.iter().map(|s| s.ranges.len()).sum();
    eprintln!(
        "qwen-gdn: fetched the MTP head of {repo}: {fetched} bytes in {ranges} ranges of {} \
         shard(s), cached in {}",
        record.shards.len(),
        dir.display()
    );
    Ok(dir)
}

/// Byte runs `[start, end)` of the shard covering `wanted` (sorted), contiguous tensors merged.
fn runs(wanted: &[Wanted]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for w in wanted {
        match runs.last_mut() {
            Some(run) if run.1 == w.start => run.1 = w.end,
            _ => runs.push((w.start, w.end)),
        }
    }
    runs
}
