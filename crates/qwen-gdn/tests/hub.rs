//! `--model org/name`: the Hugging Face cache layout, HF_HUB_OFFLINE, and downloads from
//! HF_ENDPOINT (a fake Hub on localhost, since tests have no network).

mod common;

use common::*;
use std::path::Path;

const SHA: &str = "0123456789abcdef0123456789abcdef01234567";
const TEXT: &str = "Hello world, hello Hub";

fn eval(model: &str, cache: &Path, envs: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = command(&["eval", "--model", model, "--text", TEXT, "--json"]);
    cmd.env("HF_HUB_CACHE", cache).envs(envs.iter().copied());
    cmd.output().unwrap()
}

fn local_eval() -> Vec<u8> {
    let out = run(&[
        "eval",
        "--model",
        fixture("qwen3.5-tiny-4bit").to_str().unwrap(),
        "--text",
        TEXT,
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    out.stdout
}

#[test]
fn offline_cache_is_used_and_misses_are_named() {
    // huggingface_hub's layout: models--org--name/refs/main holds the commit,
    // snapshots/<commit>/ the files.
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("models--test-org--tiny");
    copy_dir(
        &fixture("qwen3.5-tiny-4bit"),
        &repo.join("snapshots").join(SHA),
    );
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), SHA).unwrap();
    let out = eval("test-org/tiny", tmp.path(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, local_eval());
    std::fs::remove_file(repo.join("snapshots").join(SHA).join("model.safetensors")).unwrap();
    let out = eval("test-org/tiny", tmp.path(), &[]);
    assert_error(
        &out,
        &[
            "model.safetensors of test-org/tiny@main",
            "HF_HUB_OFFLINE",
            "local folder",
        ],
    );
}

/// Downloads from a fake Hub (tests have no network) that answers as the real one, or
/// misbehaves in one way per test. After each, the cache must hold only whole, correct blobs
/// and nothing may have been written outside it.
#[cfg(feature = "hub")]
mod download {
    use super::*;
    use common::fake_hub::*;
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::process::Output;
    use std::time::{Duration, Instant};

    /// A temp folder whose `home/` is HF_HOME, so the cache is `home/hub`; anything else
    /// that appears in the temp folder escaped the cache.
    struct Sandbox {
        tmp: tempfile::TempDir,
    }

    impl Sandbox {
        fn new() -> Self {
            Self {
                tmp: tempfile::tempdir().unwrap(),
            }
        }

        fn home(&self) -> PathBuf {
            self.tmp.path().join("home")
        }

        fn cache(&self) -> PathBuf {
            self.home().join("hub")
        }

        fn repo(&self) -> PathBuf {
            self.cache().join("models--test-org--tiny")
        }

        fn blobs(&self) -> PathBuf {
            self.repo().join("blobs")
        }

        fn command(&self, revision: Option<&str>) -> std::process::Command {
            let mut args = vec!["eval", "--model", REPO, "--text", TEXT, "--json"];
            if let Some(revision) = revision {
                args.extend(["--revision", revision]);
            }
            let mut cmd = command(&args);
            cmd.env("HF_HOME", self.home());
            cmd
        }

        fn eval_at(&self, hub: &FakeHub, revision: Option<&str>, envs: &[(&str, &str)]) -> Output {
            let mut cmd = self.command(revision);
            // Short limits, so that a test that goes wrong fails fast rather than hangs.
            cmd.env("HF_HUB_OFFLINE", "0")
                .env("HF_ENDPOINT", &hub.endpoint)
                .env("HF_HUB_ETAG_TIMEOUT", "5")
                .env("HF_HUB_DOWNLOAD_TIMEOUT", "5")
                .envs(envs.iter().copied());
            cmd.output().unwrap()
        }

        fn eval(&self, hub: &FakeHub) -> Output {
            self.eval_at(hub, None, &[])
        }

        fn eval_offline(&self, revision: Option<&str>) -> Output {
            self.command(revision).output().unwrap()
        }

        /// The cache holds no blob that differs from what the Hub serves, every snapshot
        /// file is the served file of that name, and nothing exists outside the cache.
        fn assert_sound(&self, files: &BTreeMap<String, Vec<u8>>) {
            let cache = self.cache();
            let mut outside = Vec::new();
            walk(self.tmp.path(), &mut |p| {
                if !(cache.starts_with(p) || p.starts_with(&cache)) {
                    outside.push(p.to_path_buf());
                }
            });
            assert!(outside.is_empty(), "written outside the cache: {outside:?}");
            if let Ok(entries) = std::fs::read_dir(self.blobs()) {
                for entry in entries {
                    let path = entry.unwrap().path();
                    let name = path.file_name().unwrap().to_string_lossy().into_owned();
                    if name.ends_with(".lock") || name.ends_with(".incomplete") {
                        continue;
                    }
                    let data = std::fs::read(&path).unwrap();
                    assert!(
                        files.values().any(|f| *f == data),
                        "blob {name} is not a served file ({} bytes)",
                        data.len()
                    );
                }
            }
            let Ok(real_cache) = cache.canonicalize() else {
                return; // nothing was cached
            };
            let snapshots = self.repo().join("snapshots");
            walk(&snapshots, &mut |p| {
                if p.is_dir() {
                    return;
                }
                let commit_dir =
                    snapshots.join(p.strip_prefix(&snapshots).unwrap().iter().next().unwrap());
                let name = p
                    .strip_prefix(&commit_dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let target = p.canonicalize().unwrap();
                assert!(
                    target.starts_with(&real_cache),
                    "{} → {}",
                    p.display(),
                    target.display()
                );
                assert_eq!(
                    std::fs::read(p).ok().as_ref(),
                    files.get(&name),
                    "snapshot file {name} differs from the served one"
                );
            });
        }

        fn has_blob_for(&self, data: &[u8]) -> bool {
            let Ok(entries) = std::fs::read_dir(self.blobs()) else {
                return false;
            };
            entries.into_iter().any(|e| {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                !name.ends_with(".lock")
                    && !name.ends_with(".incomplete")
                    && std::fs::read(&p).unwrap() == data
            })
        }
    }

    /// Every path under `dir` (links not followed).
    fn walk(dir: &Path, visit: &mut dyn FnMut(&Path)) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            visit(&path);
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                walk(&path, visit);
            }
        }
    }

    fn tiny_files() -> BTreeMap<String, Vec<u8>> {
        read_folder(&fixture("qwen3.5-tiny-4bit"))
    }

    fn count(hub: &FakeHub, prefix: &str) -> usize {
        hub.requests()
            .iter()
            .filter(|r| r.starts_with(prefix))
            .count()
    }

    #[test]
    fn downloads_only_the_needed_files_into_the_hf_cache() {
        let hub = FakeHub::serving(&fixture("qwen3.5-tiny-4bit"));
        let sandbox = Sandbox::new();
        let out = sandbox.eval_at(&hub, None, &[("HF_TOKEN", "hf_test")]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(out.stdout, local_eval());
        let requests = hub.requests();
        assert!(
            requests.iter().all(|r| r.ends_with(" auth=Bearer hf_test")),
            "HF_TOKEN not sent: {requests:?}"
        );
        assert!(
            !requests.iter().any(|r| r.contains("README")),
            "fetched an unneeded file: {requests:?}"
        );
        // huggingface_hub's layout, so mlx-lm and huggingface-cli reuse what was fetched:
        // LFS blobs named by their sha256, snapshot files linking to them.
        let repo = sandbox.repo();
        assert_eq!(
            std::fs::read_to_string(repo.join("refs/main")).unwrap(),
            COMMIT
        );
        let weights = &hub.files["model.safetensors"];
        assert!(repo.join("blobs").join(sha256_hex(weights)).is_file());
        assert!(repo
            .join("snapshots")
            .join(COMMIT)
            .join("model.safetensors")
            .is_file());
        sandbox.assert_sound(&hub.files);

        // Cached now: the next run only asks for the listing, and offline needs nothing.
        hub.clear_requests();
        assert!(sandbox.eval(&hub).status.success());
        assert_eq!(hub.requests().len(), 1, "{:?}", hub.requests());
        assert!(sandbox.eval_offline(None).status.success());

        // A repo the Hub does not know, and a Hub that cannot be reached.
        let nope = |endpoint: &str| {
            let mut cmd = command(&["eval", "--model", "test-org/nope", "--text", TEXT]);
            cmd.env("HF_HOME", sandbox.home())
                .env("HF_HUB_OFFLINE", "0")
                .env("HF_ENDPOINT", endpoint);
            cmd.output().unwrap()
        };
        assert_error(&nope(&hub.endpoint), &["test-org/nope", "404", "HF_TOKEN"]);
        assert_error(
            &nope("http://127.0.0.1:9"),
            &[
                "cannot reach http://127.0.0.1:9",
                "config.json of test-org/nope@main",
                "HF_HUB_OFFLINE=1",
            ],
        );
    }

    #[test]
    fn the_token_goes_to_the_hub_only() {
        // The Hub sends the weights to a CDN on another host, as the real one does.
        let cdn = FakeHub::serving(&fixture("qwen3.5-tiny-4bit"));
        let cdn_endpoint = cdn.endpoint.clone();
        let hub = FakeHub::start(tiny_files(), move |req, hub| {
            let mut reply = hub.answer(req);
            let location = reply
                .headers
                .iter()
                .find(|(k, _)| k == "Location")?
                .1
                .clone();
            let moved = location.replacen(&hub.endpoint, &cdn_endpoint, 1);
            reply.set_header("Location", &moved);
            Some(reply)
        });
        let sandbox = Sandbox::new();
        let out = sandbox.eval_at(&hub, None, &[("HF_TOKEN", "hf_test")]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(hub
            .requests()
            .iter()
            .all(|r| r.ends_with(" auth=Bearer hf_test")));
        assert_eq!(cdn.requests().len(), 1, "{:?}", cdn.requests());
        assert!(
            cdn.requests()[0].ends_with(" auth=-"),
            "{:?}",
            cdn.requests()
        );
        sandbox.assert_sound(&hub.files);
    }

    #[test]
    fn a_body_cut_short_is_never_cached() {
        let files = tiny_files();
        let tokenizer = files["tokenizer.json"].clone();
        // Half the tokenizer, then the connection closes: with no Content-Length at all, with
        // none on the GET (the HEAD announced the size), and with one that overstates it.
        let cases: [(Length, Length, &[&str]); 3] = [
            (
                Length::Omitted,
                Length::Omitted,
                &["tokenizer.json", "no Content-Length", "not cached"],
            ),
            (
                Length::Actual,
                Length::Omitted,
                &["tokenizer.json", "bytes", "not cached"],
            ),
            (
                Length::Actual,
                Length::Declared(tokenizer.len() as u64),
                &["tokenizer.json", "not cached"],
            ),
        ];
        for (head_length, get_length, needles) in cases {
            let hub = FakeHub::start(files.clone(), move |req, hub| {
                if !req.resolves("tokenizer.json") {
                    return None;
                }
                let mut reply = hub.answer(req);
                if req.method == "HEAD" {
                    reply.length = head_length;
                } else {
                    reply.body.truncate(reply.body.len() / 2);
                    reply.length = get_length;
                }
                Some(reply)
            });
            let sandbox = Sandbox::new();
            assert_error(&sandbox.eval(&hub), needles);
            sandbox.assert_sound(&files);
            assert!(!sandbox.has_blob_for(&tokenizer[..tokenizer.len() / 2]));
            // Nothing half-fetched passes for the file later, offline either.
            assert_error(
                &sandbox.eval_offline(None),
                &["of test-org/tiny@main is not in the Hugging Face cache"],
            );
            // And a sound Hub then completes the cache.
            let good = FakeHub::serving(&fixture("qwen3.5-tiny-4bit"));
            let out = sandbox.eval(&good);
            assert!(out.status.success(), "{}", stderr(&out));
            sandbox.assert_sound(&files);
        }
    }

    /// Leaves the first half of model.safetensors as an interrupted download would.
    fn interrupted(sandbox: &Sandbox, files: &BTreeMap<String, Vec<u8>>, corrupt: bool) -> usize {
        let weights = &files["model.safetensors"];
        let mut kept = weights[..weights.len() / 2].to_vec();
        if corrupt {
            kept[100] ^= 0xff;
        }
        std::fs::create_dir_all(sandbox.blobs()).unwrap();
        let path = sandbox
            .blobs()
            .join(format!("{}.incomplete", sha256_hex(weights)));
        std::fs::write(path, &kept).unwrap();
        kept.len()
    }

    #[test]
    fn an_interrupted_download_resumes_with_a_range_request() {
        let files = tiny_files();
        let hub = FakeHub::serving(&fixture("qwen3.5-tiny-4bit"));
        let sandbox = Sandbox::new();
        let kept = interrupted(&sandbox, &files, false);
        let out = sandbox.eval(&hub);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(out.stdout, local_eval());
        assert_eq!(count(&hub, "GET /cdn/"), 1);
        assert!(
            hub.requests()
                .iter()
                .any(|r| r.contains(&format!("range=bytes={kept}-"))),
            "{:?}",
            hub.requests()
        );
        sandbox.assert_sound(&files);

        // The kept bytes are checked with the rest: a corrupt prefix fails the sha256, is
        // dropped, and the next run fetches the whole file.
        let sandbox = Sandbox::new();
        interrupted(&sandbox, &files, true);
        assert_error(
            &sandbox.eval(&hub),
            &["model.safetensors", "sha256", "not cached"],
        );
        sandbox.assert_sound(&files);
        let out = sandbox.eval(&hub);
        assert!(out.status.success(), "{}", stderr(&out));
        sandbox.assert_sound(&files);
    }

    #[test]
    fn a_range_request_answered_with_200_restarts_the_file() {
        let files = tiny_files();
        // This CDN ignores Range and sends the whole file with 200.
        let hub = FakeHub::start(files.clone(), |req, hub| {
            req.is_cdn().then(|| {
                let whole = Request {
                    method: req.method.clone(),
                    path: req.path.clone(),
                    headers: vec![],
                };
                hub.answer(&whole)
            })
        });
        let sandbox = Sandbox::new();
        let kept = interrupted(&sandbox, &files, false);
        let out = sandbox.eval(&hub);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(out.stdout, local_eval());
        assert!(hub
            .requests()
            .iter()
            .any(|r| r.contains(&format!("range=bytes={kept}-"))));
        sandbox.assert_sound(&files);
    }

    #[test]
    fn content_that_fails_its_sha256_is_never_cached() {
        let files = tiny_files();
        let hub = FakeHub::start(files.clone(), |req, hub| {
            req.is_cdn().then(|| {
                let mut reply = hub.answer(req);
                reply.body[1000] ^= 1;
                reply
            })
        });
        let sandbox = Sandbox::new();
        assert_error(
            &sandbox.eval(&hub),
            &["model.safetensors", "sha256", "not cached"],
        );
        sandbox.assert_sound(&files);
        let blobs: Vec<_> = std::fs::read_dir(sandbox.blobs())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        let sha = sha256_hex(&files["model.safetensors"]);
        assert!(
            !blobs
                .iter()
                .any(|b| b.starts_with(&sha) && !b.ends_with(".lock")),
            "{blobs:?}"
        );
    }

    const ESCAPE: &str = "../../../../escape";

    #[test]
    fn etags_and_commits_from_the_server_never_leave_the_cache() {
        let files = tiny_files();
        let cases: [(&str, &str, &str, &[&str]); 3] = [
            (
                "config.json",
                "ETag",
                "\"../../../../escape\"",
                &["config.json", "ETag", "escape"],
            ),
            (
                "model.safetensors",
                "X-Linked-Etag",
                "\"../../../../escape\"",
                &["model.safetensors", "ETag", "escape"],
            ),
            (
                "config.json",
                "X-Repo-Commit",
                ESCAPE,
                &["X-Repo-Commit", "not a commit id"],
            ),
        ];
        for (file, name, value, needles) in cases {
            let hub = FakeHub::start(files.clone(), move |req, hub| {
                req.resolves(file).then(|| {
                    let mut reply = hub.answer(req);
                    reply.set_header(name, value);
                    reply
                })
            });
            let sandbox = Sandbox::new();
            assert_error(&sandbox.eval(&hub), needles);
            sandbox.assert_sound(&files);
            assert!(!sandbox.repo().join("refs/main").exists());
        }

        // The listing's commit.
        let hub = FakeHub::start(files.clone(), |req, _| {
            req.is_listing().then(|| {
                let body = serde_json::json!({ "sha": ESCAPE, "siblings": [] });
                Reply::new(200, vec![], body.to_string().into_bytes())
            })
        });
        let sandbox = Sandbox::new();
        assert_error(&sandbox.eval(&hub), &["listing", "not a commit id"]);
        sandbox.assert_sound(&files);

        // A listing of another commit than the one asked for.
        let other = "f".repeat(40);
        let hub = FakeHub::start(files.clone(), move |req, _| {
            req.is_listing().then(|| {
                let body = serde_json::json!({ "sha": other, "siblings": [] });
                Reply::new(200, vec![], body.to_string().into_bytes())
            })
        });
        let out = sandbox.eval_at(&hub, Some(COMMIT), &[]);
        assert_error(&out, &["listed commit ffff", COMMIT]);

        // A ref poisoned by an older client is refused, not followed out of the cache.
        let outside = sandbox.tmp.path().join("escape");
        copy_dir(&fixture("qwen3.5-tiny-4bit"), &outside);
        std::fs::create_dir_all(sandbox.repo().join("refs")).unwrap();
        std::fs::create_dir_all(sandbox.repo().join("snapshots")).unwrap();
        std::fs::write(sandbox.repo().join("refs/main"), "../../../../escape").unwrap();
        assert_error(
            &sandbox.eval_offline(None),
            &["refs/main", "not a commit id"],
        );
    }

    #[test]
    fn file_names_from_the_repo_never_leave_the_cache() {
        // A listing that names a file outside the repo.
        let mut files = tiny_files();
        files.insert(format!("{ESCAPE}.json"), b"{}".to_vec());
        let hub = FakeHub::start(files.clone(), |_, _| None);
        let sandbox = Sandbox::new();
        assert_error(&sandbox.eval(&hub), &["listing", "escape.json"]);
        sandbox.assert_sound(&files);

        // A safetensors index that names a shard outside the snapshot, with a checkpoint
        // waiting there: offline, the snapshot folder is all there is to read from.
        let sandbox = Sandbox::new();
        let snapshot = sandbox.repo().join("snapshots").join(COMMIT);
        let fixture = fixture("qwen3.5-tiny-4bit");
        std::fs::create_dir_all(&snapshot).unwrap();
        for f in ["config.json", "tokenizer.json"] {
            std::fs::copy(fixture.join(f), snapshot.join(f)).unwrap();
        }
        let index =
            serde_json::json!({ "weight_map": { "w": "../../../../../escape.safetensors" } });
        std::fs::write(
            snapshot.join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        std::fs::copy(
            fixture.join("model.safetensors"),
            sandbox.tmp.path().join("escape.safetensors"),
        )
        .unwrap();
        let out = sandbox.eval_offline(Some(COMMIT));
        assert_error(
            &out,
            &["model.safetensors.index.json", "escape.safetensors"],
        );
    }

    #[test]
    fn a_stalled_server_times_out() {
        let files = tiny_files();
        // No answer to the listing: the Hub counts as unreachable.
        let hub = FakeHub::start(files.clone(), |req, _| {
            req.is_listing().then(Reply::stalled)
        });
        let sandbox = Sandbox::new();
        let start = Instant::now();
        let out = sandbox.eval_at(&hub, None, &[("HF_HUB_ETAG_TIMEOUT", "1")]);
        assert_error(&out, &["cannot reach", "HF_HUB_ETAG_TIMEOUT"]);
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{:?}",
            start.elapsed()
        );

        // The weights stop flowing half-way.
        let hub = FakeHub::start(files.clone(), |req, hub| {
            req.is_cdn().then(|| {
                let mut reply = hub.answer(req);
                reply.stall_after = Some(reply.body.len() / 2);
                reply
            })
        });
        let start = Instant::now();
        let out = sandbox.eval_at(&hub, None, &[("HF_HUB_DOWNLOAD_TIMEOUT", "1")]);
        assert_error(&out, &["model.safetensors", "HF_HUB_DOWNLOAD_TIMEOUT"]);
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "{:?}",
            start.elapsed()
        );
        sandbox.assert_sound(&files);
    }

    #[test]
    fn a_redirect_loop_ends() {
        let files = tiny_files();
        // The Hub's resolve endpoint sends config.json to itself (a relative redirect, as
        // for a renamed repo)...
        let hub = FakeHub::start(files.clone(), |req, _| {
            req.resolves("config.json")
                .then(|| Reply::new(302, vec![("Location".into(), req.path.clone())], vec![]))
        });
        let sandbox = Sandbox::new();
        assert_error(&sandbox.eval(&hub), &["config.json", "redirects"]);
        assert!(count(&hub, "HEAD") <= 12, "{:?}", hub.requests());

        // ...and the CDN the weights (a full URL).
        let hub = FakeHub::start(files.clone(), |req, hub| {
            req.is_cdn().then(|| {
                let to = format!("{}{}", hub.endpoint, req.path);
                Reply::new(302, vec![("Location".into(), to)], vec![])
            })
        });
        assert_error(&sandbox.eval(&hub), &["model.safetensors", "redirects"]);
        sandbox.assert_sound(&files);
    }

    #[test]
    fn revisions_are_checked_before_use() {
        let hub = FakeHub::serving(&fixture("qwen3.5-tiny-4bit"));
        let sandbox = Sandbox::new();
        for bad in ["../../..", "/etc", "a\\b", "main/../../x"] {
            let quoted = format!("--revision {bad:?}");
            assert_error(&sandbox.eval_at(&hub, Some(bad), &[]), &[&quoted]);
            assert_error(&sandbox.eval_offline(Some(bad)), &[&quoted]);
        }
        assert!(hub.requests().is_empty(), "{:?}", hub.requests());
        sandbox.assert_sound(&hub.files);

        // A pull request's branch name holds slashes; its ref stays inside the cache.
        let out = sandbox.eval_at(&hub, Some("refs/pr/1"), &[]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(hub.requests()[0].contains("/revision/refs%2Fpr%2F1 "));
        assert_eq!(
            std::fs::read_to_string(sandbox.repo().join("refs/refs/pr/1")).unwrap(),
            COMMIT
        );
        assert!(sandbox.eval_offline(Some("refs/pr/1")).status.success());
        sandbox.assert_sound(&hub.files);
    }

    #[test]
    fn a_second_download_of_the_same_file_waits_for_the_first() {
        let files = tiny_files();
        // Slow weights (about 2.5 s), so that the second process arrives mid-download.
        let hub = FakeHub::start(files.clone(), |req, hub| {
            req.is_cdn().then(|| {
                let mut reply = hub.answer(req);
                reply.pace = Some(Duration::from_millis(50));
                reply
            })
        });
        let sandbox = Sandbox::new();
        let spawn = || {
            let mut cmd = sandbox.command(None);
            cmd.env("HF_HUB_OFFLINE", "0")
                .env("HF_ENDPOINT", &hub.endpoint)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            cmd.spawn().unwrap()
        };
        let first = spawn();
        let incomplete = sandbox.blobs().join(format!(
            "{}.incomplete",
            sha256_hex(&files["model.safetensors"])
        ));
        let start = Instant::now();
        while !incomplete.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the first never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let second = spawn();
        let (first, second) = (
            first.wait_with_output().unwrap(),
            second.wait_with_output().unwrap(),
        );
        assert!(first.status.success(), "{}", stderr(&first));
        assert!(second.status.success(), "{}", stderr(&second));
        assert_eq!(first.stdout, local_eval());
        assert_eq!(second.stdout, local_eval());
        assert!(
            stderr(&second).contains("waiting for another process downloading model.safetensors"),
            "{}",
            stderr(&second)
        );
        assert_eq!(count(&hub, "GET /cdn/"), 1, "{:?}", hub.requests());
        sandbox.assert_sound(&files);
    }
}
