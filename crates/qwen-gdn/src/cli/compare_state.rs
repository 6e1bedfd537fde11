//! `eval --compare-state-dtype bf16`: the quality gate for storing the GDN recurrent state in
//! bf16. The text runs twice in lock step, in decode mode (one token per forward call, so the
//! state is stored, and rounded, after every token; a single prefill would round it once and
//! hide the effect): once with the fp32 state and once with the bf16 state. Per position it
//! measures KL(p_f32 ‖ p_bf16) and whether the top-1 tokens agree.

use anyhow::Result;
use candle_core::DType;
use qwen_gdn_model::{Model, StateDtype};

/// The gate used to validate the bf16 state on Qwen3-Next-80B.
pub const MAX_MEAN_KL: f64 = 0.01;
pub const MIN_TOP1_MATCH: f64 = 0.95;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Comparison {
    pub state_dtype: &'static str,
    pub kl_mean: f64,
    pub kl_max: f64,
    pub top1_match: f64,
    pub n: usize,
    pub pass: bool,
}

/// Log-softmax of one row of logits, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let lse = row
        .iter()
        .map(|&x| (x as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    row.iter().map(|&x| x as f64 - lse).collect()
}

fn argmax(row: &[f64]) -> usize {
    row.iter()
        .enumerate()
        .fold(0, |best, (i, &x)| if x > row[best] { i } else { best })
}

/// KL(p ‖ q) for log-probabilities `p`, `q`.
pub fn kl(p: &[f64], q: &[f64]) -> f64 {
    p.iter().zip(q).map(|(&a, &b)| a.exp() * (a - b)).sum()
}

pub fn compare(model: &Model, tokens: &[u32], other: StateDtype) -> Result<Comparison> {
    let mut reference = model.new_cache_with(StateDtype::F32);
    let mut candidate = model.new_cache_with(other);
    let (mut kl_sum, mut kl_max, mut agree) = (0f64, 0f64, 0usize);
    for &t in tokens {
        let row = |cache: &mut qwen_gdn_model::Cache| -> Result<Vec<f64>> {
            let logits = model
                .forward_last(&[t], cache)?
                .to_dtype(DType::F32)?
                .squeeze(0)?;
            Ok(log_softmax(&logits.to_vec1::<f32>()?))
        };
        let (p, q) = (row(&mut reference)?, row(&mut candidate)?);
        let d = kl(&p, &q);
        kl_sum += d;
        kl_max = kl_max.max(d);
        agree += (argmax(&p) == argmax(&q)) as usize;
    }
    let n = tokens.len();
    let (kl_mean, top1_match) = (kl_sum / n as f64, agree as f64 / n as f64);
    Ok(Comparison {
        state_dtype: match other {
            StateDtype::F32 => "f32",
            StateDtype::Bf16 => "bf16",
        },
        kl_mean,
        kl_max,
        top1_match,
        n,
        pass: kl_mean <= MAX_MEAN_KL && top1_match >= MIN_TOP1_MATCH,
    })
}

impl Comparison {
    pub fn summary(&self) -> String {
        format!(
            "GDN state {} vs f32 (decode mode, {} positions): KL mean {:.3e}, KL max {:.3e}, top-1 match {:.1}% -> {} (gate: KL mean <= {MAX_MEAN_KL}, top-1 >= {:.0}%)",
            self.state_dtype,
            self.n,
            self.kl_mean,
            self.kl_max,
            100.0 * self.top1_match,
            if self.pass { "PASS" } else { "FAIL" },
            100.0 * MIN_TOP1_MATCH
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_of_known_distributions() {
        let p = log_softmax(&[0.0, 0.0]);
        let q = log_softmax(&[(3f32).ln(), 0.0]); // q = (0.75, 0.25)
        let want = 0.5 * (0.5f64 / 0.75).ln() + 0.5 * (0.5f64 / 0.25).ln();
        // ln(3) as f32 carries ~1e-8 relative error into q.
        assert!((kl(&p, &q) - want).abs() < 1e-7);
        assert_eq!(kl(&p, &p), 0.0);
        assert_eq!(argmax(&q), 0);
    }
}
