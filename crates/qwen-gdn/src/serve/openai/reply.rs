//! A generation as OpenAI's reply: one JSON object, or a stream of server-sent events ending
//! in `data: [DONE]`.

use super::logprobs;
use super::request::Validated;
use super::response::Header;
use crate::serve::dialect::Dialect;
use crate::serve::generation::{self, Ending, Generation, Output, Step};
use crate::serve::request_log::RequestLog;
use crate::serve::scheduler::Scheduler;
use crate::tool_calls::{from_events, Event as Delta};
use axum::body::Bytes;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value as Json};

/// Chat replies parse the output into content, reasoning and tool calls; completion replies
/// return it as it is.
#[derive(Clone, Copy)]
enum Shape {
    Chat,
    Completion,
}

pub async fn respond(
    scheduler: &Scheduler,
    request: Validated,
    model: &str,
    chat: bool,
    log: Option<RequestLog>,
) -> Response {
    let output = if chat { Output::Chat } else { Output::Text };
    let (generation, opening) = match generation::start(scheduler, &request, output, log).await {
        Ok(started) => started,
        Err(e) => return Dialect::OpenAi.error(e),
    };
    let shape = if chat { Shape::Chat } else { Shape::Completion };
    let header = Header::new(if chat { "chatcmpl" } else { "cmpl" }, model);
    let echo = request.echo.unwrap_or_default();
    if request.stream {
        stream(
            generation,
            opening,
            header,
            shape,
            request.include_usage,
            echo,
        )
    } else {
        whole(generation, opening, header, shape, echo).await
    }
}

/// Puts the choice's log-probabilities into a chat or completion body (or chunk).
fn with_logprobs(mut body: Json, shape: Shape, ending: &Ending) -> Json {
    if let Some(l) = &ending.logprobs {
        body["choices"][0]["logprobs"] = match shape {
            Shape::Chat => logprobs::chat(l),
            Shape::Completion => logprobs::completion(l),
        };
    }
    body
}

async fn whole(
    generation: Generation,
    opening: Vec<Delta>,
    header: Header,
    shape: Shape,
    echo: String,
) -> Response {
    let (deltas, ending) = match generation.collect(opening).await {
        Ok(whole) => whole,
        Err(e) => return Dialect::OpenAi.error(e),
    };
    let reason = finish_reason(shape, &ending);
    let body = match shape {
        Shape::Chat => header.chat(
            from_events(deltas).to_openai_message(),
            reason,
            &ending.usage,
        ),
        Shape::Completion => {
            let text: String = std::iter::once(echo.as_str())
                .chain(deltas.iter().filter_map(|d| match d {
                    Delta::Content(t) => Some(t.as_str()),
                    _ => None,
                }))
                .collect();
            header.completion(&text, Some(reason), Some(&ending.usage))
        }
    };
    axum::Json(with_logprobs(body, shape, &ending)).into_response()
}

fn stream(
    generation: Generation,
    opening: Vec<Delta>,
    header: Header,
    shape: Shape,
    include_usage: bool,
    echo: String,
) -> Response {
    let mut first = match shape {
        Shape::Chat => vec![sse(
            &header.chat_chunk(json!({"role": "assistant", "content": ""}), None)
        )],
        Shape::Completion if !echo.is_empty() => vec![sse(&header.completion(&echo, None, None))],
        Shape::Completion => vec![],
    };
    first.extend(chunks(&header, shape, &opening));
    let body = generation.into_body(first, move |step| match step {
        Step::Deltas(deltas) => chunks(&header, shape, &deltas),
        Step::Done(ending) => {
            let reason = finish_reason(shape, &ending);
            let (last, object) = match shape {
                Shape::Chat => (
                    header.chat_chunk(json!({}), Some(reason)),
                    "chat.completion.chunk",
                ),
                Shape::Completion => (header.completion("", Some(reason), None), "text_completion"),
            };
            // The log-probabilities come once the generation is over, in the last chunk.
            let mut out = vec![sse(&with_logprobs(last, shape, &ending))];
            if include_usage {
                out.push(sse(&header.usage_chunk(object, &ending.usage)));
            }
            out.push(done());
            out
        }
        Step::Failed(e) => vec![sse(&e.body()), done()],
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

/// "tool_calls" when a chat reply made any, as OpenAI reports it.
fn finish_reason(shape: Shape, ending: &Ending) -> &'static str {
    match shape {
        Shape::Chat if ending.called_tools() => "tool_calls",
        _ => ending.finish.reason(),
    }
}

fn chunks(header: &Header, shape: Shape, deltas: &[Delta]) -> Vec<Bytes> {
    deltas
        .iter()
        .filter_map(|d| match shape {
            Shape::Chat => Some(sse(&header.chat_chunk(chat_delta(d), None))),
            Shape::Completion => match d {
                Delta::Content(t) => Some(sse(&header.completion(t, None, None))),
                _ => None,
            },
        })
        .collect()
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
