//! The chunked (WY) form of the gated delta rule against the token-by-token recurrence it
//! replaces for prefill: random inputs at the models' shapes and small ones, lengths around
//! the chunk size, a non-zero initial state, both state dtypes, fast decay and padding masks.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{rel_max, values, Rng};
use gdn_ops::{gated_delta_update_in, GdnForm};

#[derive(Clone, Copy, Debug)]
struct Shape {
    b: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
}

/// Qwen3-Next-80B-A3B and most Qwen3.5 checkpoints.
const QWEN3_NEXT: Shape = Shape {
    b: 1,
    hk: 16,
    hv: 32,
    dk: 128,
    dv: 128,
};
/// Qwen3.5-397B-A17B: four value heads per key head.
const QWEN3_5_LARGE: Shape = Shape {
    b: 1,
    hk: 16,
    hv: 64,
    dk: 128,
    dv: 128,
};
/// The tiny fixtures' shapes, batched.
const SMALL: Shape = Shape {
    b: 2,
    hk: 2,
    hv: 4,
    dk: 32,
    dv: 32,
};
/// Dims off the 16-lane tiles and three value heads per key head.
const ODD: Shape = Shape {
    b: 1,
    hk: 1,
    hv: 3,
    dk: 40,
    dv: 8,
};

/// The decays of a case: `g` uniform in `[lo, hi)`.
#[derive(Clone, Copy, Debug)]
struct Decay {
    lo: f32,
    hi: f32,
}

/// The model's range: `exp(−exp(A_log)·softplus(·))` sits mostly close to 1.
const SLOW: Decay = Decay { lo: 0.8, hi: 1.0 };

struct Case {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Vec<f32>,
    shape: Shape,
}

/// L2-normalised q (scaled by 1/√Dk) and k as the model passes them, `v` in ±1, `β` in
/// (0, 1), and a non-zero initial state.
fn case(s: Shape, t: usize, decay: Decay, seed: u64) -> Case {
    let dev = Device::Cpu;
    let mut rng = Rng::new(seed);
    let mut unit = |scale: f32| {
        let mut x: Vec<f32> = (0..s.b * t * s.hk * s.dk)
            .map(|_| rng.uniform(-1.0, 1.0))
            .collect();
        for h in x.chunks_exact_mut(s.dk) {
            let n = h.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            h.iter_mut().for_each(|v| *v *= scale / n);
        }
        Tensor::from_vec(x, (s.b, t, s.hk, s.dk), &dev).unwrap()
    };
    let q = unit(1.0 / (s.dk as f32).sqrt());
    let k = unit(1.0);
    let mut rng = Rng::new(seed + 1);
    let mut r =
        |n: usize, lo: f32, hi: f32| -> Vec<f32> { (0..n).map(|_| rng.uniform(lo, hi)).collect() };
    let v = Tensor::from_vec(
        r(s.b * t * s.hv * s.dv, -1.0, 1.0),
        (s.b, t, s.hv, s.dv),
        &dev,
    );
    let g = Tensor::from_vec(r(s.b * t * s.hv, decay.lo, decay.hi), (s.b, t, s.hv), &dev);
    let beta = Tensor::from_vec(r(s.b * t * s.hv, 0.0, 1.0), (s.b, t, s.hv), &dev);
    let state = r(s.b * s.hv * s.dv * s.dk, -0.5, 0.5);
    Case {
        q,
        k,
        v: v.unwrap(),
        g: g.unwrap(),
        beta: beta.unwrap(),
        state,
        shape: s,
    }
}

