//! Ollama's API, which Open WebUI, editor plug-ins and many scripts speak: `POST /api/chat`
//! and `POST /api/generate` (streamed as newline-delimited JSON unless `"stream": false`),
//! `GET /api/tags`, `POST /api/show`, `GET /api/version`. Requests are translated into the
//! OpenAI ones (request.rs) and run through the shared generation; reply.rs writes Ollama's
//! objects, error.rs its error shape, info.rs the model's description.

mod error;
mod info;
mod reply;
mod request;

pub use error::error_response;

use super::body::read_limited;
use super::dialect::Dialect;
use super::generation::Output;
use super::request_log::RequestLog;
use super::routes::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};
use reply::Endpoint;
use request::{ChatBody, GenerateBody};
use std::sync::Arc;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/chat", post(chat))
        .route("/api/generate", post(generate))
        .route("/api/tags", get(info::tags))
        .route("/api/show", post(info::show))
        .route("/api/version", get(info::version))
}

async fn chat(
    State(state): State<Arc<AppState>>,
    Extension(log): Extension<RequestLog>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let parsed = read_limited(&headers, body, state.max_request_bytes, state.body_timeout)
        .await
        .and_then(|b| request::parse::<ChatBody>(&b));
    let body = match parsed {
        Ok(body) => body,
        Err(e) => return Dialect::Ollama.error(e),
    };
    let model = body.model.clone();
    if body.is_load_only() {
        return match request::resolve_model(&model, &state.limits) {
            Ok(_) => reply::load_only(Endpoint::Chat, model),
            Err(e) => Dialect::Ollama.error(e),
        };
    }
    match body.validate(&state.limits) {
        Ok(v) => {
            reply::respond(
                &state.scheduler,
                v,
                Output::Chat,
                Endpoint::Chat,
                model,
                Some(log),
            )
            .await
        }
        Err(e) => Dialect::Ollama.error(e),
    }
}

async fn generate(
    State(state): State<Arc<AppState>>,
    Extension(log): Extension<RequestLog>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let parsed = read_limited(&headers, body, state.max_request_bytes, state.body_timeout)
        .await
        .and_then(|b| request::parse::<GenerateBody>(&b));
    let body = match parsed {
        Ok(body) => body,
        Err(e) => return Dialect::Ollama.error(e),
    };
    let model = body.model.clone();
    if body.is_load_only() {
        return match request::resolve_model(&model, &state.limits) {
            Ok(_) => reply::load_only(Endpoint::Generate, model),
            Err(e) => Dialect::Ollama.error(e),
        };
    }
    match body.validate(&state.limits) {
        Ok((v, chat)) => {
            let output = if chat { Output::Chat } else { Output::Text };
            reply::respond(
                &state.scheduler,
                v,
                output,
                Endpoint::Generate,
                model,
                Some(log),
            )
            .await
        }
        Err(e) => Dialect::Ollama.error(e),
    }
}
