//! A generation as Ollama's reply: one JSON object, or (the default) newline-delimited JSON
//! objects with `"done": false`, the last with `"done": true`, the stop reason, token counts
//! and durations in nanoseconds. `/api/chat` puts the text in `message.content` (thinking in
//! `message.thinking`, calls in `message.tool_calls`), `/api/generate` in `response` (and
//! `thinking`). A generation that fails midway ends the stream with `{"error": "..."}`.

use super::error::error_body;
use crate::serve::dialect::Dialect;
use crate::serve::generation::{self, Ending, Output, Step};
use crate::serve::job::Finish;
use crate::serve::openai::request::Validated;
use crate::serve::request_log::RequestLog;
use crate::serve::scheduler::Scheduler;
use crate::tool_calls::Event as Delta;
use axum::body::Bytes;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value as Json};
use std::time::SystemTime;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Generate,
}

pub async fn respond(
    scheduler: &Scheduler,
    request: Validated,
    output: Output,
    endpoint: Endpoint,
    model: String,
    log: Option<RequestLog>,
) -> Response {
    let (generation, opening) = match generation::start(scheduler, &request, output, log).await {
        Ok(started) => started,
        Err(e) => return Dialect::Ollama.error(e),
    };
    let reply = Reply { endpoint, model };
    if !request.stream {
        let (deltas, ending) = match generation.collect(opening).await {
            Ok(whole) => whole,
            Err(e) => return Dialect::Ollama.error(e),
        };
        return axum::Json(reply.last(&deltas, Some(&ending))).into_response();
    }
    let first: Vec<Bytes> = (!opening.is_empty())
        .then(|| line(&reply.last(&opening, None)))
        .into_iter()
        .collect();
    let body = generation.into_body(first, move |step| match step {
        Step::Deltas(deltas) => vec![line(&reply.last(&deltas, None))],
        Step::Done(ending) => vec![line(&reply.last(&[], Some(&ending)))],
        Step::Failed(e) => vec![line(&error_body(&e))],
    });
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

fn line(value: &Json) -> Bytes {
    Bytes::from(format!("{value}\n"))
}

pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_nanos(SystemTime::now()).to_string()
}

struct Reply {
    endpoint: Endpoint,
    model: String,
}

impl Reply {
    /// An object with `deltas` (all of a reply, or one streamed piece); `ending` Some: the
    /// last one, with `done: true` and the statistics.
    fn last(&self, deltas: &[Delta], ending: Option<&Ending>) -> Json {
        let (mut content, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
        for d in deltas {
            match d {
                Delta::Content(t) => content.push_str(t),
                Delta::Reasoning(t) => thinking.push_str(t),
                Delta::ToolCall(call) => calls.push(json!({
                    "id": call.id,
                    "function": {
                        "index": call.index,
                        "name": call.name,
                        "arguments": serde_json::from_str::<Map<String, Json>>(&call.arguments_json)
                            .map(Json::Object)
                            .unwrap_or_else(|_| json!({})),
                    },
                })),
            }
        }
        let mut body = Map::new();
        body.insert("model".into(), self.model.clone().into());
        body.insert("created_at".into(), now_rfc3339().into());
        match self.endpoint {
            Endpoint::Chat => {
                let mut message = Map::new();
                message.insert("role".into(), "assistant".into());
                message.insert("content".into(), content.into());
                if !thinking.is_empty() {
                    message.insert("thinking".into(), thinking.into());
                }
                if !calls.is_empty() {
                    message.insert("tool_calls".into(), calls.into());
                }
                body.insert("message".into(), message.into());
            }
            Endpoint::Generate => {
                body.insert("response".into(), content.into());
                if !thinking.is_empty() {
                    body.insert("thinking".into(), thinking.into());
                }
            }
        }
        body.insert("done".into(), ending.is_some().into());
        if let Some(e) = ending {
            let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            let reason = match e.finish {
                Finish::Length => "length",
                Finish::Stop | Finish::Cancelled => "stop",
            };
            body.insert("done_reason".into(), reason.into());
            body.insert("total_duration".into(), nanos(e.total).into());
            body.insert("load_duration".into(), 0.into());
            body.insert("prompt_eval_count".into(), e.usage.prompt_tokens.into());
            body.insert("prompt_eval_duration".into(), nanos(e.prompt_time).into());
            body.insert("eval_count".into(), e.usage.completion_tokens.into());
            body.insert("eval_duration".into(), nanos(e.eval_time).into());
        }
        Json::Object(body)
    }
}

/// The answer to a request with nothing to generate (no messages, an empty prompt): Ollama
/// loads the model and says so.
pub fn load_only(endpoint: Endpoint, model: String) -> Response {
    let reply = Reply { endpoint, model };
    let mut body = reply.last(&[], None);
    body["done"] = true.into();
    body["done_reason"] = "load".into();
    axum::Json(body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::job::Usage;
    use std::time::Duration;

    #[test]
    fn the_last_object_carries_the_statistics() {
        let reply = Reply {
            endpoint: Endpoint::Chat,
            model: "m".into(),
        };
        let ending = Ending {
            finish: Finish::Length,
            usage: Usage {
                prompt_tokens: 5,
                cached_tokens: 0,
                completion_tokens: 3,
                ..Usage::default()
            },
            stop_sequence: None,
            tool_calls: 0,
            total: Duration::from_millis(3),
            prompt_time: Duration::from_millis(1),
            eval_time: Duration::from_millis(2),
            logprobs: None,
        };
        let body = reply.last(
            &[Delta::Reasoning("r".into()), Delta::Content("c".into())],
            Some(&ending),
        );
        assert_eq!(
            body["message"],
            json!({"role": "assistant", "content": "c", "thinking": "r"})
        );
        assert_eq!(body["done"], true);
        assert_eq!(body["done_reason"], "length");
        assert_eq!(body["prompt_eval_count"], 5);
        assert_eq!(body["eval_count"], 3);
        assert_eq!(body["total_duration"], 3_000_000);
        let piece = Reply {
            endpoint: Endpoint::Generate,
            model: "m".into(),
        }
        .last(&[Delta::Content("x".into())], None);
        assert_eq!(piece["response"], "x");
        assert_eq!(piece["done"], false);
        assert!(piece.get("done_reason").is_none());
    }
}
