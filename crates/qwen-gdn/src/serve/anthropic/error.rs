//! Anthropic's error shape, `{"type": "error", "error": {"type", "message"}}`, with the status
//! and type Anthropic gives each kind: 400 invalid_request_error, 401 authentication_error,
//! 404 not_found_error, 413 request_too_large, 529 overloaded_error (our full queue),
//! 500 api_error.

use crate::serve::error::ApiError;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value as Json};

/// Anthropic's "overloaded" status (not a standard HTTP one).
const OVERLOADED: u16 = 529;

fn status_and_type(e: &ApiError) -> (StatusCode, &'static str) {
    let kind = match e.status.as_u16() {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    let status = match e.status.as_u16() {
        503 => StatusCode::from_u16(OVERLOADED).unwrap_or(e.status),
        _ => e.status,
    };
    (status, kind)
}

pub fn body(e: &ApiError) -> Json {
    let (_, kind) = status_and_type(e);
    json!({"type": "error", "error": {"type": kind, "message": e.message}})
}

pub fn error_response(e: &ApiError) -> Response {
    let (status, _) = status_and_type(e);
    (status, axum::Json(body(e))).into_response()
}

/// The `error` event that ends a stream that failed midway.
pub fn error_event(e: &ApiError) -> Bytes {
    Bytes::from(format!("event: error\ndata: {}\n\n", body(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_types_follow_anthropic() {
        for (e, status, kind) in [
            (ApiError::invalid("x"), 400, "invalid_request_error"),
            (ApiError::unauthorized("x"), 401, "authentication_error"),
            (ApiError::model_not_found("m"), 404, "not_found_error"),
            (ApiError::too_large(1), 413, "request_too_large"),
            (ApiError::overloaded("x"), 529, "overloaded_error"),
            (ApiError::internal("x"), 500, "api_error"),
        ] {
            let (s, k) = status_and_type(&e);
            assert_eq!((s.as_u16(), k), (status, kind));
            assert_eq!(body(&e)["type"], "error");
            assert_eq!(body(&e)["error"]["message"], e.message);
        }
    }
}
