//! What a generation endpoint's handler receives: the shared state, the request's log record
//! and its body, read under --max-request-bytes and --body-timeout. A failed read is kept for
//! the handler to answer in its own API's error shape.

use super::body::read_limited;
use super::error::ApiError;
use super::request_log::RequestLog;
use super::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::ExtensionRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::Extension;
use std::sync::Arc;

pub struct Posted {
    pub state: Arc<AppState>,
    pub log: RequestLog,
    pub body: Result<Bytes, ApiError>,
}

impl FromRequest<Arc<AppState>> for Posted {
    type Rejection = ExtensionRejection;

    async fn from_request(
        request: Request,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = request.into_parts();
        let Extension(log) = Extension::<RequestLog>::from_request_parts(&mut parts, state).await?;
        let body = read_limited(
            &parts.headers,
            body,
            state.max_request_bytes,
            state.body_timeout,
        )
        .await;
        Ok(Self {
            state: state.clone(),
            log,
            body,
        })
    }
}
