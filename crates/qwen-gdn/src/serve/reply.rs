//! Turns a job's events into the HTTP reply: one JSON object, or a stream of server-sent
//! events ending in `data: [DONE]`. The reply owns the job's cancel guard, so when the client
//! disconnects (the handler future or the SSE body is dropped) the generation stops at its
//! next token.

use super::error::ApiError;
use super::job::{Event, Finish, PromptInfo, Usage};
use super::output_parser::{Delta, OutputParser};
use super::request::Validated;
use super::response::Header;
use super::scheduler::Ticket;
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Map, Value as Json};
use std::convert::Infallible;

/// Chat replies parse the output; completion replies return it as it is.
enum Shape {
    Chat { parser: OutputParser, calls: usize },
    Completion,
}

struct Reply {
    ticket: Ticket,
    header: Header,
    shape: Shape,
    include_usage: bool,
}

/// Waits for the worker to take up the job: errors found while preparing the prompt (e.g.
/// context_length_exceeded) are still plain HTTP errors, not events of a 200 stream.
async fn started(ticket: &mut Ticket) -> Result<PromptInfo, ApiError> {
    match ticket.events.recv().await {
        Some(Event::Prompt(info)) => Ok(info),
        Some(Event::Failed(e)) => Err(e),
        Some(other) => Err(ApiError::internal(format!("unexpected event {other:?}"))),
        None => Err(ApiError::internal(
            "the generation worker dropped the request",
        )),
    }
}

pub async fn respond(mut ticket: Ticket, request: Validated, model: &str, chat: bool) -> Response {
    let info = match started(&mut ticket).await {
        Ok(info) => info,
        Err(e) => return e.into_response(),
    };
    let shape = if chat {
        Shape::Chat {
            parser: OutputParser::new(&request.tools, info.opens_thinking),
            calls: 0,
        }
    } else {
        Shape::Completion
    };
    let reply = Reply {
        ticket,
        header: Header::new(if chat { "chatcmpl" } else { "cmpl" }, model),
        shape,
        include_usage: request.include_usage,
    };
    if request.stream {
        reply.stream()
    } else {
        reply.whole().await
    }
}

impl Reply {
    async fn whole(mut self) -> Response {
        let mut deltas = Vec::new();
        let (finish, usage) = loop {
            match self.ticket.events.recv().await {
                Some(Event::Text(text)) => deltas.extend(self.parse(&text)),
                Some(Event::Done { finish, usage }) => break (finish, usage),
                Some(Event::Failed(e)) => return e.into_response(),
                Some(Event::Prompt(_)) => {}
                None => {
                    return ApiError::internal("the generation worker dropped the request")
                        .into_response()
                }
            }
        };
        deltas.extend(self.finish_parse());
        let reason = self.finish_reason(finish);
        let body = match &self.shape {
            Shape::Chat { .. } => self.header.chat(message(&deltas), reason, &usage),
            Shape::Completion => {
                let text: String = deltas
                    .iter()
                    .filter_map(|d| match d {
                        Delta::Content(t) => Some(t.as_str()),
                        _ => None,
                    })
                    .collect();
                self.header.completion(&text, Some(reason), Some(&usage))
            }
        };
        axum::Json(body).into_response()
    }

