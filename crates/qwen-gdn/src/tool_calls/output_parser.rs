//! The streaming parser of a model's reply: thinking, content and tool calls, as text arrives.
//!
//! Layers: the [`ReasoningSplitter`] separates the thinking from the answer; the answer goes
//! through the call scanner, which cuts `<tool_call>…</tool_call>` blocks out of it. A call is
//! emitted whole when its closing tag arrives. Whatever is not a well-formed call — a bad body,
//! a call cut off by `max_tokens` — comes back as content with its original text, in order:
//! model output never fails a request.

use super::call_body::BodyError;
use super::parse_call_body::parse_call_body;
use super::schema::ToolSchemas;
use super::tool_call::ToolCall;
#[cfg(test)]
use super::tool_choice::ToolChoice;
use crate::text::reasoning::{Piece, ReasoningMode, ReasoningSplitter};
use crate::text::tag_scan::held_tag_start;
#[cfg(test)]
use serde_json::Value as Json;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// What the parser recognised, in output order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Answer text (`delta.content`).
    Content(String),
    /// Thinking text (`delta.reasoning_content`).
    Reasoning(String),
    /// A complete call (`delta.tool_calls`, see [`ToolCall::to_openai_delta`]).
    ToolCall(ToolCall),
}

/// How to read one reply.
#[derive(Clone, Debug)]
pub struct ParserOptions {
    pub reasoning: ReasoningMode,
    /// Some: tool calls are recognised, their values typed by these schemas. None: every
    /// `<tool_call>` is plain content (no tools in the request, or `tool_choice: none`).
    pub tools: Option<ToolSchemas>,
}

impl ParserOptions {
    /// The options for a chat request: the reasoning mode from the rendered `prompt` (see
    /// [`ReasoningMode::from_prompt`]), calls recognised when `tools` is non-empty and
    /// `tool_choice` is not `none`.
    #[cfg(test)]
    pub fn for_request(prompt: &str, tools: &[Json], tool_choice: &ToolChoice) -> Self {
        Self {
            reasoning: ReasoningMode::from_prompt(prompt),
            tools: tool_choice
                .recognises_calls(!tools.is_empty())
                .then(|| ToolSchemas::from_tools(tools)),
        }
    }

    /// Plain text: no thinking, no tool calls (the output is returned as it is).
    #[cfg(test)]
    pub fn plain() -> Self {
        Self {
            reasoning: ReasoningMode::Off,
            tools: None,
        }
    }
}

/// Feed it decoded text with [`push`](Self::push) and end with [`finish`](Self::finish). It holds
/// back only text that may still turn out to be markup:
/// - the start of a tag (`Hello <tool_` waits for the next text; `Hello` goes out);
/// - a call, until its closing tag (it comes out whole, or as content if it is not a call);
/// - newlines at the end of the thinking (dropped if `</think>` follows);
/// - when calls are recognised, trailing whitespace of the content: whitespace next to a call
///   is layout, dropped at the start and end of the content; elsewhere it goes out with the next
///   text, or at the end of a reply without calls.
///
/// Feeding a text in any pieces gives the same events, up to how content and reasoning text is
/// split between events.
pub struct OutputParser {
    reasoning: ReasoningSplitter,
    calls: Option<CallScanner>,
}

impl OutputParser {
    pub fn new(options: ParserOptions) -> Self {
        let id_base = format!("{:016x}", rand::random::<u64>());
        Self {
            reasoning: ReasoningSplitter::new(options.reasoning),
            calls: options
                .tools
                .map(|schemas| CallScanner::new(schemas, id_base)),
        }
    }

    /// Call ids become `call_<base>_<index>` (they are random otherwise); for tests and replays.
    #[cfg(test)]
    pub fn with_call_id_base(mut self, base: &str) -> Self {
        if let Some(calls) = &mut self.calls {
            calls.id_base = base.to_string();
        }
        self
    }

    pub fn push(&mut self, text: &str) -> Vec<Event> {
        let pieces = self.reasoning.push(text);
        route(pieces, &mut self.calls)
    }

    /// The end of the reply: everything still held comes out (a cut-off call as content).
    pub fn finish(self) -> Vec<Event> {
        let Self {
            reasoning,
            mut calls,
        } = self;
        let mut out = route(reasoning.finish(), &mut calls);
        if let Some(calls) = calls {
            calls.finish(&mut out);
        }
        coalesce(out)
    }

    /// How many calls were emitted so far (a reply with calls ends with `finish_reason:
    /// "tool_calls"`).
    #[cfg(test)]
    pub fn tool_call_count(&self) -> usize {
        self.calls.as_ref().map_or(0, |c| c.next_index)
    }
}

