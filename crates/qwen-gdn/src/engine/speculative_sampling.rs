//! How the engine drafts and judges speculative tokens with its own sampler
//! (`qwen_gdn_model::speculative::Judge`): the head's logits and the main model's go through the
//! same penalties, filters and temperature.
//!
//! - temp 0: drafts are the head's argmax, each row's token is the main model's argmax; the
//!   output is the plain greedy output.
//! - temp > 0: speculative sampling (Leviathan et al. 2023, Chen et al. 2023). A draft `d` drawn
//!   from the head's distribution `q` is accepted with probability `min(1, p(d) / q(d))`, `p` the
//!   main model's; on rejection the token is drawn from `max(0, p − q)`, normalised; past the last
//!   draft from `p`. Each token then has exactly the distribution plain sampling gives it (the
//!   chi-square test below); the random numbers drawn differ, so a seeded run's text does too.

use super::sampler::{Sampler, Weights};
use qwen_gdn_model::speculative::Judge;

/// The engine's [`Judge`] for one step: its sampler, and the tokens the penalties look back
/// over up to the step's first token.
pub struct SamplerJudge<'a> {
    sampler: &'a mut Sampler,
    history: &'a [u32],
    /// Per draft of the step: the head's normalised distribution it was drawn from (`None`
    /// for an argmax).
    drafted: Vec<Option<Vec<f64>>>,
}

impl<'a> SamplerJudge<'a> {
    pub fn new(sampler: &'a mut Sampler, history: &'a [u32]) -> Self {
        Self {
            sampler,
            history,
            drafted: Vec::new(),
        }
    }

    fn weights(&self, logits: &mut [f32], before: &[u32]) -> Weights {
        let seen: Vec<u32> = self.history.iter().chain(before).copied().collect();
        self.sampler.weights(logits, &seen)
    }
}

fn normalised(w: Vec<f64>) -> Vec<f64> {
    let sum: f64 = w.iter().sum();
    w.into_iter().map(|x| x / sum).collect()
}

