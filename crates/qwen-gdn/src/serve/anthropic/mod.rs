//! Anthropic's Messages API: `POST /v1/messages`, plain and streamed, so that agents written
//! for it run on the local model. The request is translated into the OpenAI chat request
//! (request.rs) and run through the shared generation; reply.rs writes Anthropic's message and
//! events, error.rs its error shape.

mod error;
mod reply;
mod request;

pub use error::error_response;

use super::body::read_limited;
use super::request_log::RequestLog;
use super::routes::AppState;
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
    let parsed = read_limited(&headers, body, state.max_request_bytes, state.body_timeout)
        .await
        .and_then(|b| request::parse(&b));
    let (model, validated) = match parsed {
        Ok(r) => (r.model.clone(), r.validate(&state.limits)),
        Err(e) => return super::dialect::Dialect::Anthropic.error(e),
    };
    match validated {
        Ok(v) => reply::respond(&state.scheduler, v, model, Some(log)).await,
        Err(e) => super::dialect::Dialect::Anthropic.error(e),
    }
}
