//! OpenAI's API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`. Its chat request is
//! also the form the Anthropic and Ollama requests are translated into, so that one
//! validation (request.rs) serves all three.

pub mod logprobs;
pub mod reply;
pub mod request;
pub mod response;

use super::dialect::Dialect;
use super::error::ApiError;
use super::posted::Posted;
use super::request_log::RequestLog;
use super::state::AppState;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use request::{parse, ChatRequest, CompletionRequest};
use response::unix_now;
use serde_json::json;
use std::sync::Arc;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
}

fn model_object(name: &str) -> serde_json::Value {
    json!({"id": name, "object": "model", "created": unix_now(), "owned_by": "qwen-gdn"})
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<_> = state
        .limits
        .model_names
        .iter()
        .map(|n| model_object(n))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if state.limits.model_names.contains(&id) {
        Json(model_object(&id)).into_response()
    } else {
        Dialect::OpenAi.error(ApiError::model_not_found(&id))
    }
}

async fn chat_completions(p: Posted) -> Response {
    let validated = p
        .body
        .and_then(|b| parse::<ChatRequest>(&b)?.validate(&p.state.limits));
    respond(&p.state, validated, true, p.log).await
}

async fn completions(p: Posted) -> Response {
    let validated = p
        .body
        .and_then(|b| parse::<CompletionRequest>(&b)?.validate(&p.state.limits));
    respond(&p.state, validated, false, p.log).await
}

async fn respond(
    state: &AppState,
    validated: Result<request::Validated, ApiError>,
    chat: bool,
    log: RequestLog,
) -> Response {
    match validated {
        Ok(v) => reply::respond(&state.scheduler, v, state.model_name(), chat, Some(log)).await,
        Err(e) => Dialect::OpenAi.error(e),
    }
}
