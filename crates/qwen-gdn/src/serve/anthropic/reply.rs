//! A generation as Anthropic's reply: a `message` object, or its stream of server-sent events
//! (`message_start`, then per content block `content_block_start`, `content_block_delta`*,
//! `content_block_stop`, then `message_delta` with the stop reason and usage, and
//! `message_stop`; an `error` event if the generation fails midway).
//!
//! Thinking becomes `thinking` blocks, the answer `text` blocks and each tool call a `tool_use`
//! block (its input streamed whole as one `input_json_delta`). `usage.input_tokens` counts the
//! prompt tokens that were prefilled and `cache_read_input_tokens` those taken from the prompt
//! cache, as Anthropic splits them.

use super::error::error_event;
use crate::serve::dialect::Dialect;
use crate::serve::generation::{self, Ending, Output, Step};
use crate::serve::job::{Finish, Usage};
use crate::serve::openai::request::Validated;
use crate::serve::openai::response::new_id;
use crate::serve::request_log::RequestLog;
use crate::serve::scheduler::Scheduler;
use crate::tool_calls::Event as Delta;
use axum::body::Bytes;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value as Json};

pub async fn respond(
    scheduler: &Scheduler,
    request: Validated,
    model: String,
    log: Option<RequestLog>,
) -> Response {
    let (generation, opening) =
        match generation::start(scheduler, &request, Output::Chat, log).await {
            Ok(started) => started,
            Err(e) => return Dialect::Anthropic.error(e),
        };
    let id = new_id("msg");
    if !request.stream {
        let (deltas, ending) = match generation.collect(opening).await {
            Ok(whole) => whole,
            Err(e) => return Dialect::Anthropic.error(e),
        };
        let mut message = message(&id, &model, content(&deltas), Some(&ending));
        message["usage"] = usage(&ending.usage);
        return axum::Json(message).into_response();
    }
    let mut start = message(&id, &model, vec![], None);
    start["usage"] = json!({
        "input_tokens": generation.info.prompt_tokens,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    });
    let mut blocks = Blocks::default();
    let mut first = vec![
        event(
            "message_start",
            &json!({"type": "message_start", "message": start}),
        ),
        event("ping", &json!({"type": "ping"})),
    ];
    first.extend(opening.iter().flat_map(|d| blocks.push(d)));
    let body = generation.into_body(first, move |step| match step {
        Step::Deltas(deltas) => deltas.iter().flat_map(|d| blocks.push(d)).collect(),
        Step::Done(ending) => {
            let mut out = blocks.close();
            let (stop_reason, stop_sequence) = stop_reason(&ending);
            let mut usage = usage(&ending.usage);
            usage["output_tokens"] = ending.usage.completion_tokens.into();
            out.push(event(
                "message_delta",
                &json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": usage,
                }),
            ));
            out.push(event("message_stop", &json!({"type": "message_stop"})));
            out
        }
        Step::Failed(e) => vec![error_event(&e)],
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn event(name: &str, data: &Json) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// A `message` object; `ending` None: the start of a stream (no stop reason yet).
fn message(id: &str, model: &str, content: Vec<Json>, ending: Option<&Ending>) -> Json {
    let (stop_reason, stop_sequence) = match ending {
        Some(e) => {
            let (reason, sequence) = stop_reason(e);
            (Json::from(reason), Json::from(sequence))
        }
        None => (Json::Null, Json::Null),
    };
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
    })
}

fn stop_reason(ending: &Ending) -> (&'static str, Option<String>) {
    if ending.called_tools() {
        return ("tool_use", None);
    }
    match (ending.finish, &ending.stop_sequence) {
        (Finish::Length, _) => ("max_tokens", None),
        (_, Some(stop)) => ("stop_sequence", Some(stop.clone())),
        _ => ("end_turn", None),
    }
}

fn usage(u: &Usage) -> Json {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
    })
}

/// A call's arguments as the `input` object (a call's arguments always parse: the parser
/// made them).
fn input(arguments_json: &str) -> Json {
    serde_json::from_str::<Map<String, Json>>(arguments_json)
        .map(Json::Object)
        .unwrap_or_else(|_| json!({}))
}

