//! One request's generation as every API sees it: the job queued, the worker's text parsed
//! into content, thinking and tool calls (the Qwen tool-call parsers), and the end (finish,
//! usage, the stop string that ended it, timings). The OpenAI, Anthropic and Ollama modules
//! only turn these steps into their wire format, whole or streamed.
//!
//! The generation owns the job's cancel guard: when the client disconnects (the handler
//! future or the streamed body is dropped) the generation stops at its next token.
//! A request for `n` choices is `n` generations of one prompt, run together; their steps are
//! merged into one body, each tagged with its choice's index.

use super::error::ApiError;
use super::job::{Event, Finish, Logprobs, PromptInfo, Usage};
use super::openai::request::Validated;
use super::request_log::RequestLog;
use super::scheduler::{Scheduler, Ticket};
use crate::tool_calls::{Event as Delta, OutputParser, ParserOptions, ToolSchemas};
use axum::body::{Body, Bytes};
use futures_util::stream::{self, StreamExt};
use std::convert::Infallible;
use std::time::{Duration, Instant};

/// How the output is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// A chat reply: thinking, content and (when the request has tools) tool calls.
    Chat,
    /// Raw text, all content (completions, Ollama's raw generate).
    Text,
}

pub struct Generation {
    ticket: Ticket,
    /// None for [`Output::Text`]; taken when the output ends.
    parser: Option<Box<OutputParser>>,
    output: Output,
    tool_calls: usize,
    stop: Vec<String>,
    stop_index: Option<usize>,
    pub info: PromptInfo,
    submitted: Instant,
    first_text: Option<Instant>,
    /// The end, held back while the parser's last deltas go out.
    ending: Option<Ending>,
    logprobs: Option<Logprobs>,
    over: bool,
}

/// What a generation gives, in order: Deltas*, then Done or Failed.
#[derive(Debug)]
pub enum Step {
    Deltas(Vec<Delta>),
    Done(Ending),
    Failed(ApiError),
}

#[derive(Debug, Clone)]
pub struct Ending {
    pub finish: Finish,
    pub usage: Usage,
    /// The stop string that ended the reply (the text does not contain it).
    pub stop_sequence: Option<String>,
    /// Tool calls in the reply.
    pub tool_calls: usize,
    /// From the request's arrival in the queue to the end.
    pub total: Duration,
    /// From the arrival to the first text (the whole time when there was none).
    pub prompt_time: Duration,
    /// From the first text to the end.
    pub eval_time: Duration,
    /// When the request asked for them.
    pub logprobs: Option<Logprobs>,
}

impl Ending {
    /// The reply is tool calls to run (not cut off by max_tokens): OpenAI's
    /// `finish_reason: "tool_calls"`, Anthropic's `stop_reason: "tool_use"`.
    pub fn called_tools(&self) -> bool {
        self.tool_calls > 0 && self.finish != Finish::Length
    }
}

/// Queues the request and waits for the worker to take it up: errors found while preparing
/// the prompt (e.g. context_length_exceeded) are still plain HTTP errors, not steps of a 200
/// stream. Returns the generation and the deltas of a call the server opened in the prompt
/// (part of the reply).
pub async fn start(
    scheduler: &Scheduler,
    request: &Validated,
    output: Output,
    log: Option<RequestLog>,
) -> Result<(Generation, Vec<Delta>), ApiError> {
    let mut started = start_choices(scheduler, request, 1, output, log).await?;
    Ok(started.pop().expect("one generation"))
}

/// [`start`] for `n` choices of the request's prompt, run together: a generation (and the
/// deltas of its opened call) per choice, in the choices' order.
pub async fn start_choices(
    scheduler: &Scheduler,
    request: &Validated,
    n: usize,
    output: Output,
    log: Option<RequestLog>,
) -> Result<Vec<(Generation, Vec<Delta>)>, ApiError> {
    let submitted = Instant::now();
    let tickets = scheduler.submit_choices(request.job.clone(), n, log)?;
    let mut started = vec![];
    for ticket in tickets {
        started.push(begin(ticket, request, output, submitted).await?);
    }
    Ok(started)
}

/// A queued choice's generation, once the worker has taken it up.
async fn begin(
    mut ticket: Ticket,
    request: &Validated,
    output: Output,
    submitted: Instant,
) -> Result<(Generation, Vec<Delta>), ApiError> {
    let info = match ticket.events.recv().await {
        Some(Event::Prompt(info)) => info,
        Some(Event::Failed(e)) => return Err(e),
        Some(other) => return Err(ApiError::internal(format!("unexpected event {other:?}"))),
        None => return Err(dropped()),
    };
    let mut opening = vec![];
    let parser = match output {
        Output::Chat => {
            let recognised = request
                .tool_choice
                .recognises_calls(!request.tools.is_empty());
            let mut parser = OutputParser::new(ParserOptions {
                reasoning: info.reasoning,
                tools: recognised.then(|| ToolSchemas::from_tools(&request.tools)),
            });
            if let Some(text) = &info.forced_opening {
                opening = parser.push(text);
            }
            Some(Box::new(parser))
        }
        Output::Text => None,
    };
    let mut generation = Generation {
        ticket,
        parser,
        output,
        tool_calls: 0,
        stop: request.job.stop.clone(),
        stop_index: None,
        info,
        submitted,
        first_text: None,
        ending: None,
        logprobs: None,
        over: false,
    };
    let opening = generation.keep(opening);
    Ok((generation, opening))
}

