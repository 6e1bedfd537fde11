//! A Hugging Face Hub on localhost that answers as the real one does (the repo listing, HEAD
//! and GET of `resolve` URLs, `.safetensors` files redirected to a CDN path with their sha256
//! as `X-Linked-Etag`, Range requests), and that a test can make misbehave request by request.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
pub const REPO: &str = "test-org/tiny";
/// Revisions the listing knows (as they appear in its URL).
const REVISIONS: [&str; 3] = ["main", COMMIT, "refs%2Fpr%2F1"];

pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A GET or HEAD of `file` through the resolve endpoint.
    pub fn resolves(&self, file: &str) -> bool {
        self.path.starts_with(&format!("/{REPO}/resolve/"))
            && self.path.ends_with(&format!("/{file}"))
    }

    pub fn is_cdn(&self) -> bool {
        self.path.starts_with("/cdn/")
    }

    pub fn is_listing(&self) -> bool {
        self.path.starts_with("/api/models/")
    }
}

/// What the body's length header says.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Length {
    Actual,
    /// No Content-Length: the body ends when the connection closes.
    Omitted,
    Declared(u64),
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub length: Length,
    /// A pause before each 16 KiB of the body.
    pub pace: Option<Duration>,
    /// Send this many bytes of the body, then hold the connection open without a word.
    pub stall_after: Option<usize>,
}

impl Reply {
    pub fn new(status: u16, headers: Vec<(String, String)>, body: Vec<u8>) -> Self {
        Self {
            status,
            headers,
            body,
            length: Length::Actual,
            pace: None,
            stall_after: None,
        }
    }

    pub fn set_header(&mut self, name: &str, value: &str) {
        self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        self.headers.push((name.to_string(), value.to_string()));
    }

    /// Holds the connection without answering at all.
    pub fn stalled() -> Self {
        let mut reply = Self::new(200, vec![], vec![]);
        reply.stall_after = Some(0);
        reply.length = Length::Omitted;
        reply
    }
}

/// The files served and where; passed to a fault so that it can start from the true answer.
pub struct Served {
    pub endpoint: String,
    pub files: BTreeMap<String, Vec<u8>>,
}

pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A git-style (40 hex) ETag for a file kept outside LFS.
fn git_etag(data: &[u8]) -> String {
    sha256_hex(&[b"blob ".as_slice(), data].concat())[..40].to_string()
}

pub fn is_lfs(name: &str) -> bool {
    name.ends_with(".safetensors")
}

impl Served {
    /// What the real Hub would answer.
    pub fn answer(&self, req: &Request) -> Reply {
        let commit = ("X-Repo-Commit".to_string(), COMMIT.to_string());
        if let Some(rev) = req
            .path
            .strip_prefix(&format!("/api/models/{REPO}/revision/"))
        {
            if !REVISIONS.contains(&rev) {
                return Reply::new(404, vec![], vec![]);
            }
            let mut names: Vec<&str> = self.files.keys().map(String::as_str).collect();
            names.push("README.md"); // listed but never needed
            let siblings: Vec<_> = names
                .iter()
                .map(|n| serde_json::json!({ "rfilename": n }))
                .collect();
            let body = serde_json::json!({ "sha": COMMIT, "siblings": siblings });
            return Reply::new(200, vec![], body.to_string().into_bytes());
        }
        if let Some(rest) = req.path.strip_prefix(&format!("/{REPO}/resolve/")) {
            let Some((rev, file)) = rest.split_once('/') else {
                return Reply::new(404, vec![], vec![]);
            };
            let Some(data) = self.files.get(file).filter(|_| REVISIONS.contains(&rev)) else {
                return Reply::new(404, vec![], vec![]);
            };
            if is_lfs(file) {
                let sha = sha256_hex(data);
                let headers = vec![
                    commit,
                    ("Location".into(), format!("{}/cdn/{sha}", self.endpoint)),
                    ("X-Linked-Etag".into(), format!("\"{sha}\"")),
                    ("X-Linked-Size".into(), data.len().to_string()),
                    ("ETag".into(), format!("\"{}\"", git_etag(sha.as_bytes()))),
                ];
                return Reply::new(302, headers, b"Found".to_vec());
            }
            let mut reply = ranged(req, data);
            reply.headers.push(commit);
            reply
                .headers
                .push(("ETag".into(), format!("\"{}\"", git_etag(data))));
            return reply;
        }
        if let Some(sha) = req.path.strip_prefix("/cdn/") {
            if let Some(data) = self.files.values().find(|d| sha256_hex(d) == sha) {
                let mut reply = ranged(req, data);
                reply
                    .headers
                    .push(("ETag".into(), format!("\"cdn-{sha}\"")));
                return reply;
            }
        }
        Reply::new(404, vec![], vec![])
    }
}

