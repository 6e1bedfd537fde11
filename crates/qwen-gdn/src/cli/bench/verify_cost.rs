//! `bench --verify-cost K`: what speculative decoding's verify pass costs on this device, and
//! what that makes of speculation at a given acceptance (issue 28's numbers).
//!
//! Random weights make acceptance meaningless, so the speedup itself cannot be measured on a
//! full-size random checkpoint. What can be measured is the price side: the verify pass of
//! k + 1 tokens (the forward pass inside a verify window, which records every GDN layer's
//! state after each token, then the output head over the k + 1 rows and their read-back, then
//! the window closed on one kept token: exactly `Speculation::step`'s work minus drafting),
//! t(k+1), for k = 0..=K, at depth -p. The ratio t(k+1)/t(1) is the figure (goal:
//! ≤ 1.3 for k ≤ 3). Each pass keeps one token, so the depth grows by one per pass, as in
//! decoding.
//!
//! The projection: at per-draft acceptance a, a step of k drafts yields
//! (1 − a^(k+1)) / (1 − a) tokens and costs t(k+1) plus k draft calls. A draft call of an MTP
//! head is one decoder layer plus the output head; it is estimated from this run as the
//! output head's measured time plus one layer's share of the tg step (its time less the
//! output head, over the layer count): an estimate, said so in the table.

use anyhow::{Context, Result};
use qwen_gdn_model::speculative::Window;
use qwen_gdn_model::Model;
use serde_json::json;
use std::time::Instant;

use super::common::{greedy, Stats};

/// The acceptances the projection is printed for.
const ACCEPTANCES: [f64; 4] = [0.6, 0.7, 0.8, 0.9];
/// Untimed passes before each k's timed ones (graphs, allocator, caches).
const WARM_UP_PASSES: usize = 2;

/// One run's measurements, in seconds.
pub(crate) struct VerifyCost {
    /// Per k = 0..=K: the verify pass of k + 1 tokens.
    passes: Vec<Stats>,
    /// Per k: the kernel launches and host read-backs of one pass (`gdn_ops::launches`).
    launches: Vec<(usize, usize)>,
    /// Whether the passes ran the fused verify (`Model::fused_verify`; else the composed
    /// prefill path).
    fused: bool,
    /// The output head over one row, with its read-back.
    head: Stats,
    /// The plain decode step (1 / the tg median).
    tg_step: f64,
    layers: usize,
}

impl VerifyCost {
    /// Measures k = 0..=`max_k` after `prompt`, `repetitions` timed passes each; `tg_tps` is
    /// the same build's plain decode speed (the tg median).
    pub(crate) fn run(
        model: &Model,
        prompt: &[u32],
        chunk: usize,
        (max_k, repetitions): (usize, usize),
        tg_tps: f64,
    ) -> Result<Self> {
        let mut cache = model.new_cache();
        for part in prompt.chunks(chunk) {
            model.prefill(part, &mut cache, chunk)?;
        }
        // The window's tokens: any in-vocabulary ids do (only their cost is measured).
        let tokens: Vec<u32> = prompt.iter().rev().take(max_k + 1).copied().collect();
        anyhow::ensure!(
            tokens.len() == max_k + 1,
            "--verify-cost {max_k} needs a prompt of at least {} tokens (-p)",
            max_k + 1
        );
        let mut passes = Vec::with_capacity(max_k + 1);
        let mut launches = Vec::with_capacity(max_k + 1);
        for k in 0..=max_k {
            // One counted pass first (untimed, as the warm-up ones).
            let read_backs = gdn_ops::launches::read_backs();
            gdn_ops::launches::take();
            verify_pass(model, &mut cache, &tokens[..k + 1])
                .with_context(|| format!("verify pass of {} tokens", k + 1))?;
            launches.push((
                gdn_ops::launches::take(),
                gdn_ops::launches::read_backs() - read_backs,
            ));
            let mut samples = Vec::with_capacity(repetitions);
            for i in 0..WARM_UP_PASSES + repetitions {
                let start = Instant::now();
                verify_pass(model, &mut cache, &tokens[..k + 1])
                    .with_context(|| format!("verify pass of {} tokens", k + 1))?;
                if i >= WARM_UP_PASSES {
                    samples.push(start.elapsed().as_secs_f64());
                }
            }
            passes.push(Stats::new(samples));
        }
        let normed = model.forward_normed(&tokens[..1], &mut cache)?;
        let mut head = Vec::with_capacity(repetitions);
        for i in 0..WARM_UP_PASSES + repetitions {
            let start = Instant::now();
            greedy(model, &model.head_logits(&normed)?, prompt, chunk)?;
            if i >= WARM_UP_PASSES {
                head.push(start.elapsed().as_secs_f64());
            }
        }
        Ok(Self {
            passes,
            launches,
            fused: model.fused_verify(),
            head: Stats::new(head),
            tg_step: 1.0 / tg_tps.max(1e-9),
            layers: model.num_layers(),
        })
    }

