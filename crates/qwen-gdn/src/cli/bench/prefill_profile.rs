//! `bench --profile`: one extra prefill of the benchmark's prompt with every phase of every
//! layer timed (a `qwen_gdn_model::phase_profile::PhaseTimer` tap), to tell what bounds
//! prefill on a device.

use anyhow::Result;
use qwen_gdn_model::phase_profile::{self, PhaseTimer, ReportRow};
use qwen_gdn_model::Model;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub(crate) struct PrefillProfile {
    tokens: usize,
    /// The profiled prefill's own time (slower than an unprofiled one: see the module).
    wall: Duration,
    rows: Vec<ReportRow>,
}

/// Prefills `prompt` as a bench repetition does (chunks, the last one through the output
/// head) from an empty cache, with the phases timed.
pub(crate) fn profile_prefill(
    model: &Model,
    prompt: &[u32],
    chunk: usize,
) -> Result<PrefillProfile> {
    let mut cache = model.new_cache();
    let mut timer = PhaseTimer::start(model.device());
    let start = Instant::now();
    let chunks: Vec<&[u32]> = prompt.chunks(chunk).collect();
    if let Some((last, head)) = chunks.split_last() {
        for part in head {
            model.prefill_tapped(part, &mut cache, chunk, &mut timer)?;
        }
        model.forward_last_tapped(last, &mut cache, &mut timer)?;
    }
    model.device().synchronize()?;
    let wall = start.elapsed();
    Ok(PrefillProfile {
        tokens: prompt.len(),
        wall,
        rows: phase_profile::report(&timer.finish()),
    })
}

impl PrefillProfile {
    /// Time in the top-level phases; the rest of the wall time is the work between them
    /// (residual adds, chunk bookkeeping) and the host.
    fn top_level(&self) -> Duration {
        self.rows
            .iter()
            .filter(|r| r.depth == 0)
            .map(|r| r.total)
            .sum()
    }

    pub(crate) fn table(&self) -> String {
        let wall = self.wall.as_secs_f64();
        let mut out = format!(
            "prefill profile: {} tokens in {:.1} ms profiled ({:.1} t/s; the device drained around \
             every phase, so slower than the timed runs)\n",
            self.tokens,
            wall * 1e3,
            self.tokens as f64 / wall
        );
        out += &format!(
            "{:<28} {:>10} {:>7} {:>7} {:>10}\n",
            "phase", "ms", "% wall", "calls", "µs/call"
        );
        let mut line = |name: &str, total: Duration, calls: u64| {
            let ms = total.as_secs_f64() * 1e3;
            let per_call = if calls > 0 {
                format!("{:.1}", ms * 1e3 / calls as f64)
            } else {
                String::new()
            };
            out += &format!(
                "{:<28} {:>10.2} {:>7.1} {:>7} {:>10}\n",
                name,
                ms,
                100.0 * total.as_secs_f64() / wall,
                if calls > 0 {
                    calls.to_string()
                } else {
                    String::new()
                },
                per_call
            );
        };
        for r in &self.rows {
            let leaf = r.name.rsplit('/').next().unwrap_or(&r.name);
            line(&format!("{}{leaf}", "  ".repeat(r.depth)), r.total, r.calls);
        }
        line(
            "outside phases",
            self.wall.saturating_sub(self.top_level()),
            0,
        );
        out
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "tokens": self.tokens,
            "wall_seconds": self.wall.as_secs_f64(),
            "phases": self.rows.iter().map(|r| json!({
                "phase": r.name,
                "seconds": r.total.as_secs_f64(),
                "calls": r.calls,
            })).collect::<Vec<_>>(),
        })
    }
}
