//! `--draft-model`: a separate small model that drafts for speculative decoding (issue 28,
//! as `mlx_lm.generate --draft-model`). It is loaded with the main model's settings (device,
//! dtype, state dtype) and must speak the same tokens: its tokenizer's vocabulary is compared
//! with the main one's, token for token, and a difference is refused in one line.

use crate::load::{Checkpoint, ModelArgs};
use anyhow::{bail, Result};
use qwen_gdn_model::Model;
use std::sync::Arc;

/// Loads `source` (a folder or Hub repo) as a draft model for `main`'s checkpoint, for runs of
/// at most `context` positions.
pub fn load(
    source: &str,
    main_args: &ModelArgs,
    main: &Checkpoint,
    context: usize,
) -> Result<Arc<Model>> {
    let args = ModelArgs {
        model: source.to_string(),
        revision: None,
        ..main_args.clone()
    };
    let draft = args.open()?;
    if let Some(why) = vocabulary_difference(&draft, main) {
        bail!(
            "--draft-model {source}: its tokenizer is not the main model's ({why}); speculative decoding needs the same tokens"
        );
    }
    Ok(Arc::new(args.load_model(&draft, context)?))
}

/// How the two tokenizers' vocabularies differ (added tokens included), or `None`.
fn vocabulary_difference(draft: &Checkpoint, main: &Checkpoint) -> Option<String> {
    let (d, m) = (
        draft.tokenizer.get_vocab(true),
        main.tokenizer.get_vocab(true),
    );
    if d.len() != m.len() {
        return Some(format!("{} tokens against {}", d.len(), m.len()));
    }
    let mut differing: Vec<&String> = m
        .iter()
        .filter(|(t, id)| d.get(*t) != Some(id))
        .map(|(t, _)| t)
        .collect();
    differing.sort();
    differing
        .first()
        .map(|t| format!("token {t:?} has another id"))
}
