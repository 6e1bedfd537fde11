//! `bench --config <config.json> --random-weights`: the model config.json describes, with
//! random weights of its real shapes and quantized layouts made on the device's side one
//! tensor at a time (`qwen_gdn_model::Model::random`), so that a full-size model is timed
//! without its checkpoint on disk. Token ids only: no tokenizer is read.

use crate::load::ModelArgs;
use anyhow::{anyhow, bail, Result};
use qwen_gdn_model::{Config, Model, RandomWeights};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct RandomWeightArgs {
    /// Time the model --config describes with random weights of its real shapes, quantized as
    /// its `quantization` block declares (as an mlx conversion stores them), instead of a
    /// checkpoint (--model): for full-size models whose checkpoint does not fit the disk.
    /// Decode speed equals a written checkpoint's; the tokens are meaningless
    #[arg(long, requires = "config", conflicts_with_all = ["prompt_cache", "draft_tokens", "mtp_from", "draft_model"])]
    pub random_weights: bool,
    /// With --random-weights: the model's config.json
    #[arg(long, value_name = "CONFIG.JSON", requires = "random_weights")]
    pub config: Option<PathBuf>,
    /// With --random-weights: the seed of the weights
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub seed: u64,
    /// With --random-weights: rows of each qwen4_exp n-gram table (about; the hash rounds to
    /// its primes). A decode step gathers one row per hashed head whatever the table's size;
    /// the release's (~320M rows a layer) would not fit in memory
    #[arg(long, default_value_t = RandomWeights::DEFAULT_NGRAM_ROWS, value_name = "ROWS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub ngram_rows: u64,
}

/// A random model, and what bench says about it.
pub struct RandomModel {
    pub model: Model,
    /// The config file, as the report's `model`.
    pub name: String,
    /// Each line printed on stderr before the run (the n-gram table's size).
    pub notes: Vec<String>,
}

impl RandomWeightArgs {
    /// The config to build, or `None` for a checkpoint run; `--model` and `--random-weights`
    /// together (or neither) is an error.
    pub fn config(&self, model: &ModelArgs) -> Result<Option<(PathBuf, Config)>> {
        if !self.random_weights {
            if model.model.is_empty() {
                bail!(
                    "bench needs --model <FOLDER|REPO>, or --config <config.json> --random-weights"
                );
            }
            return Ok(None);
        }
        if !model.model.is_empty() {
            bail!("--random-weights builds the model from --config: leave out --model");
        }
        let path = self
            .config
            .clone()
            .ok_or_else(|| anyhow!("--random-weights needs --config <config.json>"))?;
        if !path.is_file() {
            bail!("{}: config file not found", path.display());
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow!("{}: cannot read: {e}", path.display()))?;
        let config = Config::from_json_str(&text, &path.display().to_string())?;
        Ok(Some((path, config)))
    }

    /// Builds the random model for a run of `context` positions.
    pub fn load(
        &self,
        model: &ModelArgs,
        path: PathBuf,
        config: Config,
        context: usize,
    ) -> Result<RandomModel> {
        let weights = RandomWeights {
            seed: self.seed,
            ngram_rows: self.ngram_rows,
        };
        let (config, note) = weights.shape_config(config);
        let built = model.load_with(
            |device, state, dtype| {
                crate::load::preflight::check_config(device, &config, context, state, dtype)
            },
            |device, opts| Model::random(config.clone(), weights, device, opts),
            qwen_gdn_model::ModelPart::Whole,
        )?;
        let mut notes = vec![format!(
            "random weights (seed {}) of the shapes in {}",
            self.seed,
            path.display()
        )];
        notes.extend(note);
        Ok(RandomModel {
            model: built,
            name: path.display().to_string(),
            notes,
        })
    }
}
