//! `qwen-gdn serve` on a free port with a tiny checkpoint, for the serve tests: started,
//! its stderr collected, its address read from it, driven over HTTP (ureq), killed on drop.

use super::{command, fixture};
use serde_json::Value as Json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The checkpoint the serve tests run.
pub const MODEL: &str = "qwen3.5-tiny-4bit";

pub struct Server {
    pub child: Child,
    pub base: String,
    log: Arc<Mutex<Vec<String>>>,
}

/// `serve --model <the tiny fixture> --port 0 <extra>`, without the user's API key.
pub fn serve_command(extra: &[&str], env: &[(&str, &str)]) -> std::process::Command {
    serve_command_on(&fixture(MODEL), extra, env)
}

/// `serve --model <model> --port 0 <extra>`, without the user's API key.
pub fn serve_command_on(
    model: &std::path::Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> std::process::Command {
    let mut args = vec!["serve", "--model", model.to_str().unwrap(), "--port", "0"];
    args.extend_from_slice(extra);
    let mut cmd = command(&args);
    cmd.env_remove("QWEN_GDN_API_KEY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

impl Server {
    pub fn start(extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(serve_command(extra, env))
    }

    /// A server of the checkpoint in `model`.
    pub fn start_on(model: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(serve_command_on(model, extra, env))
    }

    pub fn spawn(mut cmd: std::process::Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("http://") {
                    let addr = line[at..].split('/').nth(2).unwrap().to_string();
                    let _ = tx.send(addr);
                }
                lines.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("server did not start: {:?}", log.lock().unwrap()));
        Self {
            child,
            base: format!("http://{addr}"),
            log,
        }
    }

    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// (status, body) of a request; `body` None is a GET.
    pub fn call(&self, path: &str, body: Option<&str>, key: Option<&str>) -> (u16, String) {
        let auth = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let (status, text, _) = self.request(path, body, &headers);
        (status, text)
    }

    /// (status, body, content type) of a request with these headers; `body` None is a GET.
    pub fn request(
        &self,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, String, String) {
        let agent = ureq::Agent::new_with_config(
            ureq::config::Config::builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(300)))
                .build(),
        );
        let url = format!("{}{path}", self.base);
        let response = match body {
            Some(body) => {
                let mut req = agent.post(&url).header("Content-Type", "application/json");
                for (name, value) in headers {
                    req = req.header(*name, *value);
                }
                req.send(body)
            }
            None => {
                let mut req = agent.get(&url);
                for (name, value) in headers {
                    req = req.header(*name, *value);
                }
                req.call()
            }
        }
        .unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        (
            status,
            response.into_body().read_to_string().unwrap(),
            content_type,
        )
    }

    pub fn post(&self, path: &str, body: &Json) -> (u16, Json) {
        let (status, text) = self.call(path, Some(&body.to_string()), None);
        (
            status,
            serde_json::from_str(&text).unwrap_or(Json::String(text)),
        )
    }

    /// The `data:` payloads of a streamed reply.
    pub fn stream(&self, path: &str, body: &Json) -> Vec<String> {
        let (status, text) = self.call(path, Some(&body.to_string()), None);
        assert_eq!(status, 200, "{text}");
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
