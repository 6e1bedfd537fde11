//! TEMPORARY: the sampling and chat-template flags of `generate`, until the pcache branch's
//! `SamplingArgs`/`TemplateArgs` groups (extracted from generate.rs) replace this file.

use crate::chat_template::RESERVED_VARIABLES;
use crate::load::positive_usize;
use crate::sampler::SamplerConfig;
use serde_json::{Map, Value as Json};

#[derive(clap::Args)]
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
    /// How many recent tokens --repetition-penalty looks at
    #[arg(long, default_value_t = 20, value_name = "N", value_parser = positive_usize)]
    pub repetition_context_size: usize,
    /// Seed of the sampler's random generator (reproducible sampling)
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn sampler_config(&self) -> SamplerConfig {
        SamplerConfig {
            temp: self.temp,
            top_p: self.top_p,
            min_p: self.min_p,
            top_k: self.top_k,
            repetition_penalty: self.repetition_penalty,
            repetition_context_size: self.repetition_context_size,
        }
    }
}

#[derive(clap::Args)]
pub struct TemplateArgs {
    /// Passed to the chat template as `enable_thinking` [default: true when the vocabulary
    /// has <think>]
    #[arg(long, value_name = "true|false", value_parser = clap::value_parser!(bool))]
    pub enable_thinking: Option<bool>,
    /// Extra chat-template variables as a JSON object, e.g. '{"enable_thinking": false}'
    #[arg(long, alias = "chat-template-config", value_name = "JSON", value_parser = template_args)]
    pub chat_template_args: Option<Map<String, Json>>,
}

fn parse_f32(s: &str) -> Result<f32, String> {
    s.parse::<f32>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| "expected a number".into())
}

fn non_negative(s: &str) -> Result<f32, String> {
    parse_f32(s).and_then(|x| {
        if x >= 0.0 {
            Ok(x)
        } else {
            Err("must be 0 or more".into())
        }
    })
}

fn positive(s: &str) -> Result<f32, String> {
    parse_f32(s).and_then(|x| {
        if x > 0.0 {
            Ok(x)
        } else {
            Err("must be more than 0".into())
        }
    })
}

fn probability(s: &str) -> Result<f32, String> {
    parse_f32(s).and_then(|x| {
        if (0.0..=1.0).contains(&x) {
            Ok(x)
        } else {
            Err("must be between 0 and 1".into())
        }
    })
}

fn probability_above_zero(s: &str) -> Result<f32, String> {
    probability(s).and_then(|x| {
        if x > 0.0 {
            Ok(x)
        } else {
            Err("must be more than 0 and at most 1".into())
        }
    })
}

fn template_args(s: &str) -> Result<Map<String, Json>, String> {
    match serde_json::from_str(s) {
        Ok(Json::Object(map)) => match RESERVED_VARIABLES.iter().find(|k| map.contains_key(**k)) {
            Some(key) => Err(format!(
                "`{key}` is set by qwen-gdn and cannot be overridden"
            )),
            None => Ok(map),
        },
        Ok(_) => Err("expected a JSON object".into()),
        Err(e) => Err(format!("invalid JSON: {e}")),
    }
}
