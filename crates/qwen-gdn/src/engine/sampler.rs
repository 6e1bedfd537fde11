//! Token sampling with mlx-lm's semantics (`sample_utils.make_sampler` + its repetition,
//! presence and frequency logits processors, applied in that order): temp 0 is argmax;
//! otherwise top-p, min-p and top-k filter the log-probabilities, in that order, and a token is
//! drawn from softmax(logprobs / temp).

use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Debug, Clone)]
pub struct SamplerConfig {
    pub temp: f32,
    /// Nucleus sampling; 1 disables it.
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one; 0 disables it.
    pub min_p: f32,
    /// Keep the k most likely tokens; 0 disables it.
    pub top_k: usize,
    /// Sign-aware penalty on recently seen tokens; `None` disables it.
    pub repetition_penalty: Option<f32>,
    /// Subtracted once from the logit of every token seen (OpenAI's `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was seen (`frequency_penalty`).
    pub frequency_penalty: f32,
    /// How many recent tokens the three penalties look back over.
    pub repetition_context_size: usize,
}

impl SamplerConfig {
    /// Argmax: temp 0 and every filter and penalty off (mlx-lm's `make_sampler(temp=0)`;
    /// the look-back of 20 is its default and unused here).
    pub fn greedy() -> Self {
        Self {
            temp: 0.0,
            top_p: 1.0,
            min_p: 0.0,
            top_k: 0,
            repetition_penalty: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_context_size: 20,
        }
    }
}

pub struct Sampler {
    cfg: SamplerConfig,
    rng: StdRng,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig, seed: Option<u64>) -> Self {
        let rng = seed.map_or_else(StdRng::from_os_rng, StdRng::seed_from_u64);
        Self { cfg, rng }
    }

    /// Picks the next token from one row of logits. `history` holds the tokens the repetition
    /// penalty looks back over.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        match self.weights(logits, history) {
            Weights::Argmax(token) => token,
            Weights::Draw(w) => self.draw(&w),
        }
    }

    /// What [`Sampler::sample`] draws from: the argmax at temp 0, else unnormalised weights
    /// `exp((logprob − max) / temp)` over the vocabulary after the penalties and filters
    /// (speculative sampling compares the target's and the draft's, `speculative_sampling.rs`).
    pub fn weights(&self, logits: &mut [f32], history: &[u32]) -> Weights {
        let recent = &history[history
            .len()
            .saturating_sub(self.cfg.repetition_context_size)..];
        if let Some(penalty) = self.cfg.repetition_penalty {
            apply_repetition_penalty(logits, recent, penalty);
        }
        apply_additive_penalties(
            logits,
            recent,
            self.cfg.presence_penalty,
            self.cfg.frequency_penalty,
        );
        // logprobs = logits - logsumexp(logits)
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = max + logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln();
        logits.iter_mut().for_each(|l| *l -= lse);
        let logprobs = logits;
        if self.cfg.temp == 0.0 {
            return Weights::Argmax(argmax(logprobs));
        }
        if 0.0 < self.cfg.top_p && self.cfg.top_p < 1.0 {
            apply_top_p(logprobs, self.cfg.top_p);
        }
        if self.cfg.min_p != 0.0 {
            apply_min_p(logprobs, self.cfg.min_p);
        }
        if self.cfg.top_k > 0 {
            apply_top_k(logprobs, self.cfg.top_k);
        }
        Weights::Draw(categorical_weights(logprobs, self.cfg.temp))
    }

    /// A draw from unnormalised `weights`.
    pub fn draw(&mut self, weights: &[f64]) -> u32 {
        categorical(weights, &mut self.rng)
    }

    /// A uniform number in [0, 1) from the sampler's generator.
    pub fn uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }
}

/// See [`Sampler::weights`].
#[derive(Debug, Clone, PartialEq)]
pub enum Weights {
    Argmax(u32),
    Draw(Vec<f64>),
}

/// The first index of the largest value, as mx.argmax (the speculative verifier's own pick).
pub use qwen_gdn_model::speculative::argmax;

/// Each distinct token seen is penalised once: negative logits are multiplied by the penalty,
/// positive ones divided, so a penalty > 1 always makes the token less likely.
fn apply_repetition_penalty(logits: &mut [f32], recent: &[u32], penalty: f32) {
    let mut seen = recent.to_vec();
    seen.sort_unstable();
    seen.dedup();
    for &t in &seen {
        if let Some(l) = logits.get_mut(t as usize) {
            *l = if *l < 0.0 { *l * penalty } else { *l / penalty };
        }
    }
}