    /// t(k+1) / t(1).
    fn ratio(&self, k: usize) -> f64 {
        self.passes[k].median / self.passes[0].median.max(1e-12)
    }

    /// The estimated draft call: the output head plus one layer's share of the tg step.
    fn draft_call(&self) -> f64 {
        self.head.median + (self.tg_step - self.head.median).max(0.0) / self.layers.max(1) as f64
    }

    /// Projected tokens per second at acceptance `a` with `k` drafts a step.
    fn projected_tps(&self, a: f64, k: usize) -> f64 {
        let tokens = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
        tokens / (self.passes[k].median + k as f64 * self.draft_call())
    }

    /// The table printed under bench's own.
    pub(crate) fn table(&self) -> String {
        let mut s = String::from(
            "\n| verify pass | ms (median) | t(k+1)/t(1) | / tg step | launches | read-backs |\n\
             |---|---|---|---|---|---|\n",
        );
        for (k, pass) in self.passes.iter().enumerate() {
            let (launches, read_backs) = self.launches[k];
            s += &format!(
                "| k={k} ({} tokens) | {:.3} | {:.2} | {:.2} | {launches} | {read_backs} |\n",
                k + 1,
                pass.median * 1e3,
                self.ratio(k),
                pass.median / self.tg_step
            );
        }
        s += &format!(
            "(the {} verify pass; QWEN_GDN_VERIFY={} runs the other; the read-backs include \
             the logits')\n",
            if self.fused { "fused" } else { "composed" },
            if self.fused { "composed" } else { "fused" },
        );
        s += &format!(
            "\ntg step {:.3} ms; output head (one row, read back) {:.3} ms; draft call estimated \
             {:.3} ms (output head + 1/{} of the tg step: no MTP head timed)\n\n\
             | projected tok/s (speedup over tg) |{}\n|---|{}\n",
            self.tg_step * 1e3,
            self.head.median * 1e3,
            self.draft_call() * 1e3,
            self.layers,
            ACCEPTANCES.map(|a| format!(" a={a} |")).concat(),
            "---|".repeat(ACCEPTANCES.len()),
        );
        for k in 1..self.passes.len() {
            s += &format!("| k={k} |");
            for a in ACCEPTANCES {
                let tps = self.projected_tps(a, k);
                s += &format!(" {tps:.1} ({:.2}×) |", tps * self.tg_step);
            }
            s.push('\n');
        }
        s
    }

    /// `--json`'s `verify_cost` object.
    pub(crate) fn json(&self) -> serde_json::Value {
        json!({
            "pass_seconds": self.passes.iter().map(|p| json!(p)).collect::<Vec<_>>(),
            "pass_launches": self.launches.iter().map(|l| l.0).collect::<Vec<_>>(),
            "pass_read_backs": self.launches.iter().map(|l| l.1).collect::<Vec<_>>(),
            "fused": self.fused,
            "ratio_to_one_token": (0..self.passes.len()).map(|k| self.ratio(k)).collect::<Vec<_>>(),
            "tg_step_seconds": self.tg_step,
            "output_head_seconds": self.head,
            "draft_call_estimate_seconds": self.draft_call(),
            "projected_tps": (1..self.passes.len()).map(|k| json!({
                "k": k,
                "by_acceptance": ACCEPTANCES.iter().map(|&a| json!({
                    "acceptance": a, "tps": self.projected_tps(a, k),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}

/// `Speculation::step`'s verify work for `tokens` (the step's token and its drafts): the
/// recorded forward pass, the head over every row, their read-back, and the window closed on
/// the first token.
fn verify_pass(
    model: &Model,
    cache: &mut qwen_gdn_model::cache::Cache,
    tokens: &[u32],
) -> Result<()> {
    verify_pass_by(model, cache, tokens, Model::verify)
}

/// [`verify_pass`] with the forward pass run by `verify` (e.g. [`Model::verify_eager`], never
/// a graph's replay: `bench --profile-verify`).
pub(crate) fn verify_pass_by(
    model: &Model,
    cache: &mut qwen_gdn_model::cache::Cache,
    tokens: &[u32],
    verify: impl Fn(
        &Model,
        &[u32],
        &mut qwen_gdn_model::cache::Cache,
    ) -> Result<(candle_core::Tensor, candle_core::Tensor)>,
) -> Result<()> {
    let window = Window::open(cache)?;
    let logits = match verify(model, tokens, cache) {
        Ok((l, _)) => l,
        Err(e) => {
            Window::abandon(cache);
            return Err(e);
        }
    };
    let rows = gdn_ops::launches::read_back(logits.to_vec2::<f32>())?;
    anyhow::ensure!(
        rows.iter().flatten().all(|x| x.is_finite()),
        "the verify pass's logits are not finite"
    );
    window.close(cache, 1)
}
