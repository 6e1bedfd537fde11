//! `chat` over ranks (`mpirun -n N qwen-gdn chat ...`, or `chat --ranks N`; `--parallel` picks
//! the plan, as for `generate`). Rank 0 holds the terminal and the conversation (chat.rs's
//! session, unchanged) and hands each turn to [`RankedReplies`]; the other ranks run
//! [`follow_turns`]. Every rank then runs the same turn in lock step: the prompt cache looked
//! up on every rank at once (each holds its own shard of the state:
//! `qwen_gdn_model::prompt_cache::lookup_on_every_rank`), the prefill's pieces with the
//! snapshots one process takes at the same places, and the decode steps with the token every
//! rank continues with (the plan's rule).
//!
//! The broadcast, rank 0 to each other rank, point to point, u32 values as the bits of f32:
//! - a header `[kind, prompt tokens, boundaries, seed low, seed high]`, kind 1 a turn (then
//!   its prompt's ids, then its message boundaries), kind 0 the end of the session;
//! - after each sampled token, every rank gathers rank 0's "stop" (Ctrl-C, stdout closed), so
//!   that all end the reply at the same token.
//!
//! The other ranks wait for a header with no deadline (a person is typing); every other wait
//! is bounded by `--rank-timeout`, after which the rank ends with one line naming the rank it
//! waited for. An error during a turn ends the session on every rank (the ranks could no
//! longer be in step).

use crate::cli::chat_args::Args;
use crate::cli::rank_plan::RankPlan;
use crate::cli::replier::Replier;
use crate::engine::sampler::{Sampler, SamplerConfig};
use crate::engine::{eos_ids, FinishReason, GenerateParams, Outcome, PromptTokens};
use crate::load::Checkpoint;
use crate::text::stream::TokenStream;
use crate::ui::output::eprint_line;
use anyhow::{ensure, Context, Result};
use candle_core::Tensor;
use qwen_gdn_collective::{ensure_same_fingerprint, fnv1a, World};
use qwen_gdn_model::prompt_cache::{lookup_on_every_rank, ChunkedPrefill, PrefillPiece};
use qwen_gdn_model::{Config, Model, PromptCache};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Rank 0's consumer of the reply's text (`Break`: nobody reads it any more).
type OnText<'a> = &'a mut dyn FnMut(&str) -> ControlFlow<()>;

const END: u32 = 0;
const TURN: u32 = 1;

/// What every rank holds to run turns: its share of the model, its prompt cache (of its
/// shard), and the settings every rank reads from the same command line.
pub struct RankedTurns {
    plan: RankPlan,
    model: Model,
    prompt_cache: PromptCache,
    prefill_chunk: usize,
    snapshot_every: Option<usize>,
    max_tokens: usize,
    sampler: SamplerConfig,
    eos: Vec<u32>,
}

impl RankedTurns {
    /// Loads this rank's share of the model under `args`' plan over `world` (the layout line
    /// printed), with a prompt cache of the same budget on every rank.
    pub fn load(
        args: &Args,
        checkpoint: &Checkpoint,
        context: usize,
        world: World,
    ) -> Result<Self> {
        let config = Config::from_dir(&checkpoint.dir)?;
        let plan = RankPlan::new(args.ranks.parallel, world, &config)?;
        eprint_line(&plan.layout_line());
        let part = plan.part(config.num_hidden_layers);
        let mut model = args.model.load_model_part(checkpoint, context, part)?;
        plan.ready(&mut model)?;
        // The smallest rank's budget everywhere, so that eviction is alike (not required: the
        // ranks' lookups agree or all miss).
        let budget = args.prompt_cache.budget(model.device());
        let budget = (plan.world().all_gather_u64(budget)?.into_iter().min()).unwrap_or(budget);
        let eos = eos_ids(checkpoint, &model.config().eos_token_id)?;
        Ok(Self {
            plan,
            model,
            prompt_cache: PromptCache::new(budget),
            prefill_chunk: args.model.prefill_chunk_size,
            snapshot_every: args.prompt_cache.prompt_cache_every,
            max_tokens: args.sampling.max_tokens,
            sampler: args.sampling.sampler(),
            eos,
        })
    }

