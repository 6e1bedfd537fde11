//! Anthropic's Messages API: `POST /v1/messages`, plain and streamed, so that agents written
//! for it run on the local model. The request is translated into the OpenAI chat request
//! (request.rs) and run through the shared generation; reply.rs writes Anthropic's message and
//! events, error.rs its error shape.

pub mod error;
mod reply;
mod request;

use super::dialect::Dialect;
use super::request_log::RequestLog;
use super::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::{Extension, Router};
use std::sync::Arc;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/messages", post(messages))
}

async fn messages(
    State(state): State<Arc<AppState>>,
    Extension(log): Extension<RequestLog>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let validated = state
        .read(&headers, body, |b| {
            let request = request::parse(b)?;
            let model = request.model.clone();
            Ok((model, request.validate(&state.limits)?))
        })
        .await;
    match validated {
        Ok((model, v)) => reply::respond(&state.scheduler, v, model, Some(log)).await,
        Err(e) => Dialect::Anthropic.error(e),
    }
}