/// The content blocks of a whole reply: runs of thinking and of text each make one block.
fn content(deltas: &[Delta]) -> Vec<Json> {
    let mut blocks: Vec<Json> = Vec::new();
    for d in deltas {
        let last = blocks.last_mut();
        match d {
            Delta::Content(t) => match last {
                Some(b) if b["type"] == "text" => {
                    let text = b["text"].as_str().unwrap_or_default().to_string() + t;
                    b["text"] = text.into();
                }
                _ => blocks.push(json!({"type": "text", "text": t})),
            },
            Delta::Reasoning(t) => match last {
                Some(b) if b["type"] == "thinking" => {
                    let text = b["thinking"].as_str().unwrap_or_default().to_string() + t;
                    b["thinking"] = text.into();
                }
                _ => blocks.push(json!({"type": "thinking", "thinking": t, "signature": ""})),
            },
            Delta::ToolCall(call) => blocks.push(json!({
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": input(&call.arguments_json),
            })),
        }
    }
    blocks
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
}

/// The streamed content blocks: which one is open, and the next block's index.
#[derive(Default)]
struct Blocks {
    open: Option<Open>,
    next: usize,
}

impl Blocks {
    fn start(&mut self, block: Json) -> Bytes {
        let index = self.next;
        self.next += 1;
        event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        )
    }

    fn delta(&self, delta: Json) -> Bytes {
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.next - 1, "delta": delta}),
        )
    }

    fn close(&mut self) -> Vec<Bytes> {
        match self.open.take() {
            None => vec![],
            Some(_) => vec![event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.next - 1}),
            )],
        }
    }

    /// Opens a block of `kind` unless one is open.
    fn open(&mut self, kind: Open) -> Vec<Bytes> {
        if self.open == Some(kind) {
            return vec![];
        }
        let mut out = self.close();
        out.push(self.start(match kind {
            Open::Text => json!({"type": "text", "text": ""}),
            Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
        }));
        self.open = Some(kind);
        out
    }

    fn push(&mut self, d: &Delta) -> Vec<Bytes> {
        match d {
            Delta::Content(t) => {
                let mut out = self.open(Open::Text);
                out.push(self.delta(json!({"type": "text_delta", "text": t})));
                out
            }
            Delta::Reasoning(t) => {
                let mut out = self.open(Open::Thinking);
                out.push(self.delta(json!({"type": "thinking_delta", "thinking": t})));
                out
            }
            Delta::ToolCall(call) => {
                let mut out = self.close();
                out.push(self.start(json!({
                    "type": "tool_use", "id": call.id, "name": call.name, "input": {},
                })));
                out.push(self.delta(
                    json!({"type": "input_json_delta", "partial_json": call.arguments_json}),
                ));
                out.push(event(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": self.next - 1}),
                ));
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::ToolCall;

    fn call() -> ToolCall {
        ToolCall {
            index: 0,
            id: "call_1".into(),
            name: "f".into(),
            arguments_json: r#"{"x":1}"#.into(),
        }
    }

    #[test]
    fn runs_of_text_and_thinking_make_one_block_each() {
        let deltas = [
            Delta::Reasoning("a".into()),
            Delta::Reasoning("b".into()),
            Delta::Content("c".into()),
            Delta::Content("d".into()),
            Delta::ToolCall(call()),
        ];
        assert_eq!(
            content(&deltas),
            vec![
                json!({"type": "thinking", "thinking": "ab", "signature": ""}),
                json!({"type": "text", "text": "cd"}),
                json!({"type": "tool_use", "id": "call_1", "name": "f", "input": {"x": 1}}),
            ]
        );
    }

    #[test]
    fn streamed_blocks_open_and_close_in_order() {
        let mut blocks = Blocks::default();
        let mut events: Vec<String> = vec![];
        for d in [
            Delta::Reasoning("a".into()),
            Delta::Content("c".into()),
            Delta::Content("d".into()),
            Delta::ToolCall(call()),
        ] {
            events.extend(
                blocks
                    .push(&d)
                    .iter()
                    .map(|b| String::from_utf8_lossy(b).into()),
            );
        }
        events.extend(
            blocks
                .close()
                .iter()
                .map(|b| String::from_utf8_lossy(b).into()),
        );
        let names: Vec<&str> = events
            .iter()
            .map(|e| e.lines().next().unwrap().trim_start_matches("event: "))
            .collect();
        assert_eq!(
            names,
            [
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
            ]
        );
        assert!(events[7].contains(r#""index":2"#), "{}", events[7]);
        assert!(
            events[8].contains(r#""partial_json":"{\"x\":1}""#),
            "{}",
            events[8]
        );
    }

    #[test]
    fn usage_splits_cached_tokens() {
        let u = usage(&Usage {
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 3,
            ..Usage::default()
        });
        assert_eq!(
            u,
            json!({"input_tokens": 6, "output_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4})
        );
    }
}
