//! Who writes `chat`'s replies: the engine in this process, or, over ranks, rank 0's side of a
//! job (chat_ranks.rs). The session (chat.rs) sees only this trait.

use crate::engine::{Engine, GenerateParams, Outcome, PromptTokens};
use crate::load::Checkpoint;
use anyhow::Result;
use std::ops::ControlFlow;
use std::sync::atomic::AtomicBool;

/// Who writes the replies: the engine in this process, or the ranks of a job (rank 0's side,
/// chat_ranks.rs).
pub trait Replier {
    fn checkpoint(&self) -> &Checkpoint;
    /// [`Engine::generate`]'s contract.
    fn generate(
        &mut self,
        prompt: &PromptTokens,
        params: &GenerateParams,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Outcome>;
    /// Whether a failed turn ends the session (rather than being reported and skipped).
    fn errors_end_session(&self) -> bool {
        false
    }
    /// The session is over.
    fn end(&mut self) -> Result<()> {
        Ok(())
    }
}

impl Replier for Engine {
    fn checkpoint(&self) -> &Checkpoint {
        Engine::checkpoint(self)
    }

    fn generate(
        &mut self,
        prompt: &PromptTokens,
        params: &GenerateParams,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Outcome> {
        Engine::generate(self, prompt, params, cancel, on_text)
    }
}
