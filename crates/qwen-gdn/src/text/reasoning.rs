//! Splitting a reply into its thinking (`<think>…</think>`, returned as `reasoning_content`) and
//! its answer (`content`), as text streams in.
//!
//! Qwen templates that think put `<think>\n` at the end of the generation prompt (Qwen3-Next-
//! Thinking always, Qwen3.5/3.6 unless `enable_thinking` is false), so the model's output starts
//! inside the thinking and holds only the closing `</think>`. With `enable_thinking: false` the
//! prompt ends with an empty `<think>\n\n</think>\n\n` and the whole reply is the answer. Templates
//! that never think (Qwen3-Next-Instruct) leave it to the model, which may still open `<think>`
//! as the first thing it writes.
//!
//! The newlines the template puts around the thinking (`<think>\n` … `\n</think>\n\n`) are
//! markup, not text: they are dropped from both parts, as the template drops them (`strip('\n')`)
//! when it renders the reply back into the history.

use crate::text::tag_scan::held_tag_start;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Where the model's output starts with respect to thinking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningMode {
    /// No thinking: the whole output is content, `<think>` tags included.
    Off,
    /// The output may think. `starts_in_thinking`: the prompt already opened `<think>`, so the
    /// output is thinking up to `</think>`; otherwise only a `<think>` at the very start (after
    /// whitespace) opens it.
    On { starts_in_thinking: bool },
}

impl ReasoningMode {
    /// The mode a rendered prompt implies: ending in `<think>` (plus whitespace) starts in the
    /// thinking; ending in `</think>` means thinking was turned off; anything else lets the
    /// model open `<think>` itself.
    pub fn from_prompt(prompt: &str) -> Self {
        let end = prompt.trim_end();
        if end.ends_with(OPEN) {
            Self::On {
                starts_in_thinking: true,
            }
        } else if end.ends_with(CLOSE) {
            Self::Off
        } else {
            Self::On {
                starts_in_thinking: false,
            }
        }
    }
}

/// One part of the output, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before any non-whitespace: a `<think>` here opens the thinking.
    AwaitingOpen,
    /// Inside the thinking; `at_start`: its leading newlines are still being dropped.
    Thinking { at_start: bool },
    /// The answer; `after_close`: the newlines after `</think>` are still being dropped.
    Content { after_close: bool },
}

/// Streaming splitter: [`push`](Self::push) text as it is decoded, [`finish`](Self::finish) at
/// the end. It holds back only what could still be part of a tag, plus the newlines at the end
/// of the thinking (they are dropped if `</think>` follows). Nothing else is ever held or lost.
pub struct ReasoningSplitter {
    state: State,
    held: String,
}

impl ReasoningSplitter {
    pub fn new(mode: ReasoningMode) -> Self {
        let state = match mode {
            ReasoningMode::Off => State::Content { after_close: false },
            ReasoningMode::On {
                starts_in_thinking: true,
            } => State::Thinking { at_start: true },
            ReasoningMode::On {
                starts_in_thinking: false,
            } => State::AwaitingOpen,
        };
        Self {
            state,
            held: String::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.advance(&mut out);
        out
    }

    /// The end of the output: whatever is held is emitted as what it was (a cut-off thinking is
    /// still thinking; a partial tag is text).
    pub fn finish(mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.advance(&mut out);
        let rest = std::mem::take(&mut self.held);
        match self.state {
            State::Thinking { .. } => push_piece(&mut out, Piece::Reasoning(rest)),
            State::AwaitingOpen | State::Content { .. } => {
                push_piece(&mut out, Piece::Content(rest))
            }
        }
        out
    }

    fn advance(&mut self, out: &mut Vec<Piece>) {
        loop {
            match self.state {
                State::AwaitingOpen => {
                    let rest = self.held.trim_start();
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        self.held = after.to_string();
                        self.state = State::Thinking { at_start: true };
                    } else if OPEN.starts_with(rest) {
                        return; // only whitespace and maybe the start of `<think>` so far
                    } else {
                        self.state = State::Content { after_close: false };
                    }
                }
                State::Thinking { at_start } => {
                    if at_start {
                        let lead = self.held.trim_start_matches('\n');
                        let word = lead.trim_start();
                        // Some models repeat the `<think>` that the prompt already opened.
                        if let Some(after) = word.strip_prefix(OPEN) {
                            self.held = after.to_string();
                            continue;
                        }
                        let waiting = OPEN.starts_with(word);
                        self.held = lead.to_string();
                        if waiting {
                            return; // only whitespace, or maybe a repeated `<think>`, so far
                        }
                        self.state = State::Thinking { at_start: false };
                    }
                    if let Some(p) = self.held.find(CLOSE) {
                        let thought = self.held[..p].trim_end_matches('\n').to_string();
                        push_piece(out, Piece::Reasoning(thought));
                        self.held.drain(..p + CLOSE.len());
                        self.state = State::Content { after_close: true };
                    } else {
                        let tag = held_tag_start(&self.held, CLOSE);
                        let end = self.held[..tag].trim_end_matches('\n').len();
                        let thought: String = self.held.drain(..end).collect();
                        push_piece(out, Piece::Reasoning(thought));
                        return;
                    }
                }
                State::Content { after_close } => {
                    if after_close {
                        let rest = self.held.trim_start_matches('\n');
                        if rest.is_empty() {
                            self.held.clear();
                            return;
                        }
                        self.held = rest.to_string();
                        self.state = State::Content { after_close: false };
                    }
                    push_piece(out, Piece::Content(std::mem::take(&mut self.held)));
                    return;
                }
            }
        }
    }
}

