//! Turns over ranks, for `chat` (chat_ranks.rs) and `serve` (serve/ranked_backend.rs) under
//! `mpirun -n N` or `--ranks N` (`--parallel` picks the plan, as for `generate`). Rank 0
//! holds the session or the HTTP server and leads each turn ([`RankedTurns::lead`]); the
//! other ranks run [`follow_turns`]. Every rank then runs the same turn in lock step: the
//! prompt cache looked up on every rank at once (each holds its own shard of the state:
//! `qwen_gdn_model::prompt_cache::lookup_on_every_rank`), the prefill's pieces with the
//! snapshots one process takes at the same places, and the decode steps with the token every
//! rank continues with (the plan's rule).
//!
//! The broadcast, rank 0 to each other rank, point to point, u32 values as the bits of f32:
//! - a header (turn_message.rs): a turn with its prompt's token and boundary counts, seed,
//!   token limit and sampling settings, or the end of the session; then the prompt's ids and
//!   its message boundaries;
//! - after each sampled token, every rank gathers rank 0's verdict (go on; stop: Ctrl-C, a
//!   client gone, stdout closed; or a stop string in the text, which only rank 0 has), so
//!   that all end the turn at the same token.
//!
//! The other ranks wait for a header with no deadline (a person is typing, or no request
//! came); every other wait is bounded by `--rank-timeout`, after which the rank ends with one
//! line naming the rank it waited for. An error during a turn ends the job on every rank (the
//! ranks could no longer be in step).

use crate::cli::prompt_cache_args::PromptCacheArgs;
use crate::cli::rank_plan::RankPlan;
use crate::cli::ranks::ParallelKind;
use crate::cli::turn_message::{TurnMessage, HEADER_LEN};
use crate::engine::sampler::Sampler;
use crate::engine::{
    eos_ids, FinishReason, GenerateParams, Outcome, PromptTokens, ReplySink, Scan, StopStrings,
};
use crate::load::{Checkpoint, ModelArgs};
use crate::ui::output::eprint_line;
use anyhow::{ensure, Context, Result};
use candle_core::Tensor;
use qwen_gdn_collective::{ensure_same_fingerprint, fnv1a, World};
use qwen_gdn_model::prompt_cache::{lookup_on_every_rank, ChunkedPrefill, PrefillPiece};
use qwen_gdn_model::{Config, Model, PromptCache};
use std::time::Instant;

/// Rank 0's verdict after a token, gathered by every rank.
const GO_ON: u64 = 0;
const CANCELLED: u64 = 1;
const STOP_STRING: u64 = 2;

/// How a job's ranks split the model and cache prompts (the flags every rank reads from the
/// same command line).
pub struct RankSetup<'a> {
    pub parallel: ParallelKind,
    pub model: &'a ModelArgs,
    /// The prompt cache's budget (the job's smallest rank's is used) and snapshots.
    pub prompt_cache: &'a PromptCacheArgs,
}

/// What every rank holds to run turns: its share of the model, its prompt cache (of its
/// shard), and the settings every rank reads from the same command line.
pub struct RankedTurns {
    plan: RankPlan,
    model: Model,
    prompt_cache: PromptCache,
    prefill_chunk: usize,
    snapshot_every: Option<usize>,
    eos: Vec<u32>,
}

impl RankedTurns {
    /// Loads this rank's share of the model under `setup`'s plan over `world` (the layout line
    /// printed), with a prompt cache of the same budget on every rank.
    pub fn load(
        setup: &RankSetup,
        checkpoint: &Checkpoint,
        context: usize,
        world: World,
    ) -> Result<Self> {
        let config = Config::from_dir(&checkpoint.dir)?;
        let plan = RankPlan::new(setup.parallel, world, &config)?;
        eprint_line(&plan.layout_line());
        let part = plan.part(config.num_hidden_layers);
        let mut model = setup.model.load_model_part(checkpoint, context, part)?;
        plan.ready(&mut model)?;
        // The smallest rank's budget everywhere, so that eviction is alike (not required: the
        // ranks' lookups agree or all miss).
        let budget = setup.prompt_cache.budget(model.device());
        let budget = (plan.world().all_gather_u64(budget)?.into_iter().min()).unwrap_or(budget);
        let eos = eos_ids(checkpoint, &model.config().eos_token_id)?;
        Ok(Self {
            plan,
            model,
            prompt_cache: PromptCache::new(budget),
            prefill_chunk: setup.model.prefill_chunk_size,
            snapshot_every: setup.prompt_cache.prompt_cache_every,
            eos,
        })
    }