    fn world(&self) -> &World {
        self.plan.world()
    }

    pub fn rank(&self) -> usize {
        self.plan.rank()
    }

    /// One turn on this rank, in step with the others. Rank 0 passes the text to `on_text`
    /// (`Break`: stdout is closed) and its `cancel`; the other ranks pass neither.
    fn run(
        &mut self,
        checkpoint: &Checkpoint,
        prompt: &PromptTokens,
        seed: u64,
        cancel: Option<&AtomicBool>,
        mut on_text: Option<OnText>,
    ) -> Result<Outcome> {
        let start = Instant::now();
        let ids = &prompt.ids;
        let (&last, _) = ids.split_last().context("the prompt has no tokens")?;
        let world = self.plan.world().clone();
        // Every rank must cut the prefill at the same places and stop at the same token, or
        // their transfers would no longer match (ranks may be started with other flags).
        let turn = format!(
            "{:?} {:?} {} {:?} {} {:?} {seed}",
            ids,
            prompt.boundaries,
            self.prefill_chunk,
            self.snapshot_every,
            self.max_tokens,
            self.sampler
        );
        ensure_same_fingerprint(
            world.as_ref(),
            fnv1a(turn.bytes()),
            "turn (prompt, message boundaries, --prefill-chunk-size, --prompt-cache-every, \
             --max-tokens, sampling)",
        )?;
        let (cached, mut cache) =
            lookup_on_every_rank(&mut self.prompt_cache, world.as_ref(), ids)?
                .unwrap_or_else(|| (0, self.model.new_cache()));
        // The pieces `Engine::generate` runs in one process, so that the snapshots (and the
        // rounding of every chunk) are the same.
        let head_len = ids.len() - 1;
        let prefill = ChunkedPrefill::new(
            cache.offset,
            head_len,
            self.prefill_chunk,
            &prompt.boundaries,
            self.snapshot_every,
        )?;
        while let Some(piece) = prefill.next_piece(cache.offset)? {
            match piece {
                PrefillPiece::Chunk(range) => {
                    let chunk = range.len();
                    self.plan
                        .prefill(&self.model, &ids[range], &mut cache, chunk)?;
                }
                PrefillPiece::AloneThenSnapshot(stop) => {
                    self.plan
                        .forward_last(&self.model, &ids[stop - 1..stop], &mut cache)?;
                    self.prompt_cache.insert(&ids[..stop], &cache)?;
                }
            }
        }
        let mut logits = self.plan.forward_last(&self.model, &[last], &mut cache)?;
        self.prompt_cache.insert(ids, &cache)?;

        let mut sampler = self
            .plan
            .picks()
            .then(|| Sampler::new(self.sampler.clone(), Some(seed)));
        let mut outcome = Outcome {
            cached_tokens: cached,
            prefilled_tokens: ids.len() - cached,
            ..Outcome::started(ids.len())
        };
        let mut history = vec![last];
        let mut stream = TokenStream::new();
        let max_positions = self.model.config().max_position_embeddings;
        let tokenizer = &checkpoint.tokenizer;
        loop {
            let chosen = match (logits.take(), sampler.as_mut()) {
                (Some(logits), Some(sampler)) => Some(sample(sampler, &logits, &history)?),
                _ => None,
            };
            let token = self.plan.share_token(chosen)?;
            outcome.prompt_time.get_or_insert_with(|| start.elapsed());
            outcome.generated += 1; // counted even when it is EOS, as the engine does
            outcome.tokens.push(token);
            history.push(token);
            if self.eos.contains(&token) {
                outcome.finish = FinishReason::Stop;
                break;
            }
            let mut stop = cancel.is_some_and(|c| c.load(Ordering::SeqCst));
            if let Some(on_text) = on_text.as_mut() {
                if let Some(text) = stream.push(tokenizer, token)? {
                    stop |= !text.is_empty() && on_text(&text).is_break();
                }
            }
            // Rank 0's stop, on every rank.
            if world.all_gather_u64(u64::from(stop))?[0] != 0 {
                outcome.finish = FinishReason::Cancelled;
                break;
            }
            if outcome.generated >= self.max_tokens {
                outcome.finish = FinishReason::Length;
                break;
            }
            if cache.offset >= max_positions {
                outcome.finish = FinishReason::ContextFull;
                break;
            }
            logits = self.plan.forward_last(&self.model, &[token], &mut cache)?;
        }
        if let Some(on_text) = on_text {
            if outcome.finish != FinishReason::Cancelled {
                let rest = stream.finish(tokenizer)?;
                if !rest.is_empty() {
                    let _ = on_text(&rest);
                }
            }
        }
        outcome.generation_time = outcome.prompt_time.map(|p| start.elapsed() - p);
        Ok(outcome)
    }
}

