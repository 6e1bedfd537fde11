//! Where `chat` reads its lines: a line editor with history when stdin is a terminal, plain
//! lines otherwise (a pipe or a file, so that scripts and tests can drive a session).

use anyhow::{Context, Result};
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use std::io::{BufRead, IsTerminal, Read};

pub enum Line {
    Text(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D, or the end of the piped input.
    End,
    /// A piped line that is not UTF-8 (skipped: the session goes on).
    Invalid(String),
    /// A piped line longer than any message the context can hold (e.g. endless input
    /// without a newline, such as /dev/zero): the session cannot go on reading lines.
    TooLong,
    /// A piped line holding a NUL byte: binary input, not messages.
    Binary,
}

pub enum LineReader {
    Editor(Box<DefaultEditor>),
    /// stdin, and the longest line it may hold in bytes.
    Piped(std::io::StdinLock<'static>, u64),
}

impl LineReader {
    /// `max_line`: the most bytes a piped line may hold (the model's input limit); a longer
    /// line is not read further.
    pub fn new(max_line: u64) -> Result<Self> {
        if std::io::stdin().is_terminal() {
            let editor = DefaultEditor::new().context("starting the line editor")?;
            Ok(Self::Editor(Box::new(editor)))
        } else {
            Ok(Self::Piped(std::io::stdin().lock(), max_line))
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Editor(_))
    }

    /// The next line, without its line ending. The editor shows `prompt`; piped input is read
    /// silently.
    pub fn read(&mut self, prompt: &str) -> Result<Line> {
        match self {
            Self::Editor(editor) => match editor.readline(prompt) {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        // A full history is no reason to stop the session.
                        let _ = editor.add_history_entry(line.as_str());
                    }
                    Ok(Line::Text(line))
                }
                Err(ReadlineError::Interrupted) => Ok(Line::Interrupted),
                Err(ReadlineError::Eof) => Ok(Line::End),
                Err(e) => Err(e).context("reading the terminal"),
            },
            Self::Piped(stdin, max_line) => {
                let mut bytes = Vec::new();
                // One byte past the limit (plus the newline) tells a line at the limit from one
                // past it.
                let n = Read::by_ref(stdin)
                    .take(max_line.saturating_add(2))
                    .read_until(b'\n', &mut bytes)
                    .context("reading stdin")?;
                if n == 0 {
                    return Ok(Line::End);
                }
                if bytes.ends_with(b"\n") {
                    bytes.pop();
                }
                if bytes.len() as u64 > *max_line {
                    return Ok(Line::TooLong);
                }
                if bytes.contains(&0) {
                    return Ok(Line::Binary);
                }
                match String::from_utf8(bytes) {
                    Ok(text) => Ok(Line::Text(text.trim_end_matches('\r').into())),
                    Err(_) => Ok(Line::Invalid(
                        "a line of stdin is not UTF-8; skipped".into(),
                    )),
                }
            }
        }
    }
}