    pub fn world(&self) -> &World {
        self.plan.world()
    }

    pub fn rank(&self) -> usize {
        self.plan.rank()
    }

    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// This rank's prompt cache (of its shard).
    pub fn prompt_cache(&self) -> &PromptCache {
        &self.prompt_cache
    }

    /// Rank 0: announces the turn to the other ranks and runs it with them; its text goes to
    /// `sink`, whose cancel (checked after each token) ends the turn on every rank. A seed is
    /// drawn when `params` has none (every rank samples with the same one).
    pub fn lead(
        &mut self,
        checkpoint: &Checkpoint,
        prompt: &PromptTokens,
        params: &GenerateParams,
        sink: &mut dyn ReplySink,
    ) -> Result<Outcome> {
        let mut params = params.clone();
        params.seed = Some(params.seed.unwrap_or_else(rand::random));
        let header = TurnMessage::Turn {
            ids: prompt.ids.len(),
            boundaries: prompt.boundaries.len(),
            params: params.clone(),
        };
        self.broadcast(&header.encode()?)?;
        self.broadcast(&prompt.ids)?;
        let boundaries = (prompt.boundaries.iter())
            .map(|&b| u32::try_from(b).context("a message boundary past 2^32 tokens"))
            .collect::<Result<Vec<_>>>()?;
        self.broadcast(&boundaries)?;
        self.run(checkpoint, prompt, &params, Some(sink))
    }

    /// Rank 0: the session is over; the other ranks end.
    pub fn end(&self) -> Result<()> {
        self.broadcast(&TurnMessage::End.encode()?)
    }

    /// Sends `values` to every other rank.
    fn broadcast(&self, values: &[u32]) -> Result<()> {
        let world = self.world();
        let bits: Vec<f32> = values.iter().map(|&v| f32::from_bits(v)).collect();
        for rank in 1..world.size() {
            world.send(rank, &bits)?;
        }
        Ok(())
    }

    /// The sampler's seed every rank uses: `asked`, or under a split plan (where every rank
    /// samples) rank 0's random one.
    pub fn seed(&self, asked: Option<u64>) -> Result<Option<u64>> {
        self.plan.seed(asked)
    }

    /// One turn on this rank, in step with the others, which run it with the same prompt and
    /// `params` (announced by [`RankedTurns::lead`], or read by every rank from the same
    /// command line as `generate` does). Rank 0 passes the sink of the text and the cancel;
    /// the other ranks pass none. The stop strings are rank 0's alone.
    pub fn run(
        &mut self,
        checkpoint: &Checkpoint,
        prompt: &PromptTokens,
        params: &GenerateParams,
        mut sink: Option<&mut dyn ReplySink>,
    ) -> Result<Outcome> {
        let start = Instant::now();
        let ids = &prompt.ids;
        let (&last, _) = ids.split_last().context("the prompt has no tokens")?;
        let world = self.plan.world().clone();
        // Every rank must cut the prefill at the same places and stop at the same token, or
        // their transfers would no longer match (ranks may be started with other flags).
        let turn = format!(
            "{:?} {:?} {} {:?} {} {:?} {:?}",
            ids,
            prompt.boundaries,
            self.prefill_chunk,
            self.snapshot_every,
            params.max_tokens,
            params.sampler,
            params.seed,
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
            .then(|| Sampler::new(params.sampler.clone(), params.seed));
        let mut outcome = Outcome {
            cached_tokens: cached,
            prefilled_tokens: ids.len() - cached,
            ..Outcome::started(ids.len())
        };
        let mut history = vec![last];
        let mut text = TurnText::new(&params.stop_strings);
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
            let verdict = match sink.as_deref_mut() {
                Some(sink) => text.push(tokenizer, token, sink)?,
                None => GO_ON,
            };
            // Rank 0's verdict, on every rank.
            match world.all_gather_u64(verdict)?[0] {
                GO_ON => {}
                STOP_STRING => {
                    outcome.finish = FinishReason::Stop;
                    break;
                }
                _ => {
                    outcome.finish = FinishReason::Cancelled;
                    break;
                }
            }
            if outcome.generated >= params.max_tokens {
                outcome.finish = FinishReason::Length;
                break;
            }
            if cache.offset >= max_positions {
                outcome.finish = FinishReason::ContextFull;
                break;
            }
            logits = self.plan.forward_last(&self.model, &[token], &mut cache)?;
        }
        if let Some(sink) = sink {
            if outcome.finish != FinishReason::Cancelled && outcome.generated > 0 {
                text.finish(tokenizer, sink)?;
            }
        }
        outcome.generation_time = outcome.prompt_time.map(|p| start.elapsed() - p);
        Ok(outcome)
    }
}