/// The sampler's pick from `logits` `[1, vocab]` (f32).
fn sample(sampler: &mut Sampler, logits: &Tensor, history: &[u32]) -> Result<u32> {
    let mut row = logits.flatten_all()?.to_vec1::<f32>()?;
    ensure!(
        row.iter().all(|x| x.is_finite()),
        "the model produced non-finite logits"
    );
    Ok(sampler.sample(&mut row, history))
}

/// Rank 0's side: each turn broadcast to the other ranks, then run with them.
pub struct RankedReplies {
    checkpoint: Checkpoint,
    turns: RankedTurns,
}

impl RankedReplies {
    pub fn new(checkpoint: Checkpoint, turns: RankedTurns) -> Self {
        Self { checkpoint, turns }
    }

    /// Sends `values` to every other rank.
    fn broadcast(&self, values: &[u32]) -> Result<()> {
        let world = self.turns.world();
        let bits: Vec<f32> = values.iter().map(|&v| f32::from_bits(v)).collect();
        for rank in 1..world.size() {
            world.send(rank, &bits)?;
        }
        Ok(())
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
        // Every rank samples with the same seed (under a split plan each rank draws its token).
        let seed = params.seed.unwrap_or_else(rand::random);
        let count = |n: usize| u32::try_from(n).context("a prompt of more than 2^32 tokens");
        self.broadcast(&[
            TURN,
            count(prompt.ids.len())?,
            count(prompt.boundaries.len())?,
            seed as u32,
            (seed >> 32) as u32,
        ])?;
        self.broadcast(&prompt.ids)?;
        let boundaries = prompt
            .boundaries
            .iter()
            .map(|&b| count(b))
            .collect::<Result<Vec<_>>>()?;
        self.broadcast(&boundaries)?;
        self.turns
            .run(&self.checkpoint, prompt, seed, Some(cancel), Some(on_text))
    }

    fn errors_end_session(&self) -> bool {
        true
    }

    fn end(&mut self) -> Result<()> {
        self.broadcast(&[END, 0, 0, 0, 0])
    }
}

/// Every rank but 0: runs each turn rank 0 broadcasts until it ends the session.
pub fn follow_turns(checkpoint: &Checkpoint, mut turns: RankedTurns) -> Result<()> {
    let world = turns.world().clone();
    let receive = |n: usize, waiting: bool| -> Result<Vec<u32>> {
        let mut bits = vec![0f32; n];
        match waiting {
            true => world.receive_waiting(0, &mut bits)?,
            false => world.receive(0, &mut bits)?,
        }
        Ok(bits.into_iter().map(f32::to_bits).collect())
    };
    loop {
        let header = receive(5, true)?;
        match header[0] {
            END => return Ok(()),
            TURN => {}
            kind => anyhow::bail!("rank 0 sent a message of unknown kind {kind}"),
        }
        let ids = receive(header[1] as usize, false)?;
        let boundaries = receive(header[2] as usize, false)?;
        let prompt = PromptTokens {
            ids,
            boundaries: boundaries.into_iter().map(|b| b as usize).collect(),
        };
        let seed = u64::from(header[3]) | (u64::from(header[4]) << 32);
        turns.run(checkpoint, &prompt, seed, None, None)?;
    }
}
