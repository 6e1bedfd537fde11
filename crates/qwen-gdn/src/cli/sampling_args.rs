//! The sampling flags shared by `generate` and `chat` (mlx_lm.generate's names and defaults).

use crate::cli::arg_ranges::{
    non_negative, penalty, positive, probability, probability_above_zero,
};
use crate::engine::sampler::SamplerConfig;
use crate::load::positive_usize;

#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Maximum number of tokens to generate
    #[arg(long, default_value_t = 256, value_name = "N", value_parser = positive_usize)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 picks the most likely token (greedy)
    #[arg(long, default_value_t = 0.0, value_parser = non_negative)]
    pub temp: f32,
    /// Nucleus sampling: sample among the most likely tokens holding this much probability
    #[arg(long, default_value_t = 1.0, value_parser = probability_above_zero)]
    pub top_p: f32,
    /// Sample among the K most likely tokens; 0 = all
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_k: usize,
    /// Drop tokens less likely than this fraction of the most likely one; 0 = off
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    pub min_p: f32,
    /// Penalise tokens seen in the last --repetition-context-size tokens (> 1 discourages repeats)
    #[arg(long, value_parser = positive)]
    pub repetition_penalty: Option<f32>,
    /// Subtract this from the logit of every token seen in the last --repetition-context-size
    /// tokens (OpenAI's presence_penalty, -2 to 2)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = penalty)]
    pub presence_penalty: f32,
    /// Subtract this from a token's logit once per time it was seen in the last
    /// --repetition-context-size tokens (OpenAI's frequency_penalty, -2 to 2)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = penalty)]
    pub frequency_penalty: f32,
    /// How many recent tokens the repetition, presence and frequency penalties look at
    #[arg(long, default_value_t = 20, value_name = "N", value_parser = positive_usize)]
    pub repetition_context_size: usize,
    /// Seed of the sampler's random generator (reproducible sampling)
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn sampler(&self) -> SamplerConfig {
        SamplerConfig {
            temp: self.temp,
            top_p: self.top_p,
            min_p: self.min_p,
            top_k: self.top_k,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_context_size: self.repetition_context_size,
        }
    }
}