/// `data`, or the part a Range header asks for.
fn ranged(req: &Request, data: &[u8]) -> Reply {
    let Some(range) = req.header("range").and_then(|r| r.strip_prefix("bytes=")) else {
        return Reply::new(200, vec![], data.to_vec());
    };
    let (a, b) = range.split_once('-').unwrap();
    let start: usize = a.parse().unwrap();
    let end: usize = b.parse().unwrap_or(data.len().saturating_sub(1));
    if start >= data.len() {
        let headers = vec![("Content-Range".into(), format!("bytes */{}", data.len()))];
        return Reply::new(416, headers, vec![]);
    }
    let headers = vec![(
        "Content-Range".into(),
        format!("bytes {start}-{end}/{}", data.len()),
    )];
    Reply::new(206, headers, data[start..=end].to_vec())
}

type Fault = dyn Fn(&Request, &Served) -> Option<Reply> + Send + Sync;

pub struct FakeHub {
    pub endpoint: String,
    pub files: BTreeMap<String, Vec<u8>>,
    log: Arc<Mutex<Vec<String>>>,
}

impl FakeHub {
    /// Serves every file of `folder` at [`COMMIT`] (branch `main`).
    pub fn serving(folder: &std::path::Path) -> Self {
        Self::start(read_folder(folder), |_, _| None)
    }

    /// Serves `files`; `fault` sees each request first, and its reply (when it gives one)
    /// replaces the true answer.
    pub fn start(
        files: BTreeMap<String, Vec<u8>>,
        fault: impl Fn(&Request, &Served) -> Option<Reply> + Send + Sync + 'static,
    ) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let served = Arc::new(Served {
            endpoint: endpoint.clone(),
            files: files.clone(),
        });
        let fault: Arc<Fault> = Arc::new(fault);
        let log = Arc::new(Mutex::new(Vec::new()));
        let requests = log.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (served, fault, requests) = (served.clone(), fault.clone(), requests.clone());
                std::thread::spawn(move || serve(stream, &served, &*fault, &requests));
            }
        });
        Self {
            endpoint,
            files,
            log,
        }
    }

    /// "METHOD path range=… auth=…" per request so far.
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    pub fn clear_requests(&self) {
        self.log.lock().unwrap().clear();
    }
}

pub fn read_folder(folder: &std::path::Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(folder)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn serve(
    mut stream: std::net::TcpStream,
    served: &Served,
    fault: &Fault,
    log: &Mutex<Vec<String>>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        lines.push(line.trim_end().to_string());
    }
    let Some(first) = lines.first() else { return };
    let mut parts = first.split(' ');
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let headers = lines[1..]
        .iter()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let req = Request {
        method,
        path,
        headers,
    };
    log.lock().unwrap().push(format!(
        "{} {} range={} auth={}",
        req.method,
        req.path,
        req.header("range").unwrap_or("-"),
        req.header("authorization").unwrap_or("-")
    ));
    let reply = fault(&req, served).unwrap_or_else(|| served.answer(&req));
    if reply.stall_after == Some(0) {
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let reason = match reply.status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Whatever",
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", reply.status);
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    match reply.length {
        Length::Actual => head.push_str(&format!("Content-Length: {}\r\n", reply.body.len())),
        Length::Declared(n) => head.push_str(&format!("Content-Length: {n}\r\n")),
        Length::Omitted => {}
    }
    head.push_str("Connection: close\r\n\r\n");
    if stream.write_all(head.as_bytes()).is_err() || req.method == "HEAD" {
        return;
    }
    let body = &reply.body[..reply
        .stall_after
        .unwrap_or(reply.body.len())
        .min(reply.body.len())];
    for chunk in body.chunks(16 << 10) {
        if let Some(pace) = reply.pace {
            std::thread::sleep(pace);
        }
        if stream.write_all(chunk).is_err() {
            return;
        }
    }
    if reply.stall_after.is_some() {
        let _ = stream.flush();
        std::thread::sleep(Duration::from_secs(60));
    }
}
