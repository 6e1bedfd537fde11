//! `--mtp-from <repo>`: the MTP head of a checkpoint served by a fake Hub on localhost is
//! fetched by byte range only (the index, two header ranges and the head's tensors of the one
//! shard that holds them), assembled, cached, and gives the text and acceptance of the head
//! loaded locally; a tampered or short range is refused in one line; a repo without a head
//! lets generation go on without speculation. Qwen3.5's head and Qwen3.8-Flash-Next's
//! (`qwen4_exp`: its own layout, an fc per hyper-connection stream and a mixer of its own) go
//! the same way.
#![cfg(feature = "hub")]

mod common;
use common::fake_hub::*;
use common::*;
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

/// The MTP fixtures served: Qwen3.5's head, and Qwen3.8-Flash-Next's.
const QWEN35: &str = "qwen3.5-mtp-tiny-hf";
const QWEN4_EXP: &str = "qwen4-exp-mtp-tiny-hf";
const SHARD1: &str = "model-00001-of-00002.safetensors";
const SHARD2: &str = "model-00002-of-00002.safetensors";
const PROMPT: [&str; 4] = ["--prompt", "Tell me about the sea.", "--max-tokens", "32"];

fn source_dir(source: &str) -> PathBuf {
    repo_root().join("models/mtp").join(source)
}

fn is_mtp(name: &str) -> bool {
    name.starts_with("mtp.")
}

