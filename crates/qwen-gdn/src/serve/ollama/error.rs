//! Ollama's error shape: `{"error": "message"}`, with the HTTP status of the error (400 for a
//! bad request, 404 for an unknown model, 500 for a failure of the server).

use crate::serve::error::ApiError;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value as Json};

pub fn error_body(e: &ApiError) -> Json {
    json!({"error": e.message})
}

pub fn error_response(e: &ApiError) -> Response {
    (e.status, axum::Json(error_body(e))).into_response()
}
