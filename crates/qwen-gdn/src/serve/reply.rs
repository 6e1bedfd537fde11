//! Turns a job's events into the HTTP reply: one JSON object, or a stream of server-sent
//! events ending in `data: [DONE]`. The reply owns the job's cancel guard, so when the client
//! disconnects (the handler future or the SSE body is dropped) the generation stops at its
//! next token.

use super::error::ApiError;
use super::job::{Event, Finish, PromptInfo, Usage};
use super::request::Validated;
use super::response::Header;
use super::scheduler::Ticket;
use crate::tool_calls::{from_events, Event as Delta, OutputParser, ParserOptions, ToolSchemas};
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value as Json};
use std::convert::Infallible;

/// Chat replies parse the output into content, reasoning and tool calls (the parser is
/// taken when the output ends); completion replies return it as it is.
enum Shape {
    Chat {
        parser: Option<Box<OutputParser>>,
        calls: usize,
    },
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
    let mut opening = vec![];
    let shape = if chat {
        let recognised = request
            .tool_choice
            .recognises_calls(!request.tools.is_empty());
        let mut parser = OutputParser::new(ParserOptions {
            reasoning: info.reasoning,
            tools: recognised.then(|| ToolSchemas::from_tools(&request.tools)),
        });
        // A call the server opened in the prompt is part of the reply.
        if let Some(text) = &info.forced_opening {
            opening = parser.push(text);
        }
        Shape::Chat {
            parser: Some(Box::new(parser)),
            calls: 0,
        }
    } else {
        Shape::Completion
    };
    let mut reply = Reply {
        ticket,
        header: Header::new(if chat { "chatcmpl" } else { "cmpl" }, model),
        shape,
        include_usage: request.include_usage,
    };
    reply.count_calls(&opening);
    if request.stream {
        reply.stream(opening)
    } else {
        reply.whole(opening).await
    }
}

impl Reply {
    async fn whole(mut self, opening: Vec<Delta>) -> Response {
        let mut deltas = opening;
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
            Shape::Chat { .. } => {
                let message = from_events(deltas).to_openai_message();
                self.header.chat(message, reason, &usage)
            }
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

    fn stream(self, opening: Vec<Delta>) -> Response {
        let mut first = match &self.shape {
            Shape::Chat { .. } => vec![sse(&self
                .header
                .chat_chunk(json!({"role": "assistant", "content": ""}), None))],
            Shape::Completion => vec![],
        };
        first.extend(self.chunks(&opening));
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
        let deltas = match &mut self.shape {
            Shape::Chat { parser, .. } => parser.as_mut().map_or_else(Vec::new, |p| p.push(text)),
            Shape::Completion => vec![Delta::Content(text.to_string())],
        };
        self.count_calls(&deltas);
        deltas
    }

    fn finish_parse(&mut self) -> Vec<Delta> {
        let deltas = match &mut self.shape {
            Shape::Chat { parser, .. } => parser.take().map_or_else(Vec::new, |p| p.finish()),
            Shape::Completion => vec![],
        };
        self.count_calls(&deltas);
        deltas
    }

    fn count_calls(&mut self, deltas: &[Delta]) {
        if let Shape::Chat { calls, .. } = &mut self.shape {
            *calls += deltas
                .iter()
                .filter(|d| matches!(d, Delta::ToolCall(_)))
                .count();
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

fn chat_delta(d: &Delta) -> Json {
    match d {
        Delta::Content(t) => json!({"content": t}),
        Delta::Reasoning(t) => json!({"reasoning_content": t}),
        Delta::ToolCall(call) => json!({"tool_calls": [call.to_openai_delta()]}),
    }
}
