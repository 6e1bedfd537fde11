//! The router: endpoints, the API-key check on /v1/, OpenAI-shaped 404/405 for anything
//! else, and a caught panic in a handler answered 500.

use super::auth::require_key;
use super::body::read_limited;
use super::error::ApiError;
use super::reply::respond;
use super::request::{parse, ChatRequest, CompletionRequest, Limits, Validated};
use super::response::unix_now;
use super::scheduler::Scheduler;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use serde_json::json;
use std::sync::Arc;

pub struct AppState {
    pub scheduler: Scheduler,
    pub limits: Limits,
    pub max_request_bytes: usize,
    /// How long a request body may take to arrive (--body-timeout).
    pub body_timeout: std::time::Duration,
}

pub fn router(state: Arc<AppState>, api_key: Option<String>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route_layer(middleware::from_fn_with_state(
            Arc::new(api_key),
            require_key,
        ));
    Router::new()
        .route("/health", get(health))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_panic| {
            ApiError::internal("internal error: the request handler panicked").into_response()
        }))
}

/// What the connections over `--max-connections` get: /health, and 503 for everything else.
pub fn health_only(max_connections: usize) -> Router {
    let busy = format!(
        "the server has {max_connections} connections open (--max-connections); retry later"
    );
    Router::new()
        .route("/health", get(health))
        .fallback(move || {
            let busy = busy.clone();
            async move { ApiError::overloaded(busy).into_response() }
        })
}

async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
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
        ApiError::model_not_found(&id).into_response()
    }
}

async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::not_found(format!("no route {}", uri.path())).into_response()
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError::method_not_allowed(format!("{method} is not allowed on {}", uri.path()))
        .into_response()
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let validated = match read_limited(&headers, body, state.max_request_bytes, state.body_timeout)
        .await
        .and_then(|b| parse::<ChatRequest>(&b))
        .and_then(|r| r.validate(&state.limits))
    {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    run(&state, validated, true).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let validated = match read_limited(&headers, body, state.max_request_bytes, state.body_timeout)
        .await
        .and_then(|b| parse::<CompletionRequest>(&b))
        .and_then(|r| r.validate(&state.limits))
    {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    run(&state, validated, false).await
}

async fn run(state: &AppState, validated: Validated, chat: bool) -> Response {
    let ticket = match state.scheduler.submit(validated.job.clone()) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let model = state.limits.model_names[0].clone();
    respond(ticket, validated, &model, chat).await
}
