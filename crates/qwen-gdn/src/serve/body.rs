//! Reading a request body under the size limit: 413 past it, in OpenAI's error shape (a
//! Content-Length over the limit is refused before anything is read), and under a deadline
//! for the whole body: 408 past it. A deadline on each read alone would let a client trickle
//! a byte at a time and hold the connection for ever.

use super::error::ApiError;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use std::time::Duration;

pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let read = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await;
    let Ok(read) = read else {
        return Err(ApiError::timed_out(timeout));
    };
    match read {
        Ok(bytes) => Ok(bytes),
        Err(e) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if over {
                Err(ApiError::too_large(limit))
            } else {
                Err(ApiError::invalid(format!(
                    "cannot read the request body: {e}"
                )))
            }
        }
    }
}
