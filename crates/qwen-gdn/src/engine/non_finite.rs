//! The error for NaN or Inf logits.

use qwen_gdn_model::{diagnose, Model};

/// The error for NaN or Inf logits after `tokens`, naming the part of the model that first
/// produced them (found by running the tokens again, part by part).
pub fn non_finite_logits(model: &Model, tokens: &[u32], chunk: usize) -> anyhow::Error {
    let origin = match diagnose::first_non_finite(model, tokens, chunk) {
        Ok(origin) => origin.to_string(),
        Err(e) => format!("unknown (re-running the model failed: {e})"),
    };
    anyhow::anyhow!(
        "the model produced NaN or Inf logits after {} tokens; first produced by {origin} \
         (broken weights, or a config.json that does not match the checkpoint)",
        tokens.len()
    )
}
