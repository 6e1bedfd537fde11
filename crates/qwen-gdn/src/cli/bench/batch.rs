//! `qwen-gdn bench --batch B,…`: batched decode (issue 29). For each B, B sequences of their
//! own -p-token random prompts are prefilled one by one (not timed), then decoded greedily
//! together for -g steps of `Model::decode_batch`, every sequence at its own position. The
//! aggregate speed counts all B sequences' tokens, the per-sequence speed one sequence's.

use super::common::{Stats, PROMPT_SEED};
use super::rate;
use anyhow::{Context, Result};
use candle_core::D;
use qwen_gdn_model::{BatchMoe, BatchProducts, Cache, Model};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::json;
use std::time::{Duration, Instant};

/// `--batch-products`: [`BatchProducts`] on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum ProductsArg {
    EachRowAlone,
    Shared,
}

impl From<ProductsArg> for BatchProducts {
    fn from(arg: ProductsArg) -> Self {
        match arg {
            ProductsArg::EachRowAlone => Self::EachRowAlone,
            ProductsArg::Shared => Self::Shared,
        }
    }
}

/// `--batch-moe`: [`BatchMoe`] on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum MoeArg {
    Gathered,
    Grouped,
}

impl From<MoeArg> for BatchMoe {
    fn from(arg: MoeArg) -> Self {
        match arg {
            MoeArg::Gathered => Self::Gathered,
            MoeArg::Grouped => Self::Grouped,
        }
    }
}

/// Aggregate and per-sequence generation speed at one batch size.
pub(super) struct BatchRow {
    pub batch: usize,
    pub aggregate: Stats,
    pub per_sequence: Stats,
}

impl BatchRow {
    pub fn json(&self) -> serde_json::Value {
        json!({
            "batch": self.batch,
            "aggregate_tps": self.aggregate,
            "per_sequence_tps": self.per_sequence,
        })
    }
}

/// Every batch size of `sizes`: one warm-up and `repetitions` timed runs each.
pub(super) fn run(
    model: &Model,
    sizes: &[usize],
    (p, g): (usize, usize),
    bound: u32,
    chunk: usize,
    repetitions: usize,
) -> Result<Vec<BatchRow>> {
    sizes
        .iter()
        .map(|&b| {
            let mut rng = StdRng::seed_from_u64(PROMPT_SEED);
            let prompts: Vec<Vec<u32>> = (0..b)
                .map(|_| (0..p).map(|_| rng.random_range(0..bound)).collect())
                .collect();
            let what = |i: Option<usize>| {
                let rep = i.map_or("warm-up".into(), |i| format!("repetition {}", i + 1));
                format!("batch {b}, {rep}")
            };
            repetition(model, &prompts, g, chunk).with_context(|| what(None))?;
            let mut times = vec![];
            for i in 0..repetitions {
                times.push(repetition(model, &prompts, g, chunk).with_context(|| what(Some(i)))?);
            }
            Ok(BatchRow {
                batch: b,
                aggregate: Stats::new(times.iter().map(|&t| rate(b * g, t)).collect()),
                per_sequence: Stats::new(times.iter().map(|&t| rate(g, t)).collect()),
            })
        })
        .collect()
}

/// Prefills every prompt but its last token, then times `g` batched greedy steps.
fn repetition(model: &Model, prompts: &[Vec<u32>], g: usize, chunk: usize) -> Result<Duration> {
    let mut caches: Vec<Cache> = prompts
        .iter()
        .map(|prompt| {
            let mut cache = model.new_cache();
            model.prefill(&prompt[..prompt.len() - 1], &mut cache, chunk)?;
            Ok(cache)
        })
        .collect::<Result<_>>()?;
    let mut tokens: Vec<u32> = prompts.iter().map(|p| *p.last().expect("-p ≥ 1")).collect();
    let start = Instant::now();
    for _ in 0..g {
        let mut refs: Vec<&mut Cache> = caches.iter_mut().collect();
        let logits = model.decode_batch(&tokens, &mut refs)?;
        // One read-back per step: every row's argmax at once.
        tokens = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
    }
    Ok(start.elapsed())
}
