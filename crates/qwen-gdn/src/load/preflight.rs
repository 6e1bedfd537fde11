//! Whether a model fits the GPU before its weights are loaded. On Apple Silicon the GPU may
//! wire at most `iogpu.wired_limit_mb` of the unified memory (by default about 75% of RAM,
//! reported as Metal's recommended working-set size); a model past it pages or is killed
//! mid-generation instead of failing at once.

use anyhow::{bail, Result};
use candle_core::{DType, Device};
use qwen_gdn_model::footprint::DecodeFootprint;
use qwen_gdn_model::{Config, StateDtype};
use std::path::Path;

/// Above this share of the working set the run goes ahead with a warning: prefill
/// temporaries (a dequantized matrix, a chunk's activations) come on top of weights and caches.
const WARN_FRACTION: f64 = 0.9;

/// Device bytes the model holds for a whole run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub weights: u64,
    /// GDN recurrent and conv states plus the KV cache at the run's longest context.
    pub caches: u64,
}

impl Need {
    /// From config.json: every weight byte of the checkpoint, the GDN states in `state`, and
    /// the KV cache for `context` positions in `kv_dtype`.
    pub fn of(cfg: &Config, context: usize, state: StateDtype, kv_dtype: DType) -> Self {
        let f = DecodeFootprint::of(cfg, context, state);
        // The footprint counts the GDN states twice (read and written) and a bf16 KV cache.
        let kv = f.kv_cache as u64 * kv_dtype.size_in_bytes() as u64 / 2;
        Self {
            weights: f.all_weights as u64,
            caches: f.gdn_state as u64 / 2 + kv,
        }
    }

    pub fn total(&self) -> u64 {
        self.weights + self.caches
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Fits,
    /// Runs, with this warning.
    Close(String),
    /// Refused, with this error.
    TooLarge(String),
}

/// Judges `need` against a working set of `limit` bytes; `context` names the positions the
/// caches were sized for.
pub fn judge(need: Need, limit: u64, context: usize) -> Verdict {
    let gb = |b: u64| b as f64 / 1e9;
    let what = format!(
        "the model needs about {:.1} GB of GPU memory (weights {:.1} GB + caches {:.1} GB at {context} positions)",
        gb(need.total()),
        gb(need.weights),
        gb(need.caches)
    );
    // A limit with a fifth of headroom over the need, in MB as sysctl takes it.
    let suggested_mb = (need.total() as f64 * 1.2 / (1 << 20) as f64).ceil() as u64;
    if need.total() > limit {
        Verdict::TooLarge(format!(
            "{what}, more than the {:.1} GB macOS lets the GPU use; raise the limit with \
             `sudo sysctl iogpu.wired_limit_mb={suggested_mb}` (if the Mac has that much memory), \
             or use a smaller model or context",
            gb(limit)
        ))
    } else if need.total() as f64 > WARN_FRACTION * limit as f64 {
        Verdict::Close(format!(
            "{what}, close to the {:.1} GB macOS lets the GPU use; if it runs out, raise the \
             limit with `sudo sysctl iogpu.wired_limit_mb={suggested_mb}`",
            gb(limit)
        ))
    } else {
        Verdict::Fits
    }
}

/// Refuses (or warns about) a model in `dir` that would not fit `device` for `context`
/// positions. Only Metal reports a working set; elsewhere this checks nothing.
pub fn check(
    device: &Device,
    dir: &Path,
    context: usize,
    state: StateDtype,
    dtype: DType,
) -> Result<()> {
    if qwen_gdn_model::device_memory::working_set_bytes(device).is_none() {
        return Ok(());
    }
    check_config(device, &Config::from_dir(dir)?, context, state, dtype)
}

/// [`check`] for a model described by `cfg` alone (random weights).
pub fn check_config(
    device: &Device,
    cfg: &Config,
    context: usize,
    state: StateDtype,
    dtype: DType,
) -> Result<()> {
    let Some(limit) = qwen_gdn_model::device_memory::working_set_bytes(device) else {
        return Ok(());
    };
    let context = context.min(cfg.max_position_embeddings);
    match judge(Need::of(cfg, context, state, dtype), limit, context) {
        Verdict::Fits => Ok(()),
        Verdict::Close(warning) => {
            eprintln!("warning: {warning}");
            Ok(())
        }
        Verdict::TooLarge(error) => bail!("{error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    #[test]
    fn refuses_past_the_working_set_and_names_the_sysctl() {
        let need = Need {
            weights: 44_840_000_000,
            caches: 2_000_000_000,
        };
        // A 48 GB Mac's default, about 75% of RAM: refused.
        let Verdict::TooLarge(msg) = judge(need, 36 * GB, 4096) else {
            panic!("46.8 GB must not fit 36 GB")
        };
        assert!(msg.contains("about 46.8 GB"), "{msg}");
        assert!(
            msg.contains("weights 44.8 GB + caches 2.0 GB at 4096 positions"),
            "{msg}"
        );
        assert!(msg.contains("the 36.0 GB macOS lets the GPU use"), "{msg}");
        assert!(
            msg.contains("`sudo sysctl iogpu.wired_limit_mb=53605`"),
            "{msg}"
        );
        // A 64 GB Mac's default: runs, with a warning.
        let Verdict::Close(msg) = judge(need, 48 * GB, 4096) else {
            panic!("46.8 GB in 48 GB must warn")
        };
        assert!(msg.contains("iogpu.wired_limit_mb"), "{msg}");
    }

    #[test]
    fn warns_within_ten_percent_and_passes_below() {
        let need = Need {
            weights: 9 * GB,
            caches: GB / 2,
        };
        assert!(matches!(judge(need, 10 * GB, 1), Verdict::Close(_)));
        assert_eq!(judge(need, 11 * GB, 1), Verdict::Fits);
        assert!(matches!(judge(need, 9 * GB, 1), Verdict::TooLarge(_)));
    }

    #[test]
    fn caches_follow_the_context_and_kv_dtype() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/configs/qwen3-next-80b-a3b-instruct-4bit.json");
        let tmp = tempfile::tempdir().unwrap();
        std::fs::copy(&dir, tmp.path().join("config.json")).unwrap();
        let cfg = Config::from_dir(tmp.path()).unwrap();
        let short = Need::of(&cfg, 0, StateDtype::F32, DType::BF16);
        let long = Need::of(&cfg, 4096, StateDtype::F32, DType::BF16);
        let long_f32 = Need::of(&cfg, 4096, StateDtype::F32, DType::F32);
        assert_eq!(short.weights, long.weights);
        // 12 attention layers × K and V × 2 KV heads × 256 dims × 2 bytes per position.
        let per_position = 12 * 2 * 2 * 256 * 2;
        assert_eq!(long.caches - short.caches, 4096 * per_position);
        assert_eq!(
            long_f32.caches - short.caches,
            4096 * per_position + 4097 * per_position
        );
        // 36 GDN layers: 32 value heads × 128 × 128 f32 states, plus 3 conv rows in bf16.
        let states = 36 * (32 * 128 * 128 * 4 + 3 * 8192 * 2);
        assert_eq!(short.caches, states + per_position);
    }
}
