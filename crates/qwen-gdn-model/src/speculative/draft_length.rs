//! How many tokens a speculative step drafts: a fixed number, or one chosen before each step
//! from the acceptance measured so far ([`DraftLength::Adaptive`]).
//!
//! The adaptive rule. Model each draft of a step as accepted with the same probability `a`,
//! given that the drafts before it were (the verify stops at the first rejection). A step of k
//! drafts then decides `E(k) = 1 + a + … + a^k` tokens, and costs `1 + c·k` plain decode
//! steps, where `c` ([`DRAFT_COST`]) is the cost of one more draft: its head call and its row of
//! the verify pass. The step drafts the k in `1..=max` that maximizes `E(k) / (1 + c·k)`, the
//! expected tokens per unit of work (the smallest such k on ties).
//!
//! `a` is estimated from the steps so far: the accepted drafts over the drafts that were judged
//! (all accepted ones, plus the one rejection of a step that had one; drafts after a rejection
//! are never judged), both counts decayed by [`DECAY`] per step so that the estimate follows the
//! text (acceptance is high in boilerplate, low in free prose), and started from a prior
//! ([`PRIOR_ACCEPTANCE`], worth [`PRIOR_WEIGHT`] judged drafts).
//!
//! `c` is a constant, not yet measured on the device: see docs/mtp.md, "left".

use std::fmt;

/// The cost of one more draft (head call plus verify row) in plain decode steps. The issue's
/// goal for the verify pass on a GPU is t(k + 1) / t(1) ≤ 1.3 for k ≤ 3 (0.1 per row), and the
/// head is one decoder layer plus the lm_head (about another 0.1 at a 150k vocabulary).
pub const DRAFT_COST: f64 = 0.2;
/// Per step, the weight the earlier steps' counts keep: about the last ten steps count.
pub const DECAY: f64 = 0.9;
/// The acceptance assumed before any draft was judged, and how many judged drafts it is worth.
pub const PRIOR_ACCEPTANCE: f64 = 0.6;
pub const PRIOR_WEIGHT: f64 = 2.0;
/// The largest k of `--draft-tokens auto`: beyond it the gain at acceptance 0.9 is below 1%,
/// and each drafted token costs one recurrent-state copy per GDN layer in the verify window.
pub const ADAPTIVE_MAX: usize = 6;

/// Draft tokens per step.
#[derive(Debug, Clone, PartialEq)]
pub enum DraftLength {
    Fixed(usize),
    Adaptive(AdaptiveDraft),
}

impl From<usize> for DraftLength {
    fn from(k: usize) -> Self {
        DraftLength::Fixed(k)
    }
}

impl DraftLength {
    /// Adaptive, between 1 and `max` draft tokens.
    pub fn adaptive(max: usize) -> Self {
        DraftLength::Adaptive(AdaptiveDraft::new(max))
    }

    /// The most tokens a step drafts.
    pub fn max(&self) -> usize {
        match self {
            DraftLength::Fixed(k) => *k,
            DraftLength::Adaptive(a) => a.max,
        }
    }

    /// Draft tokens for the next step.
    pub fn next(&self) -> usize {
        match self {
            DraftLength::Fixed(k) => *k,
            DraftLength::Adaptive(a) => a.next(),
        }
    }

    /// A step drafted `drafted` tokens and `accepted` of them were kept.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if let DraftLength::Adaptive(a) = self {
            a.record(drafted, accepted);
        }
    }
}

/// "2 draft tokens", "adaptive draft tokens (1–6)": what the stats line says was asked.
impl fmt::Display for DraftLength {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DraftLength::Fixed(k) => write!(f, "{k} draft tokens"),
            DraftLength::Adaptive(a) => write!(f, "adaptive draft tokens (1–{})", a.max),
        }
    }
}

/// The acceptance estimate of the adaptive rule (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveDraft {
    max: usize,
    /// Decayed counts of accepted and of judged drafts, the prior included.
    accepted: f64,
    judged: f64,
}

