//! HTTP to the Hub: timeouts from huggingface_hub's environment variables, redirects followed
//! here (so that their number is capped and the token goes to the Hub's own host only), and
//! every status handed back to the caller as a value.

use anyhow::{bail, Result};
use std::time::Duration;
use ureq::http::Response;
use ureq::Body;

/// More hops than the Hub ever uses (a renamed repo, then the CDN); a loop ends here.
pub const MAX_REDIRECTS: usize = 10;

/// huggingface_hub's defaults for both timeouts, in seconds.
const DEFAULT_TIMEOUT_S: f64 = 10.0;

/// Which redirects [`Http::send`] follows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// Only relative ones, which stay on the Hub (a renamed repo), as huggingface_hub does;
    /// a redirect to a full URL (the Hub's redirect of a large file to its CDN) is returned,
    /// since its headers describe the file.
    Relative,
    /// All of them, up to [`MAX_REDIRECTS`].
    All,
}

/// What a request is for: each has its own timeout, as in huggingface_hub.
#[derive(Clone, Copy)]
pub enum Purpose {
    /// The repo listing and the HEAD of each file (`HF_HUB_ETAG_TIMEOUT`).
    Metadata,
    /// File contents (`HF_HUB_DOWNLOAD_TIMEOUT`).
    Download,
}

pub struct Http {
    pub endpoint: String,
    token: Option<String>,
    metadata: Client,
    download: Client,
}

/// An agent and the timeout it applies to connecting and to every read and write: a stalled
/// server fails the request after that long without data, however long the whole file takes.
struct Client {
    agent: ureq::Agent,
    timeout: Duration,
    variable: &'static str,
}

impl Client {
    fn from_env(variable: &'static str) -> Result<Self> {
        let timeout = timeout_from_env(variable)?;
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_resolve(Some(timeout))
            .timeout_connect(Some(timeout))
            .timeout_per_read(Some(timeout))
            .timeout_per_write(Some(timeout))
            .user_agent(format!("qwen-gdn/{}", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Self {
            agent: config.into(),
            timeout,
            variable,
        })
    }

    /// An error message that says which limit was hit and how to raise it.
    fn describe(&self, e: &ureq::Error) -> String {
        match e {
            ureq::Error::Timeout(_) => self.timed_out(),
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => self.timed_out(),
            e => e.to_string(),
        }
    }

    fn timed_out(&self) -> String {
        format!(
            "no answer for {} s ({} sets the limit)",
            self.timeout.as_secs_f64(),
            self.variable
        )
    }
}

/// `$variable` as seconds (fractions allowed), else huggingface_hub's default.
fn timeout_from_env(variable: &str) -> Result<Duration> {
    let Some(text) = std::env::var(variable)
        .ok()
        .filter(|v| !v.trim().is_empty())
    else {
        return Ok(Duration::from_secs_f64(DEFAULT_TIMEOUT_S));
    };
    match text.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(s)),
        _ => bail!("{variable}={text:?} is not a positive number of seconds"),
    }
}

