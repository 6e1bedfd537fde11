//! `chat` over ranks (`mpirun -n N qwen-gdn chat ...`, or `chat --ranks N`; `--parallel` picks
//! the plan, as for `generate`). Rank 0 holds the terminal and the conversation (chat.rs's
//! session, unchanged) and hands each turn to [`RankedReplies`], which leads it over the
//! ranks (ranked_turns.rs: the broadcast protocol, the lock step, the prompt cache of every
//! rank's shard); the other ranks run `follow_turns`.

use crate::cli::chat_args::Args;
use crate::cli::ranked_turns::RankSetup;
use crate::cli::ranked_turns::RankedTurns;
use crate::cli::replier::Replier;
use crate::engine::{Callback, GenerateParams, Outcome, PromptTokens};
use crate::load::Checkpoint;
use anyhow::Result;
use std::ops::ControlFlow;
use std::sync::atomic::AtomicBool;

/// How `chat`'s flags split the model over the ranks.
pub fn rank_setup(args: &Args) -> RankSetup<'_> {
    RankSetup {
        parallel: args.ranks.parallel,
        model: &args.model,
        prompt_cache: &args.prompt_cache,
    }
}

/// Rank 0's side: each turn led over the ranks.
pub struct RankedReplies {
    checkpoint: Checkpoint,
    turns: RankedTurns,
}

impl RankedReplies {
    pub fn new(checkpoint: Checkpoint, turns: RankedTurns) -> Self {
        Self { checkpoint, turns }
    }
}

impl Replier for RankedReplies {
    fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    fn generate(
        &mut self,
        prompt: &PromptTokens,
        params: &GenerateParams,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Outcome> {
        let mut sink = Callback { on_text, cancel };
        self.turns.lead(&self.checkpoint, prompt, params, &mut sink)
    }

    fn errors_end_session(&self) -> bool {
        true
    }

    fn end(&mut self) -> Result<()> {
        self.turns.end()
    }
}
