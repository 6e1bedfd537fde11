//! mlx-vlm's separate MTP drafter checkpoint (what `mlx_vlm.convert --mtp` and
//! `speculative/drafters/qwen4_exp_mtp/split.py` write, docs/mtp.md §8): a folder whose
//! config.json says `model_type: qwen4_exp_mtp` and carries the main model's `text_config`,
//! whose tensors are the head's alone, named without the `mtp.` prefix (experts stacked as
//! `switch_mlp`), and whose own `quantization` block (when `--q-bits` asked for one) says how
//! they are quantized. [`super::Checkpoint::open_mtp`] reads such a folder as the `mtp.*` view.

use super::files::read_json_text;
use crate::config::{read_quantization, Quantization};
use crate::Config;
use anyhow::{anyhow, bail, Result};
use serde_json::Value;
use std::path::Path;

/// The drafter `model_type`s read here, and the main `model_type`s each drafts for (mlx-vlm's
/// `MTP_SPLITTERS`).
const DRAFTERS: [(&str, &[&str]); 1] = [("qwen4_exp_mtp", &["qwen4_exp", "qwen4_exp_text"])];

/// Whether `dir`'s config.json names a separate MTP drafter (mlx-vlm's `<base>_mtp` model
/// types, read or not): such a folder is a head for the main model, never a model to run
/// (`--draft-model` of one loads it as the head, as mlx-vlm's `load_drafter` does).
pub fn declares_a_drafter(dir: &Path) -> bool {
    let text = read_json_text(&dir.join("config.json")).ok().flatten();
    let root: Option<Value> = text.and_then(|t| serde_json::from_str(&t).ok());
    let model_type = root.as_ref().and_then(|r| r.get("model_type"));
    model_type
        .and_then(Value::as_str)
        .is_some_and(|t| t.ends_with("_mtp"))
}

/// What a drafter folder's config.json declares beyond its tensors.
pub(crate) struct DrafterFolder {
    /// Its own `quantization` block: the bits its quantized tensors must be stored at.
    pub quantization: Quantization,
}

impl DrafterFolder {
    /// The drafter in `dir`, checked to draft for `main`; `None` when `dir`'s config.json is
    /// not a drafter's (an ordinary checkpoint: its head is its `mtp.*` tensors).
    pub fn read(dir: &Path, main: &Config) -> Result<Option<Self>> {
        let path = dir.join("config.json");
        let origin = path.display().to_string();
        let Some(text) = read_json_text(&path)? else {
            return Ok(None);
        };
        let root: Value =
            serde_json::from_str(&text).map_err(|e| anyhow!("{origin}: invalid JSON: {e}"))?;
        let Some(root) = root.as_object() else {
            bail!("{origin}: expected a JSON object");
        };
        let Some(model_type) = root.get("model_type").and_then(Value::as_str) else {
            return Ok(None);
        };
        let Some((_, targets)) = DRAFTERS.iter().find(|(t, _)| *t == model_type) else {
            if model_type.ends_with("_mtp") {
                bail!(
                    "{origin}: a `{model_type}` drafter is not supported (only {})",
                    DRAFTERS.map(|(t, _)| t).join(", ")
                );
            }
            return Ok(None);
        };
        if !targets.contains(&main.model_type.as_str()) {
            bail!(
                "{origin}: a `{model_type}` drafter drafts for {}, the main model is `{}`",
                targets.join(" / "),
                main.model_type
            );
        }
        let text = match root.get("text_config") {
            Some(Value::Object(text)) => text,
            _ => bail!("{origin}: a `{model_type}` drafter without a `text_config` object"),
        };
        // The dims the head's tensors are checked against are the main model's; these make a
        // drafter of another model a one-line error before any tensor is read.
        let hc_count = main.qwen4_exp.as_ref().map_or(0, |q| q.hc_count);
        let dims = [
            ("hidden_size", main.hidden_size),
            ("hc_count", hc_count),
            ("vocab_size", main.vocab_size),
            ("num_experts", main.num_experts),
            ("moe_intermediate_size", main.moe_intermediate_size),
        ];
        for (field, want) in dims {
            let got = text.get(field).and_then(Value::as_u64);
            if got != Some(want as u64) {
                let got = got.map_or("missing".to_string(), |n| n.to_string());
                bail!(
                    "{origin}: text_config.{field} is {got}, the main model's is {want}: a drafter for another model"
                );
            }
        }
        Ok(Some(Self {
            quantization: read_quantization(root, &origin)?,
        }))
    }
}