fn dropped() -> ApiError {
    ApiError::internal("the generation worker dropped the request")
}

impl Generation {
    /// The next step; None once Done or Failed was given.
    pub async fn next(&mut self) -> Option<Step> {
        if let Some(ending) = self.ending.take() {
            self.over = true;
            return Some(Step::Done(ending));
        }
        if self.over {
            return None;
        }
        loop {
            match self.ticket.events.recv().await {
                Some(Event::Text(text)) => {
                    self.first_text.get_or_insert_with(Instant::now);
                    let deltas = match &mut self.parser {
                        Some(parser) => parser.push(&text),
                        None if self.output == Output::Text => vec![Delta::Content(text)],
                        None => vec![],
                    };
                    let deltas = self.keep(deltas);
                    if !deltas.is_empty() {
                        return Some(Step::Deltas(deltas));
                    }
                }
                Some(Event::Prompt(_)) => {}
                Some(Event::StopString(index)) => self.stop_index = Some(index),
                Some(Event::Logprobs(logprobs)) => self.logprobs = Some(logprobs),
                Some(Event::Done { finish, usage }) => {
                    let last = self.parser.take().map_or_else(Vec::new, |p| p.finish());
                    let last = self.keep(last);
                    let ending = self.ending(finish, usage);
                    if last.is_empty() {
                        self.over = true;
                        return Some(Step::Done(ending));
                    }
                    self.ending = Some(ending);
                    return Some(Step::Deltas(last));
                }
                Some(Event::Failed(e)) => {
                    self.over = true;
                    return Some(Step::Failed(e));
                }
                None => {
                    self.over = true;
                    return Some(Step::Failed(dropped()));
                }
            }
        }
    }

    /// The whole reply: its deltas (after `opening`) and its end.
    pub async fn collect(mut self, opening: Vec<Delta>) -> Result<(Vec<Delta>, Ending), ApiError> {
        let mut deltas = opening;
        while let Some(step) = self.next().await {
            match step {
                Step::Deltas(d) => deltas.extend(d),
                Step::Done(ending) => return Ok((deltas, ending)),
                Step::Failed(e) => return Err(e),
            }
        }
        Err(dropped())
    }

    /// A streamed body: `first`, then what `render` makes of each step, until the end.
    pub fn into_body(
        self,
        first: Vec<Bytes>,
        mut render: impl FnMut(Step) -> Vec<Bytes> + Send + 'static,
    ) -> Body {
        choices_body(vec![self], first, move |_, step| render(step))
    }

    /// Drops empty text pieces and counts the calls.
    fn keep(&mut self, deltas: Vec<Delta>) -> Vec<Delta> {
        let deltas: Vec<Delta> = deltas
            .into_iter()
            .filter(|d| !matches!(d, Delta::Content(t) | Delta::Reasoning(t) if t.is_empty()))
            .collect();
        self.tool_calls += deltas
            .iter()
            .filter(|d| matches!(d, Delta::ToolCall(_)))
            .count();
        deltas
    }

    fn ending(&mut self, finish: Finish, usage: Usage) -> Ending {
        let now = Instant::now();
        let first = self.first_text.unwrap_or(now);
        Ending {
            finish,
            usage,
            stop_sequence: self.stop_index.and_then(|i| self.stop.get(i).cloned()),
            tool_calls: self.tool_calls,
            total: now - self.submitted,
            prompt_time: first - self.submitted,
            eval_time: now - first,
            logprobs: self.logprobs.take(),
        }
    }
}

/// A streamed body of several choices: `first`, then what `render` makes of each step of
/// each choice (its index, the step) as the steps come, until every choice has ended, or
/// until the first that fails (the others are then dropped, which cancels them).
pub fn choices_body(
    generations: Vec<Generation>,
    first: Vec<Bytes>,
    mut render: impl FnMut(usize, Step) -> Vec<Bytes> + Send + 'static,
) -> Body {
    let each = generations
        .into_iter()
        .enumerate()
        .map(|(index, generation)| {
            stream::unfold(generation, |mut generation| async move {
                let step = generation.next().await?;
                Some((step, generation))
            })
            .map(move |step| (index, step))
            .boxed()
        });
    let steps = stream::unfold(
        (stream::select_all(each), false),
        |(mut steps, failed)| async move {
            if failed {
                return None;
            }
            let (index, step) = steps.next().await?;
            let failed = matches!(step, Step::Failed(_));
            Some(((index, step), (steps, failed)))
        },
    );
    let body = stream::iter(vec![first])
        .chain(steps.map(move |(index, step)| render(index, step)))
        .flat_map(stream::iter)
        .map(Ok::<Bytes, Infallible>);
    Body::from_stream(body)
}
