//! Ollama's endpoints about the model rather than a generation: `GET /api/tags` (the served
//! names), `POST /api/show` (details, template, capabilities, default parameters) and
//! `GET /api/version`.

use super::request::resolve_model;
use crate::serve::dialect::Dialect;
use crate::serve::openai::request::{json_object, typed};
use crate::serve::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value as Json};
use std::sync::Arc;

/// The Ollama release whose API this server follows: clients compare it to the version that
/// brought a feature (`think`, tool calls), so it is Ollama's numbering, not qwen-gdn's.
pub const OLLAMA_API_VERSION: &str = "0.12.0";

fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

pub async fn tags(State(state): State<Arc<AppState>>) -> Response {
    let facts = &state.model;
    let models: Vec<Json> = state
        .limits
        .model_names
        .iter()
        .map(|name| {
            json!({
                "name": name,
                "model": name,
                "modified_at": rfc3339(facts.modified),
                "size": facts.size,
                "digest": facts.digest(),
                "details": facts.details(),
            })
        })
        .collect();
    axum::Json(json!({"models": models})).into_response()
}

pub async fn version() -> Response {
    axum::Json(json!({"version": OLLAMA_API_VERSION})).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShowBody {
    /// `name` is the older spelling.
    #[serde(alias = "name")]
    model: String,
    verbose: Option<bool>,
}

pub async fn show(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let read = crate::serve::body::read_limited(
        &headers,
        body,
        state.max_request_bytes,
        state.body_timeout,
    )
    .await;
    let shown = read
        .and_then(|b| json_object(&b))
        .and_then(|v| typed::<ShowBody>(&v))
        .and_then(|b| {
            let _ = b.verbose;
            resolve_model(&b.model, &state.limits)
        });
    if let Err(e) = shown {
        return Dialect::Ollama.error(e);
    }
    let facts = &state.model;
    let d = &state.limits.defaults;
    let mut parameters = format!(
        "temperature {}\ntop_p {}\ntop_k {}\nmin_p {}",
        d.temperature, d.top_p, d.top_k, d.min_p
    );
    parameters.push_str(&format!(
        "\nnum_predict {}",
        state.limits.default_max_tokens
    ));
    let family = &facts.family;
    let mut model_info = serde_json::Map::new();
    model_info.insert("general.architecture".into(), family.clone().into());
    model_info.insert(
        format!("{family}.context_length"),
        facts.context_length.into(),
    );
    axum::Json(json!({
        "modelfile": "",
        "parameters": parameters,
        "template": facts.template.clone().unwrap_or_default(),
        "details": facts.details(),
        "model_info": model_info,
        "capabilities": facts.capabilities,
        "modified_at": rfc3339(facts.modified),
    }))
    .into_response()
}
