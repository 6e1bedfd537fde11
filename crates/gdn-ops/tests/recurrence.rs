//! The fused CPU recurrence against a direct transcription of the update in f64, over
//! shapes that exercise GQA, batches, several steps and state carried across calls.

mod common;

use candle_core::{DType, Device, Tensor};
use common::gated_delta::GdnDims;
use common::{values, Rng};
use gdn_ops::gated_delta_update;

/// Values in `[lo, hi)` from the MMIX LCG seeded with `seed` (its first draw skipped).
fn pseudo_random(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = Rng::lcg(seed);
    rng.next();
    (0..n).map(|_| rng.uniform(lo, hi)).collect()
}

/// S ← gS; kv = Sk; δ = (v − kv)β; S ← S + δkᵀ; y = Sq — written as plainly as possible.
#[allow(clippy::too_many_arguments)]
fn naive(
    c: &GdnDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f64],
) -> Vec<f64> {
    let mut y = vec![0f64; c.b * c.t * c.hv * c.dv];
    for b in 0..c.b {
        for hv in 0..c.hv {
            let hk = hv / (c.hv / c.hk);
            for t in 0..c.t {
                let qk = |i: usize| ((b * c.t + t) * c.hk + hk) * c.dk + i;
                let gi = (b * c.t + t) * c.hv + hv;
                let s = |d: usize, j: usize| ((b * c.hv + hv) * c.dv + d) * c.dk + j;
                for d in 0..c.dv {
                    for j in 0..c.dk {
                        state[s(d, j)] *= g[gi] as f64;
                    }
                }
                for d in 0..c.dv {
                    let kv: f64 = (0..c.dk).map(|j| state[s(d, j)] * k[qk(j)] as f64).sum();
                    let delta = (v[gi * c.dv + d] as f64 - kv) * beta[gi] as f64;
                    for j in 0..c.dk {
                        state[s(d, j)] += delta * k[qk(j)] as f64;
                    }
                    y[gi * c.dv + d] = (0..c.dk).map(|j| state[s(d, j)] * q[qk(j)] as f64).sum();
                }
            }
        }
    }
    y
}

fn check(c: GdnDims, calls: usize) {
    let dev = Device::Cpu;
    let state_len = c.b * c.hv * c.dv * c.dk;
    let mut want_state = vec![0f64; state_len];
    let state = Tensor::zeros((c.b, c.hv, c.dv, c.dk), DType::F32, &dev).unwrap();
    for call in 0..calls {
        let seed = call as u64 * 10;
        let qk_n = c.b * c.t * c.hk * c.dk;
        let (q, k) = (
            pseudo_random(qk_n, seed + 1, -0.3, 0.3),
            pseudo_random(qk_n, seed + 2, -0.3, 0.3),
        );
        let v = pseudo_random(c.b * c.t * c.hv * c.dv, seed + 3, -1.0, 1.0);
        let g = pseudo_random(c.b * c.t * c.hv, seed + 4, 0.5, 1.0);
        let beta = pseudo_random(c.b * c.t * c.hv, seed + 5, 0.0, 1.0);
        let want_y = naive(&c, &q, &k, &v, &g, &beta, &mut want_state);
        let t = |x: &[f32], s: &[usize]| Tensor::from_slice(x, s, &dev).unwrap();
        let y = gated_delta_update(
            &t(&q, &[c.b, c.t, c.hk, c.dk]),
            &t(&k, &[c.b, c.t, c.hk, c.dk]),
            &t(&v, &[c.b, c.t, c.hv, c.dv]),
            &t(&g, &[c.b, c.t, c.hv]),
            &t(&beta, &[c.b, c.t, c.hv]),
            &state,
        )
        .unwrap();
        let y = y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let got_state = state.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let max_err = |a: &[f32], b: &[f64]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (*x as f64 - y).abs())
                .fold(0.0, f64::max)
        };
        assert!(
            max_err(&y, &want_y) < 1e-5,
            "y differs by {}",
            max_err(&y, &want_y)
        );
        assert!(
            max_err(&got_state, &want_state) < 1e-5,
            "state differs by {}",
            max_err(&got_state, &want_state)
        );
    }
}

#[test]
fn decode_steps_with_gqa() {
    check(GdnDims::new(1, 1, 2, 4, 32, 16), 5);
}

#[test]
fn prefill_chunks_batched() {
    check(GdnDims::new(2, 7, 1, 3, 40, 8), 2);
}

#[test]
fn bf16_state_is_rounded_once_per_call() {
    let dev = Device::Cpu;
    let (q, k) = (
        Tensor::ones((1, 3, 1, 8), DType::F32, &dev).unwrap(),
        Tensor::ones((1, 3, 1, 8), DType::F32, &dev).unwrap(),
    );
    let v = Tensor::full(1.0f32 / 3.0, (1, 3, 1, 2), &dev).unwrap();
    let g = Tensor::ones((1, 3, 1), DType::F32, &dev).unwrap();
    let beta = Tensor::full(0.01f32, (1, 3, 1), &dev).unwrap();
    let s32 = Tensor::zeros((1, 1, 2, 8), DType::F32, &dev).unwrap();
    let s16 = Tensor::zeros((1, 1, 2, 8), DType::BF16, &dev).unwrap();
    gated_delta_update(&q, &k, &v, &g, &beta, &s32).unwrap();
    gated_delta_update(&q, &k, &v, &g, &beta, &s16).unwrap();
    let (a, b) = (values(&s32), values(&s16));
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            half::bf16::from_f32(*x).to_f32(),
            *y,
            "bf16 state must be the f32 result rounded once"
        );
    }
}

