//! The prompt-cache flags shared by `chat` and `serve` (and `generate`'s cache file).

use candle_core::Device;
use qwen_gdn_model::PromptCache;

#[derive(clap::Args, Debug, Clone)]
pub struct PromptCacheArgs {
    /// Also snapshot the prompt cache every N tokens of a long prefill, so that a later prompt
    /// that diverges mid-message still reuses most of it [default: only at message boundaries
    /// and at the end of each prompt]
    #[arg(long, value_name = "N", value_parser = crate::load::positive_usize)]
    pub prompt_cache_every: Option<usize>,
    /// Memory the prompt cache may hold, e.g. 8G, 512M or a number of bytes (K, M, G, T are
    /// powers of 1024); 0 turns it off [default: a quarter of the memory free after loading
    /// the model]
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub prompt_cache_bytes: Option<u64>,
}

/// The budget when neither the flag nor the device says: 2 GiB.
const FALLBACK_BUDGET: u64 = 2 << 30;

impl PromptCacheArgs {
    /// An empty prompt cache with the budget asked for, else a quarter of the memory free on
    /// `device` (call after loading the model).
    pub fn prompt_cache(&self, device: &Device) -> PromptCache {
        PromptCache::new(self.budget(device))
    }

    pub fn budget(&self, device: &Device) -> u64 {
        self.prompt_cache_bytes
            .unwrap_or_else(|| free_memory(device).map_or(FALLBACK_BUDGET, |b| b / 4))
    }
}

/// The memory free for caches on `device` (after loading the model): the device's own free
/// memory where it can be asked, else the host's (shared with a CPU "device").
pub fn free_memory(device: &Device) -> Option<u64> {
    qwen_gdn_model::device_memory::free_bytes(device).or_else(host_available)
}

/// MemAvailable of /proc/meminfo (Linux); `None` elsewhere.
fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `8G`, `1.5GiB`, `512M`, `4096`: a size in bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("expected a size such as 8G or 512M, not `{s}`"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit `{other}` (use K, M, G or T)")),
    };
    let bytes = number * scale as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("`{s}` is too large"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("8g"), Ok(8 << 30));
        assert!(parse_bytes("-1G").is_err());
        assert!(parse_bytes("G").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
        assert!(parse_bytes("1e400").is_err());
    }
}