/// The fixture's tensors as (name, dtype, shape, bytes).
fn tensors(source: &str) -> Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(source_dir(source).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn serialize(tensors: &[&(String, safetensors::Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// The fixture as a sharded Hub repo: shard 1 holds half the main model's tensors, shard 2
/// the other half and the head. Returns the files and the head's tensor bytes.
fn sharded_repo(source: &str) -> (BTreeMap<String, Vec<u8>>, u64) {
    let all = tensors(source);
    let main: Vec<_> = all.iter().filter(|t| !is_mtp(&t.0)).collect();
    let head: Vec<_> = all.iter().filter(|t| is_mtp(&t.0)).collect();
    let (first, rest) = main.split_at(main.len() / 2);
    let second: Vec<_> = rest.iter().chain(head.iter()).copied().collect();
    let mut map = serde_json::Map::new();
    for t in first {
        map.insert(t.0.clone(), SHARD1.into());
    }
    for t in &second {
        map.insert(t.0.clone(), SHARD2.into());
    }
    let mut files = BTreeMap::new();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        files.insert(
            f.to_string(),
            std::fs::read(source_dir(source).join(f)).unwrap(),
        );
    }
    files.insert(SHARD1.into(), serialize(first));
    files.insert(SHARD2.into(), serialize(&second));
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    files.insert(
        "model.safetensors.index.json".into(),
        index.to_string().into_bytes(),
    );
    let head_bytes = head.iter().map(|t| t.3.len() as u64).sum();
    (files, head_bytes)
}

/// The fixture without its head, as an mlx-lm conversion would be: a local folder.
fn headless_copy(tmp: &Path, source: &str) -> PathBuf {
    let dir = tmp.join("headless");
    copy_dir(&source_dir(source), &dir);
    let all = tensors(source);
    let main: Vec<_> = all.iter().filter(|t| !is_mtp(&t.0)).collect();
    std::fs::write(dir.join("model.safetensors"), serialize(&main)).unwrap();
    dir
}

fn generate_with(home: &Path, hub: &FakeHub, model: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["generate", "--model", model.to_str().unwrap()];
    args.extend(PROMPT);
    args.extend(extra);
    let mut cmd = command(&args);
    cmd.env("HF_HOME", home)
        .env("HF_HUB_OFFLINE", "0")
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HUB_ETAG_TIMEOUT", "5")
        .env("HF_HUB_DOWNLOAD_TIMEOUT", "5");
    cmd.output().unwrap()
}

fn speculative_line(out: &Output) -> String {
    let err = stderr(out);
    err.lines()
        .find(|l| l.starts_with("Speculative: "))
        .unwrap_or_else(|| panic!("no stats line in {err}"))
        .to_string()
}

/// `(first, last)` of every ranged GET, and whether any GET had no range.
fn ranges_requested(hub: &FakeHub) -> (Vec<(String, u64, u64)>, Vec<String>) {
    let mut ranged = Vec::new();
    let mut whole = Vec::new();
    for r in hub.requests() {
        let mut parts = r.split(' ');
        let (method, path, range) = (parts.next().unwrap(), parts.next().unwrap(), parts.next());
        if method != "GET" || !path.starts_with("/cdn/") {
            continue;
        }
        match range.unwrap().strip_prefix("range=bytes=") {
            Some(r) => {
                let (a, b) = r.split_once('-').unwrap();
                ranged.push((path.to_string(), a.parse().unwrap(), b.parse().unwrap()));
            }
            None => whole.push(r.clone()),
        }
    }
    (ranged, whole)
}

/// A Hub run of `source`'s head, fetched by range into `home`'s cache for the fixture without
/// its head, already checked against the head loaded from its own folder (`local`).
struct HubHead {
    local: Output,
    files: BTreeMap<String, Vec<u8>>,
    fetched: u64,
}

/// Serves `source` as a sharded repo, runs `generate --mtp-from` on its headless copy, and
/// asserts what every source must give: the local head's text and acceptance, ranges of the
/// head's shard only (its header, then its tensors), said once with the byte count.
fn fetch_head_from_the_hub(tmp: &Path, home: &Path, source: &str) -> (HubHead, FakeHub) {
    let model = headless_copy(tmp, source);
    let (files, head_bytes) = sharded_repo(source);
    let shard2_sha = sha256_hex(&files[SHARD2]);
    let shard1_sha = sha256_hex(&files[SHARD1]);
    let shard2_header = u64::from_le_bytes(files[SHARD2][..8].try_into().unwrap());
    let hub = FakeHub::start(files.clone(), |_, _| None);

    let out = generate_with(
        home,
        &hub,
        &model,
        &["--mtp-from", REPO, "--draft-tokens", "2"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // The head loaded from its own folder gives the same text and the same acceptance.
    let local = generate(
        &source_dir(source),
        &[PROMPT.as_slice(), &["--draft-tokens", "2"]].concat(),
    );
    assert!(local.status.success(), "{}", stderr(&local));
    assert_eq!(out.stdout, local.stdout);
    assert_eq!(speculative_line(&out), speculative_line(&local));

    // Only ranges of shard 2 (the index's only shard with mtp.* tensors), never a whole file.
    let (ranged, whole) = ranges_requested(&hub);
    assert!(whole.is_empty(), "whole files fetched: {whole:?}");
    assert!(ranged
        .iter()
        .all(|(p, _, _)| *p == format!("/cdn/{shard2_sha}")));
    assert!(!hub.requests().iter().any(|r| r.contains(&shard1_sha)));
    let fetched: u64 = ranged.iter().map(|(_, a, b)| b - a + 1).sum();
    assert_eq!(ranged[0].1..=ranged[0].2, 0..=7);
    assert_eq!(ranged[1].1..=ranged[1].2, 8..=8 + shard2_header - 1);
    assert_eq!(fetched, 8 + shard2_header + head_bytes);
    assert!(fetched < files[SHARD2].len() as u64 / 2, "{fetched}");
    let said = stderr(&out);
    let said: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("fetched the MTP head"))
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains(&format!("{fetched} bytes")), "{}", said[0]);
    let head = HubHead {
        local,
        files,
        fetched,
    };
    (head, hub)
}

#[test]
fn only_the_heads_byte_ranges_are_fetched_and_the_head_works() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let model = tmp.path().join("headless");
    let (first, hub) = fetch_head_from_the_hub(tmp.path(), &home, QWEN35);
    let HubHead {
        local,
        files,
        fetched,
        ..
    } = first;
    let shard2_sha = sha256_hex(&files[SHARD2]);
    let with_head_from_the_hub = || {
        let out = generate_with(
            &home,
            &hub,
            &model,
            &["--mtp-from", REPO, "--draft-tokens", "2"],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        out
    };

    // Cached: the next run (and an offline one) fetches nothing and says nothing.
    hub.clear_requests();
    let again = with_head_from_the_hub();
    assert_eq!(again.stdout, local.stdout);
    assert!(ranges_requested(&hub).0.is_empty());
    assert!(!stderr(&again).contains("fetched the MTP head"));
    let mut offline = command(
        &[
            &["generate", "--model", model.to_str().unwrap()],
            PROMPT.as_slice(),
            &["--mtp-from", REPO, "--draft-tokens", "2"],
        ]
        .concat(),
    );
    let offline = offline
        .env("HF_HOME", &home)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(offline.status.success(), "{}", stderr(&offline));
    assert_eq!(offline.stdout, local.stdout);

    // The cache holds the assembled head under its sha256, and the record of its ranges.
    let snapshot = home
        .join("hub/models--test-org--tiny/snapshots")
        .join(COMMIT)
        .join("mtp-head");
    let head = std::fs::read(snapshot.join("model.safetensors")).unwrap();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(snapshot.join("ranges.json")).unwrap()).unwrap();
    assert_eq!(record["sha256"], sha256_hex(&head));
    assert_eq!(record["size"], head.len() as u64);
    assert_eq!(record["fetched"], fetched);
    assert_eq!(record["shards"][0]["file"], SHARD2);
    assert_eq!(record["shards"][0]["etag"], shard2_sha);
}

/// A fault on the head's tensor ranges (not the headers, which are bytes 0..8+header).
fn tampering(kind: &'static str) -> FakeHub {
    let (files, _) = sharded_repo(QWEN35);
    FakeHub::start(files, move |req, served| {
        let range = req.header("range")?.strip_prefix("bytes=")?;
        let first: usize = range.split_once('-')?.0.parse().ok()?;
        if !req.is_cdn() || first <= 8 {
            return None;
        }
        let mut reply = served.answer(req);
        match kind {
            "shifted" => {
                let (a, b) = range.split_once('-').unwrap();
                let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
                let total = reply.headers[0].1.rsplit('/').next().unwrap().to_string();
                reply.set_header(
                    "Content-Range",
                    &format!("bytes {}-{}/{total}", a + 1, b + 1),
                );
            }
            "short" => {
                reply.body.pop();
                reply.length = Length::Actual;
            }
            "whole" => {
                reply.status = 200;
                reply.headers.clear();
            }
            _ => unreachable!(),
        }
        Some(reply)
    })
}

#[test]
fn a_tampered_or_short_range_is_refused_in_one_line() {
    for (kind, needle) in [
        ("shifted", "Content-Range"),
        ("short", "Content-Length"),
        ("whole", "not 206"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let model = headless_copy(tmp.path(), QWEN35);
        let hub = tampering(kind);
        let out = generate_with(&home, &hub, &model, &["--mtp-from", REPO]);
        assert!(!out.status.success(), "{kind}: accepted");
        let err = stderr(&out);
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(lines.len(), 1, "{kind}: {err}");
        assert!(lines[0].contains(needle), "{kind}: {err}");
        assert!(lines[0].contains("not cached"), "{kind}: {err}");
        // Nothing assembled stays in the cache.
        let snapshot = home
            .join("hub/models--test-org--tiny/snapshots")
            .join(COMMIT);
        assert!(!snapshot.join("mtp-head").exists(), "{kind}");
        let blobs = home.join("hub/models--test-org--tiny/blobs");
        let left: Vec<_> = std::fs::read_dir(&blobs)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("mtp-head") && !n.ends_with(".lock"))
            .collect();
        assert!(left.is_empty(), "{kind}: {left:?}");
    }
}

#[test]
fn a_repo_without_a_head_goes_on_without_speculation_unless_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let model = headless_copy(tmp.path(), QWEN35);
    // Served from a single model.safetensors without an index.
    let hub = FakeHub::serving(&model);
    let plain = generate(&model, PROMPT.as_slice());
    let out = generate_with(&home, &hub, &model, &["--mtp-from", REPO]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, plain.stdout);
    let err = stderr(&out);
    let said: Vec<&str> = err.lines().filter(|l| l.contains("no MTP head")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(!err.contains("Speculative: "), "{err}");
    let (ranged, whole) = ranges_requested(&hub);
    assert!(
        whole.is_empty() && ranged.len() == 2,
        "{ranged:?} {whole:?}"
    );

    let out = generate_with(
        &home,
        &hub,
        &model,
        &["--mtp-from", REPO, "--draft-tokens", "2"],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("no MTP head") && lines[0].contains("--draft-tokens"),
        "{err}"
    );
}

/// Qwen3.8-Flash-Next's head (its own layout: an fc per hyper-connection stream, a QSA + MoE
/// layer and a mixer of its own) comes from a Hub repo the same way: only its shard's header
/// and tensors are fetched, and it gives the text and acceptance of the head loaded locally.
#[test]
fn the_qwen4_exp_head_is_fetched_by_range_and_works() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    fetch_head_from_the_hub(tmp.path(), &home, QWEN4_EXP);
}

/// mlx-vlm's separate drafter of Qwen3.8-Flash-Next's head as a Hub repo (the 4-bit fixture's
/// folder served): its one shard's header shows no `mtp.*` tensors and no embedding, its
/// config.json says `qwen4_exp_mtp`, so the whole (small) repo is fetched and lent as the head:
/// the text and stats line of the folder given locally, with `--mtp-from` and with
/// `--draft-model`; offline, the cached copy serves.
#[test]
fn an_mlx_vlm_drafter_repo_is_fetched_whole_and_lends_the_head() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let drafter = source_dir("qwen4-exp-mtp-tiny-drafter-4bit");
    let main = repo_root().join("models/qwen4-exp-tiny-hf");
    let hub = FakeHub::serving(&drafter);
    let local = generate(
        &main,
        &[
            PROMPT.as_slice(),
            &["--mtp-from", drafter.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(local.status.success(), "{}", stderr(&local));
    let out = generate_with(&home, &hub, &main, &["--mtp-from", REPO]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, local.stdout);
    assert_eq!(speculative_line(&out), speculative_line(&local));
    // As mlx-vlm's users type it, `--draft-model <repo>` (into an empty cache): the repo's
    // config.json, fetched first, says drafter, so it lends the head instead of being loaded as
    // a draft model.
    let out = generate_with(
        &tmp.path().join("home-draft"),
        &hub,
        &main,
        &["--draft-model", REPO],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, local.stdout);
    assert_eq!(speculative_line(&out), speculative_line(&local));
    let mut offline = command(
        &[
            ["generate", "--model", main.to_str().unwrap()].as_slice(),
            PROMPT.as_slice(),
            &["--mtp-from", REPO],
        ]
        .concat(),
    );
    offline.env("HF_HOME", &home).env("HF_HUB_OFFLINE", "1");
    let out = offline.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(speculative_line(&out), speculative_line(&local));
}
