//! Which tokens end a reply.

use crate::load::{read_json_opt, Checkpoint};
use crate::text::special_tokens::special_tokens;
use anyhow::{Context, Result};
use serde_json::Value as Json;

/// Stop tokens: generation_config.json's eos_token_id, else config.json's, else the tokenizer's
/// eos_token (mlx-lm's order).
pub fn eos_ids(checkpoint: &Checkpoint, config_eos: &[u32]) -> Result<Vec<u32>> {
    let path = checkpoint.dir.join("generation_config.json");
    if let Some(ids) = read_json_opt(&path)?.and_then(|g| g.get("eos_token_id").cloned()) {
        let ids = match &ids {
            Json::Array(list) => list.iter().map(token_id).collect::<Option<Vec<_>>>(),
            Json::Number(_) => token_id(&ids).map(|id| vec![id]),
            _ => None,
        };
        let ids = ids.with_context(|| {
            format!(
                "{}: eos_token_id is not a token id or a list of them",
                path.display()
            )
        })?;
        return Ok(ids);
    }
    if !config_eos.is_empty() {
        return Ok(config_eos.to_vec());
    }
    let eos = special_tokens(checkpoint.tokenizer_config.as_ref()).remove("eos_token");
    Ok(eos
        .and_then(|t| checkpoint.tokenizer.token_to_id(t.as_str()?))
        .into_iter()
        .collect())
}

/// A token id (the model's config check has bounded it by the vocabulary; never wrapped).
fn token_id(v: &Json) -> Option<u32> {
    v.as_u64().and_then(|id| u32::try_from(id).ok())
}
