//! The prompt-cache flags of the commands that serve several prompts with one model (`chat`).

use candle_core::Device;
use qwen_gdn_model::PromptCache;

/// The budget when the device does not say how much memory it has (the CPU), and the most
/// the default takes on a GPU: a Qwen3-Next-80B snapshot at a few thousand tokens is about
/// 0.1 GB, so this keeps some twenty of them.
const DEFAULT_BUDGET: u64 = 2 << 30;
/// On a GPU the default is at most this share of its working set, which also holds the
/// weights and the live cache.
const GPU_SHARE: u64 = 16;

#[derive(clap::Args, Debug, Clone)]
pub struct PromptCacheArgs {
    /// Memory the prompt cache may hold, in bytes or with a unit (512M, 4G); 0 turns it off
    /// [default: 2G, or 1/16 of the GPU's working set when that is less]
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub prompt_cache_bytes: Option<u64>,
    /// Also snapshot every N tokens of a long prompt, so that a later prompt sharing only part
    /// of it resumes near where they part
    #[arg(long, value_name = "N", value_parser = crate::load::positive_usize)]
    pub snapshot_every: Option<usize>,
}

impl PromptCacheArgs {
    pub fn new_cache(&self, device: &Device) -> PromptCache {
        let budget = self.prompt_cache_bytes.unwrap_or_else(|| {
            qwen_gdn_model::device_memory::working_set_bytes(device)
                .map_or(DEFAULT_BUDGET, |set| (set / GPU_SHARE).min(DEFAULT_BUDGET))
        });
        PromptCache::new(budget)
    }
}

/// `123`, `512K`, `512M`, `4G` (binary units; a trailing `B`/`iB` is allowed).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        Some((i, 'T' | 't')) => (&t[..i], 40),
        _ => (t, 0),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| "expected a number of bytes, e.g. 0, 512M or 4G".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("1234"), Ok(1234));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("4G"), Ok(4 << 30));
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("2kB"), Ok(2048));
        for bad in ["", "G", "-1", "1.5G", "lots", "99999999999T"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
