//! Test-only switches, read from the environment and honoured only in debug builds (release
//! builds ignore them): the tests need a worker that panics, a generation slow enough to
//! disconnect from or to fill the queue behind, and a tool call from models that otherwise
//! print gibberish.

use std::time::Duration;

/// A request whose prompt contains this variable's value panics on the worker.
pub const PANIC_ENV: &str = "QWEN_GDN_TEST_PANIC";
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
