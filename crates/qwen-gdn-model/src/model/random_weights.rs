//! A model of random weights from config.json alone ([`Model::random`]): the benchmark of a
//! full-size model whose checkpoint does not fit the machine's disk. The weights come from
//! [`Checkpoint::random`] through the loaders a checkpoint goes through, in its layout.

use super::Model;
use crate::families::qwen4_exp::ngram_hash::NgramHash;
use crate::families::qwen4_exp::ngram_tables;
use crate::weights::Checkpoint;
use crate::{Config, RunOptions};
use anyhow::Result;
use candle_core::Device;

/// How random weights are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandomWeights {
    pub seed: u64,
    /// Rows of each `qwen4_exp` n-gram table (about: the hash rounds them to its primes and
    /// padding). A decode step gathers one row per hashed head, whatever the table's size, so
    /// a smaller table times the same step; the release's (~320M rows a layer, 51 GB in all)
    /// would not fit a GPU machine's memory next to the model.
    pub ngram_rows: u64,
}

impl RandomWeights {
    /// About 1M rows a table: ~100 MB a PLE layer at 4 bits.
    pub const DEFAULT_NGRAM_ROWS: u64 = 1 << 20;

    /// `config` as the random model has it: the n-gram hash's table size lowered to about
    /// [`Self::ngram_rows`] rows (never raised). With a note for the user when it changed.
    pub fn shape_config(&self, mut config: Config) -> (Config, Option<String>) {
        let vocab = config.vocab_size;
        let Some(ple) = config.qwen4_exp.as_mut().and_then(|q| q.ple.as_mut()) else {
            return (config, None);
        };
        let release = NgramHash::new(ple, 0, vocab).rows;
        let base = (self.ngram_rows / ple.heads().max(1) as u64).max(2);
        if base >= ple.vocab_base {
            return (config, None);
        }
        ple.vocab_base = base;
        let rows = NgramHash::new(ple, 0, vocab).rows;
        let note = format!(
            "n-gram table: {rows} rows instead of the release's {release} (a decode step gathers only its rows)"
        );
        (config, Some(note))
    }
}

impl Model {
    /// The model `config` describes, with random weights of its real shapes and quantized
    /// layouts (`weights/random_weights.rs`), each made on the host, moved to `device` and
    /// dropped before the next. `config` should come through [`RandomWeights::shape_config`].
    /// The multi-token-prediction head is not built.
    pub fn random(
        config: Config,
        weights: RandomWeights,
        device: &Device,
        opts: &RunOptions,
    ) -> Result<Self> {
        let plan = Self::checked_plan(device, opts)?;
        let ckpt = Checkpoint::random(&config, weights.seed);
        ngram_tables::declare_random(&ckpt, &config);
        Self::from_checkpoint(config, ckpt, plan, device, opts)
    }
}
