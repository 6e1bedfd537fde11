//! How `chat` prints a streamed reply: the thinking (`<think>…</think>`) as written, dimmed on
//! a terminal, or left out; the answer as written. Tags can arrive split over several pieces,
//! so a piece that might begin a tag is held back until the next one decides.

use crate::ui::output::emit;
use anyhow::Result;
use std::io::Write;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";
/// ANSI faint on / normal intensity.
const DIM: &str = "\x1b[2m";
const UNDIM: &str = "\x1b[22m";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinkingStyle {
    /// The reply exactly as generated (output that is not a terminal).
    Plain,
    /// The thinking dimmed, tags included.
    Dim,
    /// The thinking and its tags left out, with the blank lines that follow `</think>`.
    Hidden,
}

pub struct ReplyDisplay<W: Write> {
    out: W,
    style: ThinkingStyle,
    thinking: bool,
    /// Text that may be the start of a tag.
    held: String,
    dimmed: bool,
    /// Right after hidden thinking: leading whitespace of the answer is dropped.
    trim_answer_start: bool,
    /// False once the output is closed (`| head`).
    open: bool,
}

impl<W: Write> ReplyDisplay<W> {
    /// `thinking`: the reply starts inside a thinking block (the prompt ended with `<think>`).
    pub fn new(out: W, style: ThinkingStyle, thinking: bool) -> Self {
        Self {
            out,
            style,
            thinking,
            held: String::new(),
            dimmed: false,
            trim_answer_start: false,
            open: true,
        }
    }

    pub fn push(&mut self, text: &str) -> Result<()> {
        self.held.push_str(text);
        loop {
            let tag = if self.thinking { CLOSE } else { OPEN };
            if let Some(i) = self.held.find(tag) {
                let head: String = self.held.drain(..i + tag.len()).collect();
                if self.thinking {
                    self.write(&head, true)?;
                    self.thinking = false;
                    self.trim_answer_start = self.style == ThinkingStyle::Hidden;
                } else {
                    self.write(&head[..i], false)?;
                    self.thinking = true;
                    self.write(tag, true)?;
                }
                continue;
            }
            let keep = partial_tag_len(&self.held, tag);
            let ready: String = self.held.drain(..self.held.len() - keep).collect();
            return self.write(&ready, self.thinking);
        }
    }

    /// False once stdout is closed (`| head`): nothing more will be shown.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Writes what is held back and ends the reply with a newline.
    pub fn finish(&mut self) -> Result<()> {
        let rest = std::mem::take(&mut self.held);
        self.write(&rest, self.thinking)?;
        let mut end = String::new();
        if self.dimmed {
            end.push_str(UNDIM);
            self.dimmed = false;
        }
        end.push('\n');
        self.emit(&end)
    }

    fn write(&mut self, text: &str, thinking: bool) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        match (self.style, thinking) {
            (ThinkingStyle::Hidden, true) => Ok(()),
            (ThinkingStyle::Dim, true) if !self.dimmed => {
                self.dimmed = true;
                self.emit(&format!("{DIM}{text}"))
            }
            (ThinkingStyle::Dim, false) if self.dimmed => {
                self.dimmed = false;
                self.emit(&format!("{UNDIM}{text}"))
            }
            (ThinkingStyle::Hidden, false) if self.trim_answer_start => {
                let text = text.trim_start();
                self.trim_answer_start = text.is_empty();
                self.emit(text)
            }
            _ => self.emit(text),
        }
    }

    fn emit(&mut self, text: &str) -> Result<()> {
        if self.open && !text.is_empty() {
            self.open = emit(&mut self.out, text)?;
        }
        Ok(())
    }
}

/// Length of the longest end of `text` that is the beginning of `tag`.
fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(style: ThinkingStyle, thinking: bool, pieces: &[&str]) -> String {
        let mut out = Vec::new();
        let mut display = ReplyDisplay::new(&mut out, style, thinking);
        for piece in pieces {
            display.push(piece).unwrap();
        }
        display.finish().unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The same reply cut into pieces at every byte position.
    fn all_splits(text: &str) -> Vec<Vec<&str>> {
        (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .map(|i| vec![&text[..i], &text[i..]])
            .collect()
    }

    #[test]
    fn thinking_is_dimmed_hidden_or_kept_whatever_the_cuts() {
        let reply = "plan é<\n</think>\n\nThe answer <b> is 4.";
        for pieces in all_splits(reply) {
            assert_eq!(
                show(ThinkingStyle::Plain, true, &pieces),
                format!("{reply}\n")
            );
            assert_eq!(
                show(ThinkingStyle::Dim, true, &pieces),
                "\x1b[2mplan é<\n</think>\x1b[22m\n\nThe answer <b> is 4.\n"
            );
            assert_eq!(
                show(ThinkingStyle::Hidden, true, &pieces),
                "The answer <b> is 4.\n"
            );
        }
        let opened = "Sure. <think>hmm</think> Done <";
        for pieces in all_splits(opened) {
            assert_eq!(
                show(ThinkingStyle::Dim, false, &pieces),
                "Sure. \x1b[2m<think>hmm</think>\x1b[22m Done <\n"
            );
            assert_eq!(
                show(ThinkingStyle::Hidden, false, &pieces),
                "Sure. Done <\n"
            );
        }
        // A reply cut inside its thinking ends the dimming before the newline.
        assert_eq!(
            show(ThinkingStyle::Dim, true, &["still </thi"]),
            "\x1b[2mstill </thi\x1b[22m\n"
        );
        assert_eq!(show(ThinkingStyle::Hidden, true, &["still </thi"]), "\n");
    }
}
