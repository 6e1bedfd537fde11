//! A generation as OpenAI's reply: one JSON object, or a stream of server-sent events ending
//! in `data: [DONE]`. A request for `n` choices gets them all in one object (`choices[i]`),
//! or streamed as they come, each chunk naming its choice's `index`; its usage counts the
//! prompt once and the completion tokens of all choices.

use super::logprobs;
use super::request::Validated;
use super::response::{chat_choice, completion_choice, Header};
use crate::serve::choices::total_usage;
use crate::serve::dialect::Dialect;
use crate::serve::generation::{self, choices_body, Ending, Generation, Output, Step};
use crate::serve::job::Usage;
use crate::serve::request_log::RequestLog;
use crate::serve::scheduler::Scheduler;
use crate::tool_calls::{from_events, Event as Delta};
use axum::body::Bytes;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::future::try_join_all;
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
    let started =
        generation::start_choices(scheduler, &request, request.choices, output, log).await;
    let started = match started {
        Ok(started) => started,
        Err(e) => return Dialect::OpenAi.error(e),
    };
    let shape = if chat { Shape::Chat } else { Shape::Completion };
    let header = Header::new(if chat { "chatcmpl" } else { "cmpl" }, model);
    let echo = request.echo.unwrap_or_default();
    if request.stream {
        stream(started, header, shape, request.include_usage, echo)
    } else {
        whole(started, header, shape, echo).await
    }
}

/// Puts a choice's log-probabilities into its choice object (whole or in a chunk).
fn with_logprobs(choice: &mut Json, shape: Shape, ending: &Ending) {
    if let Some(l) = &ending.logprobs {
        choice["logprobs"] = match shape {
            Shape::Chat => logprobs::chat(l),
            Shape::Completion => logprobs::completion(l),
        };
    }
}

async fn whole(
    started: Vec<(Generation, Vec<Delta>)>,
    header: Header,
    shape: Shape,
    echo: String,
) -> Response {
    // The first choice to fail fails the request (the others are dropped: cancelled).
    let collected = try_join_all(started.into_iter().map(|(g, opening)| g.collect(opening)));
    let collected = match collected.await {
        Ok(collected) => collected,
        Err(e) => return Dialect::OpenAi.error(e),
    };
    let mut choices = vec![];
    let mut usages = vec![];
    for (index, (deltas, ending)) in collected.into_iter().enumerate() {
        let reason = finish_reason(shape, &ending);
        let mut choice = match shape {
            Shape::Chat => chat_choice(index, from_events(deltas).to_openai_message(), reason),
            Shape::Completion => {
                let text: String = std::iter::once(echo.as_str())
                    .chain(deltas.iter().filter_map(|d| match d {
                        Delta::Content(t) => Some(t.as_str()),
                        _ => None,
                    }))
                    .collect();
                completion_choice(index, &text, Some(reason))
            }
        };
        with_logprobs(&mut choice, shape, &ending);
        choices.push(choice);
        usages.push(ending.usage);
    }
    let usage = total_usage(&usages);
    let body = match shape {
        Shape::Chat => header.chat(choices, &usage),
        Shape::Completion => header.completion(choices, Some(&usage)),
    };
    axum::Json(body).into_response()
}

fn stream(
    started: Vec<(Generation, Vec<Delta>)>,
    header: Header,
    shape: Shape,
    include_usage: bool,
    echo: String,
) -> Response {
    let mut first = vec![];
    let mut generations = vec![];
    for (index, (generation, opening)) in started.into_iter().enumerate() {
        match shape {
            Shape::Chat => first.push(sse(&header.chat_chunk(
                index,
                json!({"role": "assistant", "content": ""}),
                None,
            ))),
            Shape::Completion if !echo.is_empty() => first.push(sse(
                &header.completion(vec![completion_choice(index, &echo, None)], None)
            )),
            Shape::Completion => {}
        }
        first.extend(chunks(&header, shape, index, &opening));
        generations.push(generation);
    }
    // Each choice's usage, once it has ended: the last to end closes the stream.
    let mut usages: Vec<Option<Usage>> = vec![None; generations.len()];
    let body = choices_body(generations, first, move |index, step| match step {
        Step::Deltas(deltas) => chunks(&header, shape, index, &deltas),
        Step::Done(ending) => {
            let reason = finish_reason(shape, &ending);
            let (mut last, object) = match shape {
                Shape::Chat => (
                    header.chat_chunk(index, json!({}), Some(reason)),
                    "chat.completion.chunk",
                ),
                Shape::Completion => (
                    header.completion(vec![completion_choice(index, "", Some(reason))], None),
                    "text_completion",
                ),
            };
            // The log-probabilities come once the generation is over, in its last chunk.
            with_logprobs(&mut last["choices"][0], shape, &ending);
            let mut out = vec![sse(&last)];
            usages[index] = Some(ending.usage);
            let ended: Option<Vec<Usage>> = usages.iter().copied().collect();
            if let Some(ended) = ended {
                if include_usage {
                    out.push(sse(&header.usage_chunk(object, &total_usage(&ended))));
                }
                out.push(done());
            }
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

fn chunks(header: &Header, shape: Shape, index: usize, deltas: &[Delta]) -> Vec<Bytes> {
    deltas
        .iter()
        .filter_map(|d| match shape {
            Shape::Chat => Some(sse(&header.chat_chunk(index, chat_delta(d), None))),
            Shape::Completion => match d {
                Delta::Content(t) => Some(sse(
                    &header.completion(vec![completion_choice(index, t, None)], None)
                )),
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