impl AdaptiveDraft {
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            accepted: PRIOR_ACCEPTANCE * PRIOR_WEIGHT,
            judged: PRIOR_WEIGHT,
        }
    }

    /// The current estimate of `a`.
    pub fn acceptance(&self) -> f64 {
        self.accepted / self.judged
    }

    pub fn next(&self) -> usize {
        best_draft_length(self.acceptance(), DRAFT_COST, self.max)
    }

    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let rejected = usize::from(accepted < drafted);
        self.accepted = DECAY * self.accepted + accepted as f64;
        self.judged = DECAY * self.judged + (accepted + rejected) as f64;
    }
}

/// The k in `1..=max` with the most expected tokens per unit of work at acceptance `a` and a
/// cost `c` per draft (module docs); the smallest on ties.
pub fn best_draft_length(a: f64, c: f64, max: usize) -> usize {
    let mut best = (1, f64::MIN);
    // E(k) = 1 + a + … + a^k, built up term by term.
    let (mut expected, mut term) = (1.0, 1.0);
    for k in 1..=max.max(1) {
        term *= a;
        expected += term;
        let value = expected / (1.0 + c * k as f64);
        // A relative margin: ties (up to rounding) go to the smaller k.
        if value > best.1 * (1.0 + 1e-12) {
            best = (k, value);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule against the closed form, by brute force over k.
    #[test]
    fn the_best_length_maximizes_expected_tokens_per_cost() {
        for &a in &[0.0f64, 0.1, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0] {
            for &c in &[0.05, 0.2, 0.5] {
                let value = |k: usize| {
                    let e: f64 = (0..=k).map(|j| a.powi(j as i32)).sum();
                    e / (1.0 + c * k as f64)
                };
                let k = best_draft_length(a, c, 8);
                for other in 1..=8 {
                    assert!(
                        value(k) >= value(other) - 1e-12,
                        "a {a}, c {c}: k {k} ({}) < k {other} ({})",
                        value(k),
                        value(other)
                    );
                }
            }
        }
        // Worked values at c = 0.2 (docs/mtp.md): a 0.5 → 1, a 0.8 → 4, a 0.9 → 6 of 6.
        assert_eq!(best_draft_length(0.5, 0.2, 6), 1);
        assert_eq!(best_draft_length(0.8, 0.2, 6), 4);
        assert_eq!(best_draft_length(0.9, 0.2, 6), 6);
        assert_eq!(best_draft_length(0.0, 0.2, 6), 1);
        assert_eq!(best_draft_length(1.0, 0.2, 3), 3);
    }

    #[test]
    fn the_estimate_follows_the_acceptance() {
        let mut length = DraftLength::adaptive(6);
        let start = length.next();
        // Every draft accepted: k climbs to the maximum.
        for _ in 0..30 {
            let k = length.next();
            length.record(k, k);
        }
        assert_eq!(length.next(), 6);
        assert!(start < 6, "the prior alone already asks for the maximum");
        // Every first draft rejected: back to 1 (the 6-token steps' weight takes a while to
        // decay).
        for _ in 0..60 {
            let k = length.next();
            length.record(k, 0);
        }
        assert_eq!(length.next(), 1);
        let DraftLength::Adaptive(a) = &length else {
            unreachable!()
        };
        assert!(a.acceptance() < 0.05, "{}", a.acceptance());
    }

    #[test]
    fn only_judged_drafts_count() {
        let mut a = AdaptiveDraft::new(4);
        let (acc, judged) = (a.accepted, a.judged);
        // 4 drafted, 1 accepted: the 2nd was rejected, the 3rd and 4th never judged.
        a.record(4, 1);
        assert!((a.accepted - (DECAY * acc + 1.0)).abs() < 1e-12);
        assert!((a.judged - (DECAY * judged + 2.0)).abs() < 1e-12);
        // All accepted: no rejection judged.
        a.record(3, 3);
        assert!((a.judged - (DECAY * (DECAY * judged + 2.0) + 3.0)).abs() < 1e-12);
        let fixed = DraftLength::Fixed(3);
        assert_eq!((fixed.next(), fixed.max()), (3, 3));
        assert_eq!(fixed.to_string(), "3 draft tokens");
        assert_eq!(
            DraftLength::adaptive(6).to_string(),
            "adaptive draft tokens (1–6)"
        );
    }
}