#[test]
fn masked_tokens_leave_state_untouched_and_output_zero() {
    let dev = Device::Cpu;
    let (b, t, h, d) = (1, 3, 2, 32);
    let r = |n: usize, seed: u64, lo: f32, hi: f32| pseudo_random(n, seed, lo, hi);
    let q = Tensor::from_vec(r(b * t * h * d, 1, -0.3, 0.3), (b, t, h, d), &dev).unwrap();
    let k = Tensor::from_vec(r(b * t * h * d, 2, -0.3, 0.3), (b, t, h, d), &dev).unwrap();
    let v = Tensor::from_vec(r(b * t * h * d, 3, -1.0, 1.0), (b, t, h, d), &dev).unwrap();
    let g = Tensor::from_vec(r(b * t * h, 4, 0.5, 1.0), (b, t, h), &dev).unwrap();
    let beta = Tensor::from_vec(r(b * t * h, 5, 0.0, 1.0), (b, t, h), &dev).unwrap();
    let mask = Tensor::from_vec(vec![1f32, 0., 1.], (b, t), &dev).unwrap();
    let masked_state = Tensor::zeros((b, h, d, d), DType::F32, &dev).unwrap();
    let y = gdn_ops::gated_delta_update_masked(&q, &k, &v, &g, &beta, &masked_state, Some(&mask))
        .unwrap();
    // The same without the middle token, one call per kept token.
    let plain_state = Tensor::zeros((b, h, d, d), DType::F32, &dev).unwrap();
    let mut kept = vec![];
    for i in [0, 2] {
        let s = |x: &Tensor| x.narrow(1, i, 1).unwrap().contiguous().unwrap();
        kept.push(
            gated_delta_update(&s(&q), &s(&k), &s(&v), &s(&g), &s(&beta), &plain_state).unwrap(),
        );
    }
    let f = |x: &Tensor| x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(f(&masked_state), f(&plain_state));
    assert_eq!(f(&y.narrow(1, 0, 1).unwrap()), f(&kept[0]));
    assert!(f(&y.narrow(1, 1, 1).unwrap()).iter().all(|&x| x == 0.0));
    assert_eq!(f(&y.narrow(1, 2, 1).unwrap()), f(&kept[1]));
}

#[test]
fn state_dtype_selection() {
    use gdn_ops::StateDtype;
    assert_eq!(StateDtype::from_env_value(Some("1")), StateDtype::Bf16);
    for other in [None, Some("0"), Some("true"), Some("1 "), Some("")] {
        assert_eq!(
            StateDtype::from_env_value(other),
            StateDtype::F32,
            "{other:?}"
        );
    }
    assert_eq!("bf16".parse::<StateDtype>().unwrap(), StateDtype::Bf16);
    assert!("fp8"
        .parse::<StateDtype>()
        .unwrap_err()
        .to_string()
        .contains("fp8"));
}

/// 512 decode steps on random inputs: the bf16-stored state stays within 5% (relative to
/// its largest magnitude) of the fp32 one, as mlx-lm's own precision test requires.
#[test]
fn bf16_state_drift_over_512_steps() {
    let dev = Device::Cpu;
    let (hk, hv, dk, dv) = (2, 4, 64, 32);
    let s32 = Tensor::zeros((1, hv, dv, dk), DType::F32, &dev).unwrap();
    let s16 = Tensor::zeros((1, hv, dv, dk), DType::BF16, &dev).unwrap();
    let unit = |x: Vec<f32>| {
        // L2-normalise per head, as the model does before the recurrence.
        let mut x = x;
        for h in x.chunks_exact_mut(dk) {
            let n = h.iter().map(|v| v * v).sum::<f32>().sqrt();
            h.iter_mut().for_each(|v| *v /= n);
        }
        x
    };
    for step in 0..512u64 {
        let q = Tensor::from_vec(
            unit(pseudo_random(hk * dk, 7 * step + 1, -1.0, 1.0)),
            (1, 1, hk, dk),
            &dev,
        )
        .unwrap();
        let k = Tensor::from_vec(
            unit(pseudo_random(hk * dk, 7 * step + 2, -1.0, 1.0)),
            (1, 1, hk, dk),
            &dev,
        )
        .unwrap();
        let v = Tensor::from_vec(
            pseudo_random(hv * dv, 7 * step + 3, -1.0, 1.0),
            (1, 1, hv, dv),
            &dev,
        )
        .unwrap();
        let g =
            Tensor::from_vec(pseudo_random(hv, 7 * step + 4, 0.9, 1.0), (1, 1, hv), &dev).unwrap();
        let beta =
            Tensor::from_vec(pseudo_random(hv, 7 * step + 5, 0.0, 1.0), (1, 1, hv), &dev).unwrap();
        gated_delta_update(&q, &k, &v, &g, &beta, &s32).unwrap();
        gated_delta_update(&q, &k, &v, &g, &beta, &s16).unwrap();
    }
    let (a, b) = (values(&s32), values(&s16));
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale;
    assert!(scale > 0.1, "the state should have grown (max {scale})");
    assert!(
        err > 0.0 && err <= 0.05,
        "bf16 state drifted by {err} of max|S|"
    );
    eprintln!("bf16 state drift after 512 steps: {err:.4} of max|S| ({scale:.3})");
}