impl Judge for SamplerJudge<'_> {
    fn draft(&mut self, logits: &mut [f32], before: &[u32]) -> u32 {
        self.drafted.truncate(before.len());
        match self.weights(logits, before) {
            Weights::Argmax(t) => {
                self.drafted.push(None);
                t
            }
            Weights::Draw(w) => {
                let t = self.sampler.draw(&w);
                self.drafted.push(Some(normalised(w)));
                t
            }
        }
    }

    fn decide(&mut self, logits: &mut [f32], before: &[u32], draft: Option<u32>) -> u32 {
        let w = match self.weights(logits, before) {
            Weights::Argmax(t) => return t,
            Weights::Draw(w) => w,
        };
        let q = match (draft, self.drafted.get(before.len())) {
            (Some(d), Some(Some(q))) => (d as usize, q),
            // Past the last draft (or a draft not drawn from a distribution): plain sampling.
            _ => return self.sampler.draw(&w),
        };
        let p = normalised(w);
        let (d, q) = q;
        if self.sampler.uniform() * q[d] < p[d] {
            return d as u32;
        }
        let residual: Vec<f64> = p.iter().zip(q).map(|(p, q)| (p - q).max(0.0)).collect();
        if residual.iter().sum::<f64>() > 0.0 {
            self.sampler.draw(&residual)
        } else {
            // p ≤ q everywhere means p = q: any rejection was rounding; p is the answer.
            self.sampler.draw(&p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::SamplerConfig;

    /// Chi-square critical values at a false-alarm rate of 0.001 (degrees of freedom 1..=15).
    const CHI2_999: [f64; 15] = [
        10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588, 31.264,
        32.909, 34.528, 36.123, 37.697,
    ];

    /// Pearson's statistic of `counts` against probabilities `p` (bins with fewer than 5
    /// expected merged into one), and its degrees of freedom.
    fn chi_square(counts: &[usize], p: &[f64]) -> (f64, usize) {
        let n: usize = counts.iter().sum();
        let (mut stat, mut bins) = (0.0, 0);
        let (mut small_obs, mut small_exp) = (0.0, 0.0);
        for (&c, &p) in counts.iter().zip(p) {
            let e = p * n as f64;
            if e < 5.0 {
                small_obs += c as f64;
                small_exp += e;
                continue;
            }
            stat += (c as f64 - e).powi(2) / e;
            bins += 1;
        }
        if small_exp > 0.0 {
            stat += (small_obs - small_exp).powi(2) / small_exp.max(1e-12);
            bins += 1;
        }
        (stat, bins - 1)
    }

    fn probs(logits: &[f32], temp: f32) -> Vec<f64> {
        let w: Vec<f64> = logits.iter().map(|&l| ((l / temp) as f64).exp()).collect();
        normalised(w)
    }

    /// Two positions of a made-up model: `p1` for the first token, `p2(t1)` for the second;
    /// the draft's `q1`, `q2(d1)` deliberately different.
    fn target(t1: Option<u32>) -> Vec<f32> {
        match t1 {
            None => vec![1.0, 0.2, -0.5, 0.8, 0.0, -1.0],
            Some(t) => (0..6)
                .map(|i| ((i as u32 * 7 + t * 3) % 6) as f32 * 0.4 - 1.0)
                .collect(),
        }
    }

    fn draft_logits(d1: Option<u32>) -> Vec<f32> {
        match d1 {
            None => vec![0.0, 1.5, 0.3, -0.2, 0.9, 0.1],
            Some(t) => (0..6)
                .map(|i| ((i as u32 * 5 + t) % 6) as f32 * 0.5 - 1.2)
                .collect(),
        }
    }

    #[test]
    fn speculative_sampling_keeps_the_joint_distribution_of_two_tokens() {
        // Draft two tokens, verify them as the step does, and complete the pair with plain
        // sampling when the first draft was rejected (the next step's first row).
        let cfg = SamplerConfig {
            temp: 0.8,
            ..SamplerConfig::greedy()
        };
        let mut sampler = Sampler::new(cfg, Some(2028));
        const N: usize = 40_000;
        let mut counts = vec![0usize; 36];
        let mut accepted_first = 0;
        for _ in 0..N {
            let mut judge = SamplerJudge::new(&mut sampler, &[]);
            let d1 = judge.draft(&mut draft_logits(None), &[]);
            let d2 = judge.draft(&mut draft_logits(Some(d1)), &[d1]);
            let t1 = judge.decide(&mut target(None), &[], Some(d1));
            let t2 = if t1 == d1 {
                accepted_first += 1;
                judge.decide(&mut target(Some(t1)), &[t1], Some(d2))
            } else {
                let mut judge = SamplerJudge::new(&mut sampler, &[]);
                judge.decide(&mut target(Some(t1)), &[t1], None)
            };
            counts[(t1 * 6 + t2) as usize] += 1;
        }
        let p1 = probs(&target(None), 0.8);
        let want: Vec<f64> = (0..36u32)
            .map(|i| p1[(i / 6) as usize] * probs(&target(Some(i / 6)), 0.8)[(i % 6) as usize])
            .collect();
        // 35 degrees of freedom: the critical value at 0.001 is 66.619.
        let (stat, df) = chi_square(&counts, &want);
        assert_eq!(df, 35);
        assert!(stat < 66.619, "chi-square {stat:.1} over {df} dof");
        // The drafts were not the target: some were rejected, many accepted.
        let rate = accepted_first as f64 / N as f64;
        assert!(rate > 0.3 && rate < 0.95, "first-draft acceptance {rate}");
    }

    #[test]
    fn the_test_itself_catches_a_wrong_distribution() {
        // Accepting every draft gives the draft's distribution: the same test must fail.
        let cfg = SamplerConfig {
            temp: 0.8,
            ..SamplerConfig::greedy()
        };
        let mut sampler = Sampler::new(cfg, Some(7));
        let mut counts = vec![0usize; 6];
        for _ in 0..20_000 {
            let mut judge = SamplerJudge::new(&mut sampler, &[]);
            counts[judge.draft(&mut draft_logits(None), &[]) as usize] += 1;
        }
        let (stat, df) = chi_square(&counts, &probs(&target(None), 0.8));
        assert!(stat > CHI2_999[df - 1], "{stat}");
    }

    /// The engine end to end on the trained MTP fixture: the first two sampled tokens of
    /// 2000 seeded replies with `--draft-tokens 1` (the second one decided by a verify row
    /// with a draft) against the distribution plain sampling gives them, computed from the
    /// model's logits.
    #[test]
    fn the_engine_samples_the_first_two_tokens_as_without_speculation() {
        use crate::engine::{GenerateParams, PromptTokens};
        use std::sync::atomic::AtomicBool;

        let mut engine = crate::engine::tests::engine("mtp/qwen3.5-mtp-tiny-hf", 0);
        let dir = engine.checkpoint().dir.clone();
        assert!(engine.model.load_mtp(&dir).unwrap());
        let prompt: Vec<u32> = vec![785, 397, 1922, 264, 15, 1108, 374, 13];
        let cfg = SamplerConfig {
            temp: 1.0,
            top_k: 3,
            ..SamplerConfig::greedy()
        };
        // The exact distribution of (t1, t2): p1 from the prompt's logits, p2 from the prompt
        // and t1's, through the same filters.
        let model = &engine.model;
        let dist = |tokens: &[u32]| -> Vec<f64> {
            let mut cache = model.new_cache();
            let logits = model.forward_last(tokens, &mut cache).unwrap();
            let mut row = logits.squeeze(0).unwrap().to_vec1::<f32>().unwrap();
            match Sampler::new(cfg.clone(), Some(0)).weights(&mut row, &[]) {
                Weights::Draw(w) => normalised(w),
                Weights::Argmax(_) => unreachable!("temp 1"),
            }
        };
        let p1 = dist(&prompt);
        let support: Vec<usize> = (0..p1.len()).filter(|&i| p1[i] > 0.0).collect();
        assert_eq!(support.len(), 3);
        let mut pairs = vec![];
        let mut want = vec![];
        for &t1 in &support {
            let p2 = dist(&[prompt.as_slice(), &[t1 as u32]].concat());
            for t2 in (0..p2.len()).filter(|&i| p2[i] > 0.0) {
                pairs.push((t1 as u32, t2 as u32));
                want.push(p1[t1] * p2[t2]);
            }
        }
        engine.set_draft_length(Some(1.into())).unwrap();
        let mut counts = vec![0usize; pairs.len()];
        let (mut drafted, mut accepted) = (0, 0);
        for seed in 0..2000 {
            let params = GenerateParams {
                max_tokens: 3,
                sampler: cfg.clone(),
                seed: Some(seed),
                stop_strings: Vec::new(),
            };
            let out = engine
                .generate(
                    &PromptTokens::plain(prompt.clone()),
                    &params,
                    &AtomicBool::new(false),
                    &mut |_| std::ops::ControlFlow::Continue(()),
                )
                .unwrap();
            let pair = (out.tokens[0], out.tokens[1]);
            let i = pairs
                .iter()
                .position(|&p| p == pair)
                .expect("a pair outside the support");
            counts[i] += 1;
            let s = out.speculation.unwrap();
            drafted += s.drafted;
            accepted += s.accepted;
        }
        let (stat, df) = chi_square(&counts, &want);
        eprintln!("chi-square {stat:.2} over {df} dof; acceptance {accepted}/{drafted}");
        assert!(
            stat < CHI2_999[df - 1],
            "chi-square {stat:.1} over {df} dof"
        );
        assert!(drafted > 0 && accepted > 0 && accepted < drafted);
    }

    #[test]
    fn temperature_zero_is_argmax_on_both_sides() {
        let mut sampler = Sampler::new(SamplerConfig::greedy(), Some(1));
        let mut judge = SamplerJudge::new(&mut sampler, &[]);
        assert_eq!(judge.draft(&mut draft_logits(None), &[]), 1);
        assert_eq!(judge.decide(&mut target(None), &[], Some(1)), 0);
        assert_eq!(judge.decide(&mut target(None), &[], None), 0);
    }
}