/// Rank 0's text of a turn: the tokens' text through the stop strings to the sink, as the
/// engine's reply does (engine/sequence.rs).
struct TurnText {
    stream: crate::text::stream::TokenStream,
    stops: StopStrings,
    /// False once a stop string ended the text.
    flush_at_end: bool,
}

impl TurnText {
    fn new(stop_strings: &[String]) -> Self {
        Self {
            stream: crate::text::stream::TokenStream::new(),
            stops: StopStrings::new(stop_strings),
            flush_at_end: true,
        }
    }

    /// Streams `token`'s text; the verdict for the ranks.
    fn push(
        &mut self,
        tokenizer: &tokenizers::Tokenizer,
        token: u32,
        sink: &mut dyn ReplySink,
    ) -> Result<u64> {
        if let Some(text) = self.stream.push(tokenizer, token)? {
            match self.stops.push(&text) {
                Scan::Emit(text) => {
                    if !text.is_empty() && sink.text(&text).is_break() {
                        return Ok(CANCELLED);
                    }
                }
                Scan::Stop(text) => {
                    if !text.is_empty() {
                        let _ = sink.text(&text);
                    }
                    self.flush_at_end = false;
                    return Ok(STOP_STRING);
                }
            }
        }
        Ok(match sink.cancelled() {
            true => CANCELLED,
            false => GO_ON,
        })
    }

    /// What the stream and the stop strings still hold, at the end of a turn that was not
    /// cancelled.
    fn finish(
        &mut self,
        tokenizer: &tokenizers::Tokenizer,
        sink: &mut dyn ReplySink,
    ) -> Result<()> {
        if !self.flush_at_end {
            return Ok(());
        }
        let tail = self.stream.finish(tokenizer)?;
        let rest = match self.stops.push(&tail) {
            Scan::Emit(text) => text + &self.stops.finish(),
            Scan::Stop(text) => text,
        };
        if !rest.is_empty() {
            let _ = sink.text(&rest);
        }
        Ok(())
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

/// Every rank but 0: runs each turn rank 0 announces until it ends the session. A failed
/// turn ends this process with its one line and without finalizing MPI (which waits for
/// every rank, while rank 0 still serves): the launcher then stops the other ranks.
pub fn follow_turns(checkpoint: &Checkpoint, mut turns: RankedTurns) -> Result<()> {
    if let Err(e) = follow(checkpoint, &mut turns) {
        crate::cli::print_error(&e);
        std::process::exit(1);
    }
    Ok(())
}

fn follow(checkpoint: &Checkpoint, turns: &mut RankedTurns) -> Result<()> {
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
        let (ids, boundaries, params) = match TurnMessage::decode(&receive(HEADER_LEN, true)?)? {
            TurnMessage::End => return Ok(()),
            TurnMessage::Turn {
                ids,
                boundaries,
                params,
            } => (ids, boundaries, params),
        };
        let ids = receive(ids, false)?;
        let boundaries = receive(boundaries, false)?;
        let prompt = PromptTokens {
            ids,
            boundaries: boundaries.into_iter().map(|b| b as usize).collect(),
        };
        turns.run(checkpoint, &prompt, &params, None)?;
    }
}