/// `(y, final state)` of one call in `form` from the case's initial state stored in `dtype`.
fn run(c: &Case, form: GdnForm, dtype: DType, mask: Option<&Tensor>) -> (Tensor, Tensor) {
    let s = c.shape;
    let state = Tensor::from_slice(&c.state, (s.b, s.hv, s.dv, s.dk), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let y = gated_delta_update_in(form, &c.q, &c.k, &c.v, &c.g, &c.beta, &state, mask).unwrap();
    (y, state)
}

/// y and the final state of the chunked form within `tol` (of the largest magnitude) of the
/// recurrence's, in f32.
fn assert_matches(c: &Case, tol: f32, mask: Option<&Tensor>, what: &str) {
    let (y_ref, s_ref) = run(c, GdnForm::Recurrent, DType::F32, mask);
    let (y, s) = run(c, GdnForm::Chunked, DType::F32, mask);
    assert_eq!(y.dims(), y_ref.dims());
    let (ey, es) = (rel_max(&y, &y_ref), rel_max(&s, &s_ref));
    eprintln!("{what}: y {ey:.1e}, state {es:.1e}");
    assert!(
        ey <= tol && es <= tol,
        "{what}: chunked vs recurrent: y {ey:e}, state {es:e} (tolerance {tol:e})"
    );
}

const F32_TOL: f32 = 1e-5;

#[test]
fn small_shapes_around_the_chunk_size() {
    for t in [1, 63, 64, 65, 200, 512] {
        for (shape, name) in [(SMALL, "small"), (ODD, "odd dims")] {
            let c = case(shape, t, SLOW, 10 + t as u64);
            assert_matches(&c, F32_TOL, None, &format!("{name}, T = {t}"));
        }
    }
}

#[test]
fn qwen3_next_shapes() {
    for t in [1, 63, 64, 65, 200, 512] {
        let c = case(QWEN3_NEXT, t, SLOW, 100 + t as u64);
        assert_matches(&c, F32_TOL, None, &format!("Qwen3-Next, T = {t}"));
    }
}

#[test]
fn qwen3_5_four_value_heads_per_key_head() {
    for t in [65, 200] {
        let c = case(QWEN3_5_LARGE, t, SLOW, 200 + t as u64);
        assert_matches(&c, F32_TOL, None, &format!("Qwen3.5-397B, T = {t}"));
    }
}

/// Decays down to 1e-30 (the state forgets within a token), exact zeros and exact ones
/// among them: products that underflow must give 0, never NaN or ∞.
#[test]
fn fast_decay_underflows_to_zero() {
    for t in [64, 200] {
        let mut c = case(SMALL, t, Decay { lo: 0.0, hi: 1.0 }, 300 + t as u64);
        let mut rng = Rng::new(7);
        let g: Vec<f32> = values(&c.g)
            .iter()
            .enumerate()
            .map(|(i, _)| match i % 5 {
                0 => 0.0,
                1 => 1.0,
                _ => 10f32.powf(rng.uniform(-30.0, -1.0)),
            })
            .collect();
        c.g = Tensor::from_vec(g, c.g.dims(), &Device::Cpu).unwrap();
        let (y, s) = run(&c, GdnForm::Chunked, DType::F32, None);
        assert!(values(&y).iter().chain(&values(&s)).all(|x| x.is_finite()));
        assert_matches(&c, F32_TOL, None, &format!("fast decay, T = {t}"));
    }
}

/// The bf16 state is read once and rounded once per call: the chunked form's bf16 state is
/// its own f32 result rounded, bit for bit, and y is the f32-state run's; both stay within
/// rounding of the recurrence in bf16-state mode.
#[test]
fn bf16_state_is_rounded_once_per_call() {
    for t in [65, 200] {
        let mut c = case(SMALL, t, SLOW, 400 + t as u64);
        // An initial state both dtypes hold exactly.
        c.state = c
            .state
            .iter()
            .map(|x| half::bf16::from_f32(*x).to_f32())
            .collect();
        let (y32, s32) = run(&c, GdnForm::Chunked, DType::F32, None);
        let (y16, s16) = run(&c, GdnForm::Chunked, DType::BF16, None);
        assert_eq!(values(&y16), values(&y32), "T = {t}: y");
        let rounded: Vec<f32> = values(&s32)
            .iter()
            .map(|x| half::bf16::from_f32(*x).to_f32())
            .collect();
        assert_eq!(
            values(&s16),
            rounded,
            "T = {t}: state rounded more than once"
        );
        let (y_ref, s_ref) = run(&c, GdnForm::Recurrent, DType::BF16, None);
        let (ey, es) = (rel_max(&y16, &y_ref), rel_max(&s16, &s_ref));
        // y is f32 on both sides; the states differ by at most one bf16 rounding (2⁻⁸).
        assert!(
            ey <= F32_TOL && es <= 1.0 / 256.0,
            "T = {t}: bf16 state: y {ey:e}, state {es:e}"
        );
    }
}

/// Padding tokens (mask 0) leave the state alone and output 0, as in the recurrence.
#[test]
fn masked_tokens_match_the_recurrence() {
    let t = 130;
    let c = case(SMALL, t, SLOW, 500);
    let mask: Vec<f32> = (0..SMALL.b * t)
        .map(|i| {
            if i % 7 == 3 || (i >= t && i < t + 20) {
                0.0
            } else {
                1.0
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, (SMALL.b, t), &Device::Cpu).unwrap();
    assert_matches(&c, F32_TOL, Some(&mask), "masked");
    let (y, _) = run(&c, GdnForm::Chunked, DType::F32, Some(&mask));
    let y = values(&y);
    let per_token = SMALL.hv * SMALL.dv;
    assert!(y[3 * per_token..4 * per_token].iter().all(|&x| x == 0.0));
    assert!(y[t * per_token..(t + 20) * per_token]
        .iter()
        .all(|&x| x == 0.0));
}

/// A zero-length call returns an empty y and leaves the state as it was.
#[test]
fn zero_tokens() {
    let c = case(SMALL, 0, SLOW, 600);
    let (y, s) = run(&c, GdnForm::Chunked, DType::F32, None);
    assert_eq!(y.dims(), [SMALL.b, 0, SMALL.hv, SMALL.dv]);
    assert_eq!(values(&s), c.state);
}

/// Activations in bf16 (the model's usual dtype): y comes back in bf16, within its rounding
/// of the recurrence's.
#[test]
fn bf16_activations() {
    let c = case(SMALL, 100, SLOW, 700);
    let to = |x: &Tensor| x.to_dtype(DType::BF16).unwrap();
    let c = Case {
        q: to(&c.q),
        k: to(&c.k),
        v: to(&c.v),
        ..c
    };
    let (y_ref, s_ref) = run(&c, GdnForm::Recurrent, DType::F32, None);
    let (y, s) = run(&c, GdnForm::Chunked, DType::F32, None);
    assert_eq!(y.dtype(), DType::BF16);
    assert!(rel_max(&s, &s_ref) <= F32_TOL);
    assert!(rel_max(&y, &y_ref) <= 1.0 / 128.0);
}

#[test]
fn form_selection() {
    assert_eq!(GdnForm::from_env_value("chunked"), Some(GdnForm::Chunked));
    assert_eq!(
        GdnForm::from_env_value("recurrent"),
        Some(GdnForm::Recurrent)
    );
    assert_eq!(GdnForm::from_env_value("Chunked"), None);
    assert_eq!(GdnForm::by_length(1), GdnForm::Recurrent);
    assert_eq!(
        GdnForm::by_length(gdn_ops::ops::gated_delta::CHUNKED_MIN_STEPS),
        GdnForm::Chunked
    );
}