/// OpenAI's additive penalties over `recent`: `presence` once per distinct token, `frequency`
/// once per occurrence. Negative values encourage repeats, as OpenAI allows.
fn apply_additive_penalties(logits: &mut [f32], recent: &[u32], presence: f32, frequency: f32) {
    if presence == 0.0 && frequency == 0.0 {
        return;
    }
    let mut seen = recent.to_vec();
    seen.sort_unstable();
    for run in seen.chunk_by(|a, b| a == b) {
        if let Some(l) = logits.get_mut(run[0] as usize) {
            *l -= presence + frequency * run.len() as f32;
        }
    }
}

/// Keeps the tokens whose cumulative probability, summed in ascending order, exceeds 1 - top_p:
/// the smallest set of most likely tokens holding top_p of the mass.
fn apply_top_p(logprobs: &mut [f32], top_p: f32) {
    let mut ascending: Vec<usize> = (0..logprobs.len()).collect();
    ascending.sort_by(|&a, &b| logprobs[a].total_cmp(&logprobs[b]));
    let mut cumulative = 0.0;
    for i in ascending {
        cumulative += logprobs[i].exp();
        if cumulative <= 1.0 - top_p {
            logprobs[i] = f32::NEG_INFINITY;
        }
    }
}

/// Drops tokens whose log-probability is below max + ln(min_p); the most likely token stays.
fn apply_min_p(logprobs: &mut [f32], min_p: f32) {
    let top = argmax(logprobs) as usize;
    let threshold = logprobs[top] + min_p.ln();
    for (i, l) in logprobs.iter_mut().enumerate() {
        if i != top && *l < threshold {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Keeps the k largest log-probabilities (a partition, not a sort: vocabularies are 250k wide).
fn apply_top_k(logprobs: &mut [f32], k: usize) {
    let n = logprobs.len();
    if k >= n {
        return;
    }
    let mut idx: Vec<usize> = (0..n).collect();
    idx.select_nth_unstable_by(n - k, |&a, &b| logprobs[a].total_cmp(&logprobs[b]));
    for &i in &idx[..n - k] {
        logprobs[i] = f32::NEG_INFINITY;
    }
}

/// The weights of softmax(logprobs / temp), unnormalised.
fn categorical_weights(logprobs: &[f32], temp: f32) -> Vec<f64> {
    let max = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    logprobs
        .iter()
        .map(|&l| (((l - max) / temp) as f64).exp())
        .collect()
}

/// Draws from unnormalised weights.
fn categorical(weights: &[f64], rng: &mut StdRng) -> u32 {
    let mut u = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (i, &w) in weights.iter().enumerate() {
        if u < w {
            return i as u32;
        }
        u -= w;
    }
    // Rounding can leave u just above the last weight; the last possible token is the answer.
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every filter and penalty off, at `temp`.
    fn cfg(temp: f32) -> SamplerConfig {
        SamplerConfig {
            temp,
            ..SamplerConfig::greedy()
        }
    }

    fn logprobs(logits: &[f32]) -> Vec<f32> {
        let lse = logits.iter().map(|l| l.exp()).sum::<f32>().ln();
        logits.iter().map(|l| l - lse).collect()
    }

    fn kept(lp: &[f32]) -> Vec<usize> {
        (0..lp.len()).filter(|&i| lp[i].is_finite()).collect()
    }

    #[test]
    fn greedy_is_argmax_first_on_ties() {
        let mut s = Sampler::new(cfg(0.0), Some(0));
        assert_eq!(s.sample(&mut [1.0, 3.0, -2.0, 3.0], &[]), 1);
    }

    #[test]
    fn repetition_penalty_is_sign_aware_and_applied_once() {
        let mut logits = [2.0, -2.0, 1.0, 4.0];
        apply_repetition_penalty(&mut logits, &[0, 1, 0, 0], 2.0);
        assert_eq!(logits, [1.0, -4.0, 1.0, 4.0]);
        // Only the last `repetition_context_size` tokens count: token 3 (seen long ago) wins.
        let mut s = Sampler::new(
            SamplerConfig {
                repetition_penalty: Some(10.0),
                repetition_context_size: 1,
                ..cfg(0.0)
            },
            None,
        );
        assert_eq!(s.sample(&mut [0.0, 0.0, 0.0, 5.0, 4.5], &[3, 4]), 3);
        assert_eq!(s.sample(&mut [0.0, 0.0, 0.0, 5.0, 4.5], &[4, 3]), 4);
    }

    #[test]
    fn presence_counts_once_and_frequency_per_occurrence() {
        let mut logits = [2.0, -2.0, 1.0, 4.0];
        apply_additive_penalties(&mut logits, &[0, 1, 0, 0, 7], 0.5, 0.25);
        // token 0 seen three times, token 1 once, token 7 outside the vocabulary.
        assert_eq!(logits, [2.0 - 0.5 - 0.75, -2.0 - 0.5 - 0.25, 1.0, 4.0]);
        // Through the sampler: only the window counts, and a negative penalty favours repeats.
        let pick = |presence: f32, frequency: f32, history: &[u32]| {
            let mut s = Sampler::new(
                SamplerConfig {
                    presence_penalty: presence,
                    frequency_penalty: frequency,
                    repetition_context_size: 2,
                    ..cfg(0.0)
                },
                None,
            );
            s.sample(&mut [0.0, 1.0, 0.8], history)
        };
        assert_eq!(pick(0.0, 0.0, &[1]), 1);
        assert_eq!(pick(0.5, 0.0, &[1]), 2);
        assert_eq!(pick(0.0, 0.15, &[1, 1]), 2);
        assert_eq!(pick(0.0, 0.15, &[1]), 1);
        assert_eq!(
            pick(0.5, 0.0, &[1, 0, 0]),
            1,
            "token 1 is outside the window"
        );
        assert_eq!(pick(-0.5, 0.0, &[2]), 2);
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus() {
        // probabilities 0.5, 0.3, 0.15, 0.05
        let mut lp: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        apply_top_p(&mut lp, 0.7);
        assert_eq!(kept(&lp), [0, 1]);
        let mut lp: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        apply_top_p(&mut lp, 0.9);
        assert_eq!(kept(&lp), [0, 1, 2]);
    }

    #[test]
    fn min_p_is_relative_to_the_top_token() {
        let mut lp: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        apply_min_p(&mut lp, 0.2); // threshold 0.1
        assert_eq!(kept(&lp), [0, 1, 2]);
        let mut lp = logprobs(&[1.0, 1.0]);
        apply_min_p(&mut lp, 1.0);
        assert_eq!(kept(&lp), [0, 1], "ties with the top survive");
    }

    #[test]
    fn top_k_keeps_k_largest() {
        let mut lp = logprobs(&[0.1, 2.0, -1.0, 1.5, 0.7]);
        apply_top_k(&mut lp, 2);
        assert_eq!(kept(&lp), [1, 3]);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_softmax() {
        let logits = [1.0f32, 2.0, 0.0, 1.5];
        let draw = |seed| {
            let mut s = Sampler::new(cfg(1.0), Some(seed));
            (0..20_000)
                .map(|_| s.sample(&mut logits.clone(), &[]) as usize)
                .collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert_ne!(a, draw(8));
        // softmax: .174 .474 .064 .288
        let want: Vec<f32> = logprobs(&logits).iter().map(|l| l.exp()).collect();
        for (t, p) in want.iter().enumerate() {
            let freq = a.iter().filter(|&&x| x == t).count() as f32 / a.len() as f32;
            assert!((freq - p).abs() < 0.015, "token {t}: {freq} vs {p}");
        }
        // A low temperature sharpens: at temp 0.25 the top token has
        // e^8 / (e^4 + e^8 + 1 + e^6) = 0.867.
        let mut s = Sampler::new(cfg(0.25), Some(1));
        let top = (0..5000)
            .filter(|_| s.sample(&mut logits.clone(), &[]) == 1)
            .count() as f32
            / 5000.0;
        let z: f32 = logits.iter().map(|l| (4.0 * l).exp()).sum();
        assert!((top - (8.0f32).exp() / z).abs() < 0.02, "{top}");
    }

    #[test]
    fn filters_compose_with_sampling() {
        // top_k 1 at any temperature is greedy.
        let mut s = Sampler::new(
            SamplerConfig {
                top_k: 1,
                ..cfg(5.0)
            },
            Some(3),
        );
        assert!((0..100).all(|_| s.sample(&mut [0.0, 0.1, 0.2, 0.15], &[]) == 2));
    }
}
