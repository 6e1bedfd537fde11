//! `--api-key`: every API request (all but /health) must carry the key, as
//! `Authorization: Bearer <key>` (OpenAI, Ollama) or `x-api-key: <key>` (Anthropic's header);
//! either is accepted on every route. A refusal is a 401 in the shape of the route's API. The
//! comparison takes the same time wherever the keys differ, so the key cannot be guessed byte
//! by byte.

use super::dialect::Dialect;
use super::error::ApiError;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

/// The key a group of routes requires, and the API whose error shape its refusals take.
pub struct KeyCheck {
    pub key: Option<String>,
    pub dialect: Dialect,
}

/// The environment variable that sets the key when `--api-key` is not given (it keeps the key
/// out of the process list).
pub const API_KEY_ENV: &str = "QWEN_GDN_API_KEY";

/// The key the server requires: `--api-key`, else `$QWEN_GDN_API_KEY`, else none. An empty
/// (or blank) key is an error rather than authentication silently off: `--api-key "$KEY"`
/// with KEY unset must not open the server.
pub fn configured_key(flag: Option<&str>) -> anyhow::Result<Option<String>> {
    let (key, source) = match flag {
        Some(key) => (key.to_string(), "--api-key"),
        None => match std::env::var_os(API_KEY_ENV) {
            None => return Ok(None),
            Some(key) => (
                key.into_string()
                    .map_err(|_| anyhow::anyhow!("{API_KEY_ENV} is not valid UTF-8"))?,
                API_KEY_ENV,
            ),
        },
    };
    if key.trim().is_empty() {
        anyhow::bail!(
            "{source} is empty; give a key, or leave {source} out to serve without authentication"
        );
    }
    Ok(Some(key))
}

pub async fn require_key(
    State(check): State<Arc<KeyCheck>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = check.key.as_deref() else {
        return next.run(request).await;
    };
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let x_api_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let given = [bearer, x_api_key];
    if given
        .iter()
        .flatten()
        .any(|given| same(given.as_bytes(), key.as_bytes()))
    {
        return next.run(request).await;
    }
    let refusal = if given.iter().any(Option::is_some) {
        ApiError::unauthorized("incorrect API key")
    } else {
        ApiError::unauthorized(
            "missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>` (the \
             server runs with --api-key)",
        )
    };
    check.dialect.error(refusal)
}

fn same(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, &x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_compare_whole() {
        assert!(super::same(b"secret", b"secret"));
        assert!(!super::same(b"secret", b"secreT"));
        assert!(!super::same(b"secret", b"secret2"));
        assert!(!super::same(b"", b"secret"));
        assert!(super::same(b"", b""));
    }
}