/// Sends thinking out as it is and the answer through the call scanner, if calls are recognised.
fn route(pieces: Vec<Piece>, calls: &mut Option<CallScanner>) -> Vec<Event> {
    let mut out = Vec::new();
    for piece in pieces {
        match (piece, &mut *calls) {
            (Piece::Reasoning(r), _) => out.push(Event::Reasoning(r)),
            (Piece::Content(c), None) => out.push(Event::Content(c)),
            (Piece::Content(c), Some(scanner)) => scanner.push(&c, &mut out),
        }
    }
    coalesce(out)
}

/// Joins neighbouring events of the same text kind.
pub(super) fn coalesce(events: Vec<Event>) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::with_capacity(events.len());
    for e in events {
        match (out.last_mut(), e) {
            (Some(Event::Content(a)), Event::Content(b))
            | (Some(Event::Reasoning(a)), Event::Reasoning(b)) => a.push_str(&b),
            (_, e) => out.push(e),
        }
    }
    out
}

/// Cuts `<tool_call>…</tool_call>` blocks out of the content.
struct CallScanner {
    schemas: ToolSchemas,
    in_call: bool,
    /// Outside a call: text not yet emitted (a possible partial `<tool_call>`). Inside: the
    /// call's body so far.
    text: String,
    /// Inside a call: no `</tool_call>` that closes the call starts before this byte.
    search_from: usize,
    /// Trailing whitespace of the content, not emitted yet.
    held_space: String,
    /// The whitespace before the open call: content if the call turns out not to be one.
    space_before_call: String,
    /// Whether any content was emitted: whitespace that would start the content after a call
    /// is layout.
    content_emitted: bool,
    next_index: usize,
    id_base: String,
}

impl CallScanner {
    fn new(schemas: ToolSchemas, id_base: String) -> Self {
        Self {
            schemas,
            in_call: false,
            text: String::new(),
            search_from: 0,
            held_space: String::new(),
            space_before_call: String::new(),
            content_emitted: false,
            next_index: 0,
            id_base,
        }
    }

    fn push(&mut self, text: &str, out: &mut Vec<Event>) {
        self.text.push_str(text);
        loop {
            if !self.in_call {
                let Some(p) = self.text.find(OPEN) else {
                    let keep = held_tag_start(&self.text, OPEN);
                    let ready: String = self.text.drain(..keep).collect();
                    self.emit_text(&ready, out);
                    return;
                };
                let before: String = self.text.drain(..p).collect();
                self.emit_text(&before, out);
                self.text.drain(..OPEN.len());
                self.space_before_call = std::mem::take(&mut self.held_space);
                self.in_call = true;
                self.search_from = 0;
                continue;
            }
            let Some(rel) = self.text[self.search_from..].find(CLOSE) else {
                self.search_from = held_tag_start(&self.text, CLOSE).max(self.search_from);
                return;
            };
            let close = self.search_from + rel;
            match parse_call_body(&self.text[..close], &self.schemas) {
                Ok(body) => {
                    let index = self.next_index;
                    self.next_index += 1;
                    out.push(Event::ToolCall(ToolCall {
                        index,
                        id: format!("call_{}_{index}", self.id_base),
                        name: body.name,
                        arguments_json: serde_json::to_string(&body.arguments)
                            .expect("a JSON map always serializes"),
                    }));
                    // Between two pieces of content this whitespace still separates them.
                    self.held_space = std::mem::take(&mut self.space_before_call);
                }
                // This `</tool_call>` is inside a value; the call may end at a later one.
                Err(BodyError::Unterminated) => {
                    self.search_from = close + CLOSE.len();
                    continue;
                }
                Err(BodyError::Malformed) => {
                    let raw = format!(
                        "{}{OPEN}{}{CLOSE}",
                        std::mem::take(&mut self.space_before_call),
                        &self.text[..close]
                    );
                    self.emit_text(&raw, out);
                }
            }
            self.text.drain(..close + CLOSE.len());
            self.in_call = false;
        }
    }

    fn finish(mut self, out: &mut Vec<Event>) {
        let rest = std::mem::take(&mut self.text);
        if self.in_call {
            let raw = format!(
                "{}{OPEN}{rest}",
                std::mem::take(&mut self.space_before_call)
            );
            self.emit_text(&raw, out);
        } else {
            self.emit_text(&rest, out);
        }
        // Trailing whitespace is content only in a reply without calls.
        if self.next_index == 0 && !self.held_space.is_empty() {
            out.push(Event::Content(self.held_space));
        }
    }

    /// Emits content, keeping its trailing whitespace back (and dropping the leading whitespace
    /// of content that starts after a call).
    fn emit_text(&mut self, text: &str, out: &mut Vec<Event>) {
        self.held_space.push_str(text);
        let ready = self.held_space.trim_end().len();
        if ready == 0 {
            return;
        }
        let chunk: String = self.held_space.drain(..ready).collect();
        let chunk = if !self.content_emitted && self.next_index > 0 {
            chunk.trim_start().to_string()
        } else {
            chunk
        };
        self.content_emitted = true;
        out.push(Event::Content(chunk));
    }
}
