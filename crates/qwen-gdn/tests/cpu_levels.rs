//! The hot CPU loops have a copy per instruction-set level (`gdn_ops::simd::Level`), chosen at
//! run time; `QWEN_GDN_CPU_LEVEL` pins one, so every level this machine runs is checked here
//! against the portable one: `eval --json` log-probabilities agree to float rounding (1e-4),
//! in f32 and with 8-bit activations in each q8 layout.
//!
//! With 8-bit activations each layout is compared with itself: the interleaved layout's kernel
//! sums in another order than the plain one's, and the rounding of activations to 8 bits turns
//! such float differences into steps of a rounding unit, so two layouts are not comparable at
//! 1e-4 (they are equally far from the exact path). Each kernel's copies are compared bit for
//! bit in gdn-ops (`tests/cpu_levels.rs` and the kernels' own tests).

mod common;

use common::*;
use gdn_ops::simd::Level;

fn logprobs(level: &str, extra: &[&str], q8_layout: Option<&str>) -> Vec<f64> {
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
fn every_supported_level_computes_what_the_portable_one_does() {
    let modes: [(&[&str], Option<&str>); 3] = [
        (&[], None),
        (&["--q8-activations"], Some("plain")),
        (&["--q8-activations"], Some("interleaved")),
    ];
    for (extra, layout) in modes {
        let want = logprobs("portable", extra, layout);
        for level in Level::supported_levels() {
            if level == Level::Portable {
                continue;
            }
            let got = logprobs(level.name(), extra, layout);
            assert_eq!(got.len(), want.len());
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(
                worst <= 1e-4,
                "{} {extra:?} {layout:?}: log-probs differ by {worst}",
                level.name()
            );
        }
    }
}

/// A level this CPU lacks is refused before anything loads, in one line naming what it lacks.
#[test]
fn a_level_the_cpu_lacks_is_refused_in_one_line() {
    let dir = fixture("qwen3-next-tiny-4bit");
    let lacking = Level::ALL.into_iter().filter(|l| !l.supported());
    for level in lacking {
        let out = model_command("eval", &dir, &["--text", "One two.", "--json"])
            .env("QWEN_GDN_CPU_LEVEL", level.name())
            .output()
            .unwrap();
        let why = level.missing().unwrap();
        assert_error(&out, &["QWEN_GDN_CPU_LEVEL", level.name(), &why]);
    }
}