    fn stream(self) -> Response {
        let first = match &self.shape {
            Shape::Chat { .. } => vec![sse(&self
                .header
                .chat_chunk(json!({"role": "assistant", "content": ""}), None))],
            Shape::Completion => vec![],
        };
        let events = stream::unfold(Some(self), |state| async move {
            let mut reply = state?;
            match reply.ticket.events.recv().await {
                Some(Event::Text(text)) => {
                    let deltas = reply.parse(&text);
                    let chunks = reply.chunks(&deltas);
                    Some((chunks, Some(reply)))
                }
                Some(Event::Prompt(_)) => Some((vec![], Some(reply))),
                Some(Event::Done { finish, usage }) => {
                    let chunks = reply.last_chunks(finish, &usage);
                    Some((chunks, None))
                }
                Some(Event::Failed(e)) => Some((vec![sse(&e.body()), done()], None)),
                None => Some((
                    vec![
                        sse(
                            &ApiError::internal("the generation worker dropped the request").body(),
                        ),
                        done(),
                    ],
                    None,
                )),
            }
        });
        let body = stream::iter(vec![first])
            .chain(events)
            .flat_map(stream::iter)
            .map(Ok::<Bytes, Infallible>);
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(body),
        )
            .into_response()
    }

    fn parse(&mut self, text: &str) -> Vec<Delta> {
        match &mut self.shape {
            Shape::Chat { parser, calls } => {
                let deltas = parser.push(text);
                *calls += deltas
                    .iter()
                    .filter(|d| matches!(d, Delta::ToolCall { .. }))
                    .count();
                deltas
            }
            Shape::Completion => vec![Delta::Content(text.to_string())],
        }
    }

    fn finish_parse(&mut self) -> Vec<Delta> {
        match &mut self.shape {
            Shape::Chat { parser, calls } => {
                let deltas = parser.finish();
                *calls += deltas
                    .iter()
                    .filter(|d| matches!(d, Delta::ToolCall { .. }))
                    .count();
                deltas
            }
            Shape::Completion => vec![],
        }
    }

    /// "tool_calls" when the reply made any, as OpenAI reports it.
    fn finish_reason(&self, finish: Finish) -> &'static str {
        match &self.shape {
            Shape::Chat { calls, .. } if *calls > 0 && finish != Finish::Length => "tool_calls",
            _ => finish.reason(),
        }
    }

    fn chunks(&self, deltas: &[Delta]) -> Vec<Bytes> {
        deltas
            .iter()
            .filter(|d| !matches!(d, Delta::Content(t) | Delta::Reasoning(t) if t.is_empty()))
            .map(|d| match &self.shape {
                Shape::Chat { .. } => sse(&self.header.chat_chunk(chat_delta(d), None)),
                Shape::Completion => match d {
                    Delta::Content(t) => sse(&self.header.completion(t, None, None)),
                    _ => Bytes::new(),
                },
            })
            .collect()
    }

    fn last_chunks(&mut self, finish: Finish, usage: &Usage) -> Vec<Bytes> {
        let deltas = self.finish_parse();
        let mut out = self.chunks(&deltas);
        let reason = self.finish_reason(finish);
        let (last, object) = match &self.shape {
            Shape::Chat { .. } => (
                self.header.chat_chunk(json!({}), Some(reason)),
                "chat.completion.chunk",
            ),
            Shape::Completion => (
                self.header.completion("", Some(reason), None),
                "text_completion",
            ),
        };
        out.push(sse(&last));
        if self.include_usage {
            out.push(sse(&self.header.usage_chunk(object, usage)));
        }
        out.push(done());
        out
    }
}

fn sse(value: &Json) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

fn tool_call_json(d: &Delta, with_index: bool) -> Json {
    let Delta::ToolCall {
        index,
        id,
        name,
        arguments,
    } = d
    else {
        return Json::Null;
    };
    let mut call =
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
    if with_index {
        call["index"] = json!(index);
    }
    call
}

fn chat_delta(d: &Delta) -> Json {
    match d {
        Delta::Content(t) => json!({"content": t}),
        Delta::Reasoning(t) => json!({"reasoning_content": t}),
        Delta::ToolCall { .. } => json!({"tool_calls": [tool_call_json(d, true)]}),
    }
}

/// The assistant message of a whole reply.
fn message(deltas: &[Delta]) -> Json {
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for d in deltas {
        match d {
            Delta::Content(t) => content.push_str(t),
            Delta::Reasoning(t) => reasoning.push_str(t),
            Delta::ToolCall { .. } => calls.push(tool_call_json(d, false)),
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), "assistant".into());
    // OpenAI sends null content for a reply that is only tool calls.
    let content = if content.is_empty() && !calls.is_empty() {
        Json::Null
    } else {
        content.into()
    };
    m.insert("content".into(), content);
    if !reasoning.is_empty() {
        m.insert("reasoning_content".into(), reasoning.into());
    }
    if !calls.is_empty() {
        m.insert("tool_calls".into(), calls.into());
    }
    Json::Object(m)
}
