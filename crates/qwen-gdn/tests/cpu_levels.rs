//! The hot CPU loops exist in three compiled copies (portable, AVX2, AVX-512) chosen at run
//! time; `QWEN_GDN_CPU_LEVEL` caps the choice, so every copy this machine can run is checked
//! here: `eval --json` log-probabilities agree across levels to float rounding (1e-4), with
//! and without 8-bit activations.
//!
//! With 8-bit activations, below AVX-512 VNNI the 4-bit matrices keep the plain layout, so
//! `best` is asked for the plain layout too (`QWEN_GDN_Q8_LAYOUT=plain`): the interleaved
//! layout sums in another order, and the rounding of activations to 8 bits turns such float
//! differences into steps of a rounding unit, so two layouts are not comparable at 1e-4 (they
//! are equally far from the exact path). Its kernel's VNNI and portable copies are compared
//! bit for bit in `gdn_ops::ops::affine::q8_interleaved`'s tests.

mod common;

use common::*;

fn logprobs(level: &str, extra: &[&str]) -> Vec<f64> {
    logprobs_with(level, extra, None)
}

fn logprobs_with(level: &str, extra: &[&str], q8_layout: Option<&str>) -> Vec<f64> {
    let mut env = vec![("QWEN_GDN_CPU_LEVEL", level)];
    env.extend(q8_layout.map(|layout| ("QWEN_GDN_Q8_LAYOUT", layout)));
    // One token per forward: the decode-shaped products, where the copies differ most.
    eval_logprobs_per_token(
        &fixture("qwen3-next-tiny-4bit"),
        "One two three four five six seven eight nine ten.",
        extra,
        &env,
    )
}

#[test]
fn every_compiled_copy_computes_the_same() {
    for extra in [&[][..], &["--q8-activations"][..]] {
        let best = logprobs_with("best", extra, Some("plain"));
        for level in ["portable", "avx2"] {
            let got = logprobs(level, extra);
            assert_eq!(got.len(), best.len());
            let worst = got
                .iter()
                .zip(&best)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(
                worst <= 1e-4,
                "{level} {extra:?}: log-probs differ by {worst}"
            );
        }
    }
}
