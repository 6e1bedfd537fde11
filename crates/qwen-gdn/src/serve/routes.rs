//! The router: each API's routes (OpenAI, Anthropic, Ollama) behind the API-key check,
//! `/metrics` (also behind it), `/health` and the chat page at `/` (open: the page asks for
//! the key and sends it with its API requests); 404/405 for anything else in the shape of
//! the API the path belongs to; a panic in a handler caught and answered 500 in that shape.
//! Every request goes through the request log (counted in /metrics, one JSON line with
//! `--log-format json`).

use super::auth::{require_key, KeyCheck};
use super::dialect::Dialect;
use super::error::ApiError;
use super::metrics;
use super::request_log::{observe, Observer};
use super::state::AppState;
use super::{anthropic, ollama, openai, page};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{middleware, Json, Router};
use serde_json::json;
use std::sync::Arc;

pub fn router(state: Arc<AppState>, api_key: Option<String>, observer: Observer) -> Router {
    let api = |routes: Router<Arc<AppState>>, dialect: Dialect| {
        routes
            .route_layer(middleware::from_fn_with_state(
                Arc::new(KeyCheck {
                    key: api_key.clone(),
                    dialect,
                }),
                require_key,
            ))
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(
                move |_panic| {
                    dialect.error(ApiError::internal(
                        "internal error: the request handler panicked",
                    ))
                },
            ))
    };
    Router::new()
        .route("/health", get(health))
        .merge(page::routes())
        .merge(api(openai::routes(), Dialect::OpenAi))
        .merge(api(anthropic::routes(), Dialect::Anthropic))
        .merge(api(ollama::routes(), Dialect::Ollama))
        .merge(api(
            Router::new().route("/metrics", get(metrics)),
            Dialect::OpenAi,
        ))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(middleware::from_fn_with_state(Arc::new(observer), observe))
}

/// What the connections over `--max-connections` get: /health, and 503 for everything else.
pub fn health_only(max_connections: usize) -> Router {
    let busy = format!(
        "the server has {max_connections} connections open (--max-connections); retry later"
    );
    Router::new()
        .route("/health", get(health))
        .fallback(move |uri: axum::http::Uri| {
            let busy = busy.clone();
            async move { Dialect::of_path(uri.path()).error(ApiError::overloaded(busy)) }
        })
}

async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

async fn metrics(axum::extract::State(state): axum::extract::State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
        .into_response()
}

async fn not_found(uri: axum::http::Uri) -> Response {
    Dialect::of_path(uri.path()).error(ApiError::not_found(format!("no route {}", uri.path())))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    Dialect::of_path(uri.path()).error(ApiError::method_not_allowed(format!(
        "{method} is not allowed on {}",
        uri.path()
    )))
}
