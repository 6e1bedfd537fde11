//! Test-only switches, read from the environment and honoured only in debug builds (release
//! builds ignore them): the tests need a worker that panics, a generation slow enough to
//! disconnect from or to fill the queue behind, a reply whose own work panics mid-batch, and
//! a tool call from models that otherwise print gibberish.

use crate::engine::constraint::LogitsConstraint;
use std::time::Duration;

/// A request whose prompt contains this variable's value panics on the worker.
pub const PANIC_ENV: &str = "QWEN_GDN_TEST_PANIC";
/// A reply whose prompt contains this variable's value panics in its own sampling, at its
/// [`FAULT_AT_TOKEN`]th token, while the replies beside it in the batch go on.
pub const REPLY_PANIC_ENV: &str = "QWEN_GDN_TEST_REPLY_PANIC";
/// The token at which [`REPLY_PANIC_ENV`]'s reply panics: a few tokens in, so that it is
/// decoding in a batch with the others by then.
pub const FAULT_AT_TOKEN: usize = 3;
/// Milliseconds the worker sleeps after each piece of text.
pub const TOKEN_DELAY_ENV: &str = "QWEN_GDN_TEST_TOKEN_DELAY_MS";
/// The model's output is replaced by this text (the prompt is still rendered and counted).
pub const FORCE_OUTPUT_ENV: &str = "QWEN_GDN_TEST_FORCE_OUTPUT";

fn var(name: &str) -> Option<String> {
    if !cfg!(debug_assertions) {
        return None;
    }
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Panics when the panic switch is set and `prompt_text` contains its marker.
pub fn maybe_panic(prompt_text: &str) {
    if let Some(marker) = var(PANIC_ENV) {
        if prompt_text.contains(&marker) {
            panic!("{PANIC_ENV}: test panic on the generation worker");
        }
    }
}

pub fn token_delay() -> Option<Duration> {
    var(TOKEN_DELAY_ENV)
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
}

pub fn forced_output() -> Option<String> {
    var(FORCE_OUTPUT_ENV)
}

/// The constraint of a reply that must panic ([`REPLY_PANIC_ENV`]), when `prompt_text`
/// contains the switch's marker: it allows every one of `vocab` tokens (the reply samples as
/// without it) and panics when asked for its [`FAULT_AT_TOKEN`]th token. Injected through the
/// reply's constraint, the seam every reply's sampling already has.
pub fn faulty_constraint(prompt_text: &str, vocab: usize) -> Option<FaultyConstraint> {
    let marker = var(REPLY_PANIC_ENV)?;
    prompt_text.contains(&marker).then(|| FaultyConstraint {
        words: vec![u32::MAX; vocab.div_ceil(32)],
        tokens: 0,
    })
}

pub struct FaultyConstraint {
    words: Vec<u32>,
    /// Tokens accepted so far.
    tokens: usize,
}

impl LogitsConstraint for FaultyConstraint {
    fn allowed(&mut self) -> anyhow::Result<Vec<u32>> {
        if self.tokens + 1 == FAULT_AT_TOKEN {
            panic!("{REPLY_PANIC_ENV}: test panic in one reply's sampling");
        }
        Ok(self.words.clone())
    }

    fn accept(&mut self, _token: u32) -> anyhow::Result<()> {
        self.tokens += 1;
        Ok(())
    }
}
