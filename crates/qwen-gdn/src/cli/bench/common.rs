//! What the parts of `bench` share: the seeded prompt, greedy picking of the next token, the
//! statistics of the timed repetitions and the Markdown table they print.

use crate::engine::non_finite_logits;
use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use qwen_gdn_model::{cache::LayerCache, Model, StateDtype};
use std::path::Path;
use tokenizers::Tokenizer;

/// Seed of the random prompt: every run and every repetition uses the same token ids.
pub(crate) const PROMPT_SEED: u64 = 0;

/// The backend column: the device the forward passes run on.
pub(crate) fn backend_name(device: &Device) -> &'static str {
    match device {
        Device::Cpu => "cpu",
        Device::Cuda(_) => "cuda",
        Device::Metal(_) => "metal",
    }
}

/// Argmax of `[1, vocab]` logits, which must be finite (the argmax of NaNs means nothing, and
/// the speed of a broken model means nothing); `seen` are the tokens that produced them. One
/// device op (`greedy_pick`: the first index of the largest value and the count of non-finite
/// values) and one read-back of its two words: the timed step syncs with the host once.
pub(crate) fn greedy(model: &Model, logits: &Tensor, seen: &[u32], chunk: usize) -> Result<u32> {
    let pick = gdn_ops::ops::greedy_pick::greedy_pick(logits)?;
    let [token, non_finite] = pick.flatten_all()?.to_vec1::<u32>()?[..] else {
        anyhow::bail!(
            "greedy_pick: expected one row of logits, got {:?}",
            logits.dims()
        );
    };
    if non_finite != 0 {
        return Err(non_finite_logits(model, seen, chunk));
    }
    Ok(token)
}

/// Random prompt ids stay below the first special token (so that the prompt is ordinary text,
/// as in a real prompt) and below the model's vocab_size.
pub(crate) fn token_bound(tokenizer: &Tokenizer, vocab_size: usize) -> u32 {
    let vocab = u32::try_from(vocab_size).unwrap_or(u32::MAX);
    let first_special = tokenizer
        .get_added_tokens_decoder()
        .iter()
        .filter(|(_, t)| t.special)
        .map(|(&id, _)| id)
        .min();
    match first_special {
        Some(id) if id > 0 && id < vocab => id,
        _ => vocab,
    }
}

/// The dtype the GDN states of a fresh cache are stored in (f32 for a model without GDN).
pub(crate) fn gdn_state_dtype(model: &Model) -> StateDtype {
    model
        .new_cache()
        .layers
        .iter()
        .find_map(|l| match l {
            LayerCache::Gdn(c) => Some(c.state_dtype),
            LayerCache::Attention(_) => None,
        })
        .unwrap_or_default()
}

#[derive(serde::Serialize)]
pub(crate) struct Stats {
    pub(crate) median: f64,
    pub(crate) stddev: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) samples: Vec<f64>,
}

impl Stats {
    pub(crate) fn new(samples: Vec<f64>) -> Self {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let stddev = if n > 1 {
            (sorted.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Stats {
            median,
            stddev,
            min: sorted[0],
            max: sorted[n - 1],
            samples,
        }
    }
}

/// Bytes of the checkpoint's weight files (symlinks followed, as in the HF cache).
pub(crate) fn checkpoint_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            total += std::fs::metadata(&path)
                .with_context(|| format!("cannot stat {}", path.display()))?
                .len();
        }
    }
    Ok(total)
}

/// The folder or repo name, without the parent path or the org.
pub(crate) fn display_name(model: &str) -> String {
    let trimmed = model.trim_end_matches('/');
    Path::new(trimmed)
        .file_name()
        .map_or(trimmed.to_string(), |n| n.to_string_lossy().into_owned())
}

pub(crate) fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// A Markdown table with padded columns; `right(i)`: column i holds numbers, right-aligned.
pub(crate) fn markdown_table(
    header: &[&str],
    body: &[Vec<String>],
    right: impl Fn(usize) -> bool,
) -> String {
    let width = |i: usize| {
        body.iter()
            .map(|r| r[i].chars().count())
            .chain([header[i].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    let cell = |i: usize, text: &str| {
        let pad = widths[i] - text.chars().count();
        if right(i) {
            format!(" {}{text} ", " ".repeat(pad))
        } else {
            format!(" {text}{} ", " ".repeat(pad))
        }
    };
    let line = |cells: Vec<String>| format!("|{}|\n", cells.join("|"));
    let mut text = line((0..header.len()).map(|i| cell(i, header[i])).collect());
    text += &line(
        widths
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                if right(i) {
                    format!(" {}: ", "-".repeat(w - 1))
                } else {
                    format!(" {} ", "-".repeat(w))
                }
            })
            .collect(),
    );
    for row in body {
        text += &line((0..row.len()).map(|i| cell(i, &row[i])).collect());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_median_spread() {
        let s = Stats::new(vec![3.0, 1.0, 2.0, 10.0]);
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 10.0));
        assert_eq!(s.samples, [3.0, 1.0, 2.0, 10.0]);
        let mean = 4.0f64;
        let want = (([3.0f64, 1.0, 2.0, 10.0]
            .iter()
            .map(|x| (x - mean).powi(2))
            .sum::<f64>())
            / 3.0)
            .sqrt();
        assert!((s.stddev - want).abs() < 1e-12);
        let one = Stats::new(vec![5.0]);
        assert_eq!(
            (one.median, one.stddev, one.min, one.max),
            (5.0, 0.0, 5.0, 5.0)
        );
    }

    #[test]
    fn names_and_sizes() {
        assert_eq!(
            display_name("models/qwen3.5-moe-tiny-4bit/"),
            "qwen3.5-moe-tiny-4bit"
        );
        assert_eq!(
            display_name("mlx-community/Qwen3-Next-80B-A3B-Instruct-4bit"),
            "Qwen3-Next-80B-A3B-Instruct-4bit"
        );
        assert_eq!(human_size(512), "512.00 B");
        assert_eq!(human_size(3 << 29), "1.50 GiB");
    }
}