fn push_piece(out: &mut Vec<Piece>, piece: Piece) {
    let empty = match &piece {
        Piece::Reasoning(s) | Piece::Content(s) => s.is_empty(),
    };
    if !empty {
        out.push(piece);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces cut at `cuts` and joins neighbouring pieces of the same kind.
    fn split(mode: ReasoningMode, text: &str, cuts: &[usize]) -> Vec<Piece> {
        let mut s = ReasoningSplitter::new(mode);
        let mut pieces = Vec::new();
        for piece in crate::test_support::pieces(text, cuts) {
            pieces.extend(s.push(piece));
        }
        pieces.extend(s.finish());
        let mut joined: Vec<Piece> = Vec::new();
        for p in pieces {
            match (joined.last_mut(), p) {
                (Some(Piece::Reasoning(a)), Piece::Reasoning(b))
                | (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
                (_, p) => joined.push(p),
            }
        }
        joined
    }

    fn r(s: &str) -> Piece {
        Piece::Reasoning(s.into())
    }
    fn c(s: &str) -> Piece {
        Piece::Content(s.into())
    }

    const THINKING: ReasoningMode = ReasoningMode::On {
        starts_in_thinking: true,
    };
    const MAY_THINK: ReasoningMode = ReasoningMode::On {
        starts_in_thinking: false,
    };

    #[test]
    fn splits_thinking_from_answer() {
        let cases: &[(ReasoningMode, &str, Vec<Piece>)] = &[
            (
                THINKING,
                "Let me think.\n</think>\n\nThe answer.",
                vec![r("Let me think."), c("The answer.")],
            ),
            (
                MAY_THINK,
                "\n<think>\nHmm\n\n a<b \n</think>\n\nHi\n",
                vec![r("Hmm\n\n a<b "), c("Hi\n")],
            ),
            (MAY_THINK, "Just an answer.", vec![c("Just an answer.")]),
            (MAY_THINK, "  <thinking> x", vec![c("  <thinking> x")]),
            (
                MAY_THINK,
                "a <think>b</think>",
                vec![c("a <think>b</think>")],
            ),
            (
                ReasoningMode::Off,
                "<think>x</think>y",
                vec![c("<think>x</think>y")],
            ),
            // Cut by max_tokens inside the thinking: it stays thinking, partial tag included.
            (THINKING, "Step 1\n</thi", vec![r("Step 1\n</thi")]),
            (THINKING, "\n\n", vec![]),
            (THINKING, "<think>\nx\n</think>\ny", vec![r("x"), c("y")]),
            (THINKING, "<thin", vec![r("<thin")]),
            (THINKING, " x", vec![r(" x")]),
            (THINKING, "</think>", vec![]),
            (MAY_THINK, "<thi", vec![c("<thi")]),
            (
                THINKING,
                "a</think>b</think>c",
                vec![r("a"), c("b</think>c")],
            ),
            (THINKING, "日本\n</think>\n\n語", vec![r("日本"), c("語")]),
        ];
        for (mode, text, want) in cases {
            assert_eq!(&split(*mode, text, &[]), want, "{text:?}");
        }
    }

    #[test]
    fn every_split_gives_the_same_pieces() {
        let texts = [
            (THINKING, "Let me think.\n\n</think>\n\nThe answer.\n"),
            (MAY_THINK, " \n<think>\n日本 < </thin </think>\nok"),
            (MAY_THINK, "<thinking about it"),
            (THINKING, "\n <think>\n\nx </think>\n y"),
        ];
        for (mode, text) in texts {
            let whole = split(mode, text, &[]);
            let bounds: Vec<usize> = (1..text.len())
                .filter(|&i| text.is_char_boundary(i))
                .collect();
            for &i in &bounds {
                assert_eq!(split(mode, text, &[i]), whole, "{text:?} cut at {i}");
                for &j in bounds.iter().filter(|&&j| j > i) {
                    assert_eq!(split(mode, text, &[i, j]), whole, "{text:?} cut at {i},{j}");
                }
            }
            // One character at a time.
            assert_eq!(split(mode, text, &bounds), whole, "{text:?} char by char");
        }
    }

    #[test]
    fn emits_all_but_a_possible_tag_at_once() {
        let mut s = ReasoningSplitter::new(THINKING);
        assert_eq!(s.push("abc </th"), vec![r("abc ")]);
        assert_eq!(s.push("e\n"), vec![r("</the")], "not a tag after all");
        assert_eq!(s.push("\n"), vec![], "newlines wait for the next text");
        assert_eq!(s.push("x"), vec![r("\n\nx")]);
        let mut s = ReasoningSplitter::new(MAY_THINK);
        assert_eq!(s.push("Hello"), vec![c("Hello")]);
        assert_eq!(s.push(" <think>"), vec![c(" <think>")]);
    }

    #[test]
    fn mode_from_the_rendered_prompt() {
        let p = "<|im_start|>assistant\n";
        assert_eq!(
            ReasoningMode::from_prompt(&format!("{p}<think>\n")),
            THINKING
        );
        assert_eq!(
            ReasoningMode::from_prompt(&format!("{p}<think>\n\n</think>\n\n")),
            ReasoningMode::Off
        );
        assert_eq!(ReasoningMode::from_prompt(p), MAY_THINK);
    }
}
