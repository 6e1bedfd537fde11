//! `bench --draft-tokens N|auto`: the tg test again with speculative decoding (the MTP head
//! drafts, one forward pass verifies), greedy, from the same prompt at the same depth. Reports
//! its speed next to plain decoding's, the acceptance, and whether the tokens are plain
//! decoding's (they must be, greedy; on a GPU the verify pass's rows may round differently from
//! single decode steps, which this makes visible).

use crate::cli::speculation_args::stats_line;
use anyhow::{Context, Result};
use qwen_gdn_model::speculative::{
    argmax, DraftLength, DrafterSource, Greedy, SpecStats, Speculation, HEAD_HISTORY,
};
use qwen_gdn_model::Model;
use serde_json::json;
use std::time::{Duration, Instant};

use super::common::{greedy, Stats};

/// The speculative tg test's result.
pub(crate) struct SpeculativeTg {
    /// Drafted by a draft model (`--draft-model`), not the MTP head.
    pub(crate) draft_model: bool,
    pub(crate) length: DraftLength,
    pub(crate) tps: Stats,
    /// The last timed repetition's counts (greedy: every repetition's are the same).
    pub(crate) stats: SpecStats,
    /// Whether every repetition generated plain decoding's tokens.
    pub(crate) same_tokens: bool,
}

impl SpeculativeTg {
    /// One warm-up and `repetitions` timed runs of `gen_tokens` tokens after `prompt`;
    /// `plain_tokens` are plain decoding's.
    pub(crate) fn run(
        model: &Model,
        prompt: &[u32],
        gen_tokens: usize,
        chunk: usize,
        repetitions: usize,
        (length, drafter): (&DraftLength, &DrafterSource),
        plain_tokens: &[u32],
    ) -> Result<Self> {
        repetition(model, prompt, gen_tokens, chunk, length, drafter)
            .context("speculative warm-up repetition")?;
        let mut samples = Vec::new();
        let mut same_tokens = true;
        let mut stats = SpecStats::default();
        for i in 0..repetitions {
            let (time, tokens, s) = repetition(model, prompt, gen_tokens, chunk, length, drafter)
                .with_context(|| format!("speculative repetition {}", i + 1))?;
            samples.push(gen_tokens as f64 / time.as_secs_f64().max(1e-9));
            same_tokens &= tokens == plain_tokens;
            stats = s;
        }
        Ok(Self {
            length: length.clone(),
            draft_model: matches!(drafter, DrafterSource::Model { .. }),
            tps: Stats::new(samples),
            stats,
            same_tokens,
        })
    }

    /// Median speculative tg over median plain tg.
    pub(crate) fn speedup(&self, plain: &Stats) -> f64 {
        self.tps.median / plain.median.max(1e-9)
    }

    /// The table's row label.
    pub(crate) fn label(&self, gen_tokens: usize) -> String {
        let by = if self.draft_model {
            "draft model"
        } else {
            "MTP"
        };
        match &self.length {
            DraftLength::Fixed(k) => format!("tg{gen_tokens} {by} k={k}"),
            DraftLength::Adaptive(_) => format!("tg{gen_tokens} {by} auto"),
        }
    }

    /// The lines under the table.
    pub(crate) fn summary(&self, plain: &Stats) -> String {
        format!(
            "{}\nMTP speedup over tg: {:.2}x (medians); greedy tokens {} plain decoding's\n",
            stats_line(&self.stats, &self.length),
            self.speedup(plain),
            if self.same_tokens {
                "equal"
            } else {
                "DIFFER from"
            }
        )
    }

    /// `--json`'s `speculative` object.
    pub(crate) fn json(&self, plain: &Stats) -> serde_json::Value {
        let s = &self.stats;
        json!({
            "draft_tokens": match &self.length {
                DraftLength::Fixed(k) => json!(k),
                DraftLength::Adaptive(_) => json!("auto"),
            },
            "generation_tps": self.tps,
            "speedup": self.speedup(plain),
            "acceptance": s.acceptance(),
            "tokens_per_step": s.tokens_per_step(),
            "mean_draft_tokens": s.mean_draft_tokens(),
            "steps": s.steps,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "steps_at": s.steps_at,
            "same_tokens": self.same_tokens,
        })
    }
}

/// One speculative repetition from an empty cache: the prompt (its last [`HEAD_HISTORY`]
/// tokens through the head's start), then the timed steps until `gen_tokens` tokens after the
/// first: (their time, those tokens, the counts).
fn repetition(
    model: &Model,
    prompt: &[u32],
    gen_tokens: usize,
    chunk: usize,
    length: &DraftLength,
    drafter: &DrafterSource,
) -> Result<(Duration, Vec<u32>, SpecStats)> {
    let mut spec = Speculation::from_source(model, drafter, length.clone())?;
    let mut cache = model.new_cache();
    let head = &prompt[..prompt.len() - HEAD_HISTORY.min(prompt.len())];
    for part in head.chunks(chunk) {
        model.prefill(part, &mut cache, chunk)?;
    }
    let logits = spec.start_from_prompt(model, &mut cache, prompt, head.len())?;
    let mut token = greedy(model, &logits, prompt, chunk)?;
    let mut judge = Greedy(|row: &mut [f32], _: &[u32]| argmax(row));
    let mut tokens = Vec::with_capacity(gen_tokens + 16);
    let start = Instant::now();
    while tokens.len() < gen_tokens {
        // Drafts past -g would be wasted.
        let room = gen_tokens - tokens.len() - 1;
        let decided = spec.step(model, &mut cache, token, room, &mut judge)?;
        token = *decided
            .last()
            .context("a speculative step decided nothing")?;
        tokens.extend(decided);
    }
    let time = start.elapsed();
    tokens.truncate(gen_tokens);
    Ok((time, tokens, spec.stats))
}
