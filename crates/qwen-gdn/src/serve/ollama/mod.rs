//! Ollama's API, which Open WebUI, editor plug-ins and many scripts speak: `POST /api/chat`
//! and `POST /api/generate` (streamed as newline-delimited JSON unless `"stream": false`),
//! `GET /api/tags`, `POST /api/show`, `GET /api/version`. Requests are translated into the
//! OpenAI ones (request.rs) and run through the shared generation; reply.rs writes Ollama's
//! objects, error.rs its error shape, info.rs the model's description.

pub mod error;
mod info;
mod reply;
mod request;

use super::dialect::Dialect;
use super::error::ApiError;
use super::posted::Posted;
use super::request_log::RequestLog;
use super::state::AppState;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use request::{ChatBody, GenerateBody, OllamaRequest};
use std::sync::Arc;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/chat", post(chat))
        .route("/api/generate", post(generate))
        .route("/api/tags", get(info::tags))
        .route("/api/show", post(info::show))
        .route("/api/version", get(info::version))
}

async fn chat(p: Posted) -> Response {
    let body = p.body.and_then(|b| request::parse::<ChatBody>(&b));
    run(&p.state, body, p.log).await
}

async fn generate(p: Posted) -> Response {
    let body = p.body.and_then(|b| request::parse::<GenerateBody>(&b));
    run(&p.state, body, p.log).await
}

/// A chat or generate request: answered "load" when it has nothing to generate (as Ollama
/// does), else generated.
async fn run(
    state: &AppState,
    body: Result<impl OllamaRequest, ApiError>,
    log: RequestLog,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(e) => return Dialect::Ollama.error(e),
    };
    let model = body.model().to_string();
    let endpoint = body.endpoint();
    if body.is_load_only() {
        return match request::resolve_model(&model, &state.limits) {
            Ok(_) => reply::load_only(endpoint, model),
            Err(e) => Dialect::Ollama.error(e),
        };
    }
    match body.validate(&state.limits) {
        Ok((v, output)) => {
            reply::respond(&state.scheduler, v, output, endpoint, model, Some(log)).await
        }
        Err(e) => Dialect::Ollama.error(e),
    }
}
