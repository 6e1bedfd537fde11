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

#[cfg(feature = "hub")]
/// Serves one repo the way the Hub's API and resolve endpoints answer hf-hub, logging
/// "path auth" per request.
fn fake_hub(files: std::path::PathBuf) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let requests = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut lines = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                lines.push(line.trim_end().to_string());
            }
            let path = lines[0].split(' ').nth(1).unwrap().to_string();
            let header = |name: &str| {
                lines.iter().find_map(|l| {
                    l.split_once(": ")
                        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v.to_string())
                })
            };
            requests.lock().unwrap().push(format!(
                "{path} {}",
                header("authorization").unwrap_or_default()
            ));
            let mut names: Vec<String> = std::fs::read_dir(&files)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.push("README.md".into()); // listed but never needed
            let (status, headers, body) =
                if path.starts_with("/api/models/test-org/tiny/revision/main") {
                    let siblings: Vec<_> = names
                        .iter()
                        .map(|n| serde_json::json!({"rfilename": n}))
                        .collect();
                    (
                        "200 OK",
                        String::new(),
                        serde_json::json!({"sha": SHA, "siblings": siblings})
                            .to_string()
                            .into_bytes(),
                    )
                } else if let Some((file, data)) = path
                    .strip_prefix("/test-org/tiny/resolve/main/")
                    .and_then(|f| Some((f, std::fs::read(files.join(f)).ok()?)))
                {
                    let (start, end) = match header("range")
                        .and_then(|r| r.strip_prefix("bytes=").map(str::to_string))
                    {
                        Some(r) => {
                            let (a, b) = r.split_once('-').unwrap();
                            (a.parse().unwrap(), b.parse().unwrap_or(data.len() - 1))
                        }
                        None => (0, data.len() - 1),
                    };
                    // The ETag names the blob in the cache; any per-file value will do.
                    let headers = format!(
                        "X-Repo-Commit: {SHA}\r\nETag: \"blob-{file}\"\r\n\
                     Content-Range: bytes {start}-{end}/{}\r\n",
                        data.len()
                    );
                    ("206 Partial Content", headers, data[start..=end].to_vec())
                } else {
                    ("404 Not Found", String::new(), Vec::new())
                };
            let head = format!(
                "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream
                .write_all(head.as_bytes())
                .and_then(|_| stream.write_all(&body));
        }
    });
    (endpoint, log)
}

#[cfg(feature = "hub")]
#[test]
fn downloads_only_the_needed_files_into_the_hf_cache() {
    let (endpoint, log) = fake_hub(fixture("qwen3.5-tiny-4bit"));
    let cache = tempfile::tempdir().unwrap();
    let online = [
        ("HF_HUB_OFFLINE", "0"),
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_TOKEN", "hf_test"),
    ];
    let out = eval("test-org/tiny", cache.path(), &online);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, local_eval());
    let requests = log.lock().unwrap().clone();
    assert!(
        requests.iter().all(|r| r.ends_with(" Bearer hf_test")),
        "HF_TOKEN not sent: {requests:?}"
    );
    assert!(
        !requests.iter().any(|r| r.contains("README")),
        "fetched an unneeded file: {requests:?}"
    );
    // huggingface_hub's layout, so mlx-lm and huggingface-cli reuse what was fetched.
    let repo = cache.path().join("models--test-org--tiny");
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        SHA
    );
    assert!(repo
        .join("snapshots")
        .join(SHA)
        .join("model.safetensors")
        .is_file());

    // Cached now: the next run only asks for the listing, and offline needs nothing.
    log.lock().unwrap().clear();
    assert!(eval("test-org/tiny", cache.path(), &online)
        .status
        .success());
    assert_eq!(log.lock().unwrap().len(), 1, "{:?}", log.lock().unwrap());
    assert!(eval("test-org/tiny", cache.path(), &[]).status.success());

    // A repo the Hub does not know, and a Hub that cannot be reached.
    let out = eval("test-org/nope", cache.path(), &online);
    assert_error(&out, &["test-org/nope", "404", "HF_TOKEN"]);
    let out = eval(
        "test-org/nope",
        cache.path(),
        &[
            ("HF_HUB_OFFLINE", "0"),
            ("HF_ENDPOINT", "http://127.0.0.1:9"),
        ],
    );
    assert_error(
        &out,
        &[
            "cannot reach http://127.0.0.1:9",
            "config.json of test-org/nope@main",
            "HF_HUB_OFFLINE=1",
        ],
    );
}
