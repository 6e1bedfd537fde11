//! Anthropic's Messages API: `POST /v1/messages`, plain and streamed, so that agents written
//! for it run on the local model. The request is translated into the OpenAI chat request
//! (request.rs) and run through the shared generation; reply.rs writes Anthropic's message and
//! events, error.rs its error shape.

pub mod error;
mod reply;
mod request;

use super::dialect::Dialect;
use super::posted::Posted;
use super::state::AppState;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use std::sync::Arc;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/messages", post(messages))
}

async fn messages(p: Posted) -> Response {
    let validated = p.body.and_then(|b| {
        let request = request::parse(&b)?;
        let model = request.model.clone();
        Ok((model, request.validate(&p.state.limits)?))
    });
    match validated {
        Ok((model, v)) => reply::respond(&p.state.scheduler, v, model, Some(p.log)).await,
        Err(e) => Dialect::Anthropic.error(e),
    }
}