impl Http {
    pub fn new(endpoint: &str, token: Option<String>) -> Result<Self> {
        Ok(Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            metadata: Client::from_env("HF_HUB_ETAG_TIMEOUT")?,
            download: Client::from_env("HF_HUB_DOWNLOAD_TIMEOUT")?,
        })
    }

    /// Sends a GET (or a HEAD) for `url`, asking for the bytes `first..=last` (to the end
    /// when `last` is `None`) when `range` is given, and follows redirects as `follow` says. Returns the last response and its URL; an
    /// error is a one-line reason (the server could not be reached, or went silent).
    pub fn send(
        &self,
        purpose: Purpose,
        head: bool,
        url: &str,
        range: Option<(u64, Option<u64>)>,
        follow: Follow,
    ) -> std::result::Result<(Response<Body>, String), String> {
        let client = self.client(purpose);
        let mut url = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let mut request = if head {
                client.agent.head(&url)
            } else {
                client.agent.get(&url)
            };
            // The token is for the Hub; the CDN it redirects to gets signed URLs instead.
            if let Some(token) = &self.token {
                if origin(&url) == origin(&self.endpoint) {
                    request = request.header("Authorization", format!("Bearer {token}"));
                }
            }
            match range {
                Some((first, Some(last))) => {
                    request = request.header("Range", format!("bytes={first}-{last}"));
                }
                Some((first, None)) => {
                    request = request.header("Range", format!("bytes={first}-"));
                }
                None => {}
            }
            let response = request
                .call()
                .map_err(|e| format!("{url}: {}", client.describe(&e)))?;
            if !response.status().is_redirection() {
                return Ok((response, url));
            }
            let Some(location) = header(&response, "location") else {
                return Ok((response, url));
            };
            let next = join_url(&url, &location)
                .ok_or_else(|| format!("{url}: cannot follow the redirect to {location:?}"))?;
            let relative = location.starts_with('/') && !location.starts_with("//");
            if follow == Follow::Relative && !relative {
                return Ok((response, url));
            }
            url = next;
        }
        Err(format!(
            "{url}: more than {MAX_REDIRECTS} redirects (a redirect loop?)"
        ))
    }

    /// The reason for a failed body read, naming the timeout when that was it.
    pub fn describe_read_error(&self, purpose: Purpose, e: &std::io::Error) -> String {
        let client = self.client(purpose);
        // ureq hands its own errors (a timeout among them) to readers wrapped in io::Error.
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<ureq::Error>())
        {
            Some(inner) => client.describe(inner),
            None if e.kind() == std::io::ErrorKind::TimedOut => client.timed_out(),
            None => e.to_string(),
        }
    }

    /// Reads a download's `body` to its end in 1 MiB chunks, handing each to `take` (whose
    /// error ends the read) and retrying interrupted reads. The bytes read, or a read cut
    /// short: why (as [`Self::describe_read_error`] tells it) and the bytes read before.
    pub fn read_body(
        &self,
        mut body: impl std::io::Read,
        mut take: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<Result<u64, (String, u64)>> {
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => return Ok(Ok(got)),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Ok(Err((self.describe_read_error(Purpose::Download, &e), got))),
            };
            got += n as u64;
            take(&buf[..n])?;
        }
    }

    fn client(&self, purpose: Purpose) -> &Client {
        match purpose {
            Purpose::Metadata => &self.metadata,
            Purpose::Download => &self.download,
        }
    }
}

/// A response header as text (`None` when absent or not visible ASCII).
pub fn header(response: &Response<Body>, name: &str) -> Option<String> {
    let value = response.headers().get(name)?.to_str().ok()?;
    Some(value.trim().to_string())
}

/// `scheme://host:port` of an absolute URL.
fn origin(url: &str) -> &str {
    let Some(scheme_end) = url.find("://") else {
        return url;
    };
    let rest = &url[scheme_end + 3..];
    let host_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    &url[..scheme_end + 3 + host_end]
}

/// Where a `Location` header points, from the URL that sent it.
pub fn join_url(base: &str, location: &str) -> Option<String> {
    if location.starts_with("http://") || location.starts_with("https://") {
        return Some(location.to_string());
    }
    if location.starts_with("//") {
        let scheme = &base[..base.find("://")?];
        return Some(format!("{scheme}:{location}"));
    }
    if location.starts_with('/') {
        return Some(format!("{}{location}", origin(base)));
    }
    if location.contains("://") {
        return None; // another scheme
    }
    let path_end = base.find(['?', '#']).unwrap_or(base.len());
    let dir_end = base[..path_end].rfind('/')? + 1;
    Some(format!("{}{location}", &base[..dir_end]))
}

/// Percent-encodes what a path segment may not hold; `/` is kept when `keep_slash`.
pub fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(origin("https://hf.co:8443/a/b?c"), "https://hf.co:8443");
        assert_eq!(origin("http://127.0.0.1:9"), "http://127.0.0.1:9");
        let base = "https://hf.co/org/m/resolve/main/config.json";
        assert_eq!(join_url(base, "/api/x").unwrap(), "https://hf.co/api/x");
        assert_eq!(
            join_url(base, "https://cdn.example/blob?sig=1").unwrap(),
            "https://cdn.example/blob?sig=1"
        );
        assert_eq!(
            join_url(base, "other.json").unwrap(),
            "https://hf.co/org/m/resolve/main/other.json"
        );
        assert_eq!(
            join_url(base, "//cdn.example/b").unwrap(),
            "https://cdn.example/b"
        );
        assert!(join_url(base, "ftp://x/y").is_none());
        assert_eq!(encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode("a b/c.json", true), "a%20b/c.json");
    }

    #[test]
    fn timeouts_from_the_environment() {
        // A variable no other test sets, so that tests running in parallel do not race.
        let var = "QWEN_GDN_TEST_TIMEOUT_VARIABLE";
        std::env::remove_var(var);
        assert_eq!(timeout_from_env(var).unwrap(), Duration::from_secs(10));
        std::env::set_var(var, "1.5");
        assert_eq!(timeout_from_env(var).unwrap(), Duration::from_millis(1500));
        for bad in ["abc", "0", "-1", "inf"] {
            std::env::set_var(var, bad);
            let err = timeout_from_env(var).unwrap_err().to_string();
            assert!(err.contains(var), "{err}");
        }
        std::env::remove_var(var);
    }
}
