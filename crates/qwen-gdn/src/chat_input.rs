//! Where `chat` reads its lines: a line editor with history when stdin is a terminal, plain
//! lines otherwise (a pipe or a file, so that scripts and tests can drive a session).

use anyhow::{Context, Result};
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use std::io::{BufRead, IsTerminal, Read};

/// The longest line read from a pipe; a longer one is cut and reported instead of filling
/// the memory (the prompt still has to fit the context, which is checked later).
const MAX_PIPED_LINE: u64 = 64 << 20;

pub enum Line {
    Text(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D, or the end of the piped input.
    End,
    /// A piped line that cannot be a message (too long, not UTF-8): what is wrong with it.
    Invalid(String),
}

pub enum LineReader {
    Editor(Box<DefaultEditor>),
    Piped(std::io::StdinLock<'static>),
}

impl LineReader {
    pub fn new() -> Result<Self> {
        if std::io::stdin().is_terminal() {
            let editor = DefaultEditor::new().context("starting the line editor")?;
            Ok(Self::Editor(Box::new(editor)))
        } else {
            Ok(Self::Piped(std::io::stdin().lock()))
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
            Self::Piped(stdin) => {
                let mut bytes = Vec::new();
                let n = Read::by_ref(stdin)
                    .take(MAX_PIPED_LINE)
                    .read_until(b'\n', &mut bytes)
                    .context("reading stdin")?;
                if n == 0 {
                    return Ok(Line::End);
                }
                if !bytes.ends_with(b"\n") && n as u64 == MAX_PIPED_LINE {
                    skip_line(stdin)?;
                    return Ok(Line::Invalid(format!(
                        "a line of stdin is longer than {MAX_PIPED_LINE} bytes; skipped"
                    )));
                }
                match String::from_utf8(bytes) {
                    Ok(text) => Ok(Line::Text(
                        text.trim_end_matches('\n').trim_end_matches('\r').into(),
                    )),
                    Err(_) => Ok(Line::Invalid(
                        "a line of stdin is not UTF-8; skipped".into(),
                    )),
                }
            }
        }
    }
}

/// Reads and drops the rest of the current line.
fn skip_line(stdin: &mut impl BufRead) -> Result<()> {
    loop {
        let buf = stdin.fill_buf().context("reading stdin")?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                stdin.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                stdin.consume(n);
            }
        }
    }
}
