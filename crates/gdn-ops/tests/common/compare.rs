//! Comparing results with the twin's: a tensor's values, max relative error, ulp tolerance.

use super::dtype::Ty;
use candle_core::{DType, Device, Tensor};

/// Every element of a tensor on any device, in f32.
pub fn values(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// max |got − want| / max |want| (NaN in `got` counts as infinite).
pub fn rel_max(got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.dims(), want.dims());
    let (a, b) = (values(got), values(want));
    let scale = b
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    a.iter()
        .zip(&b)
        .map(|(x, y)| {
            if x.is_nan() {
                f32::INFINITY
            } else {
                (x - y).abs() / scale
            }
        })
        .fold(0f32, f32::max)
}

/// `None` when every `got[i]` is within `ulps` ulp of `ty` at `want[i]` plus `rel` of
/// max |want| (the f32 arithmetic both sides do in different orders); otherwise the worst
/// element. NaN fails.
pub fn close(what: &str, got: &[f32], want: &[f32], ty: Ty, ulps: f32, rel: f32) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        ));
    }
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let mut worst: Option<(f32, usize)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let allowed = ulps * ty.ulp(w) + rel * scale;
        let err = (g - w).abs();
        if err.is_nan() || err > allowed {
            let excess = if err.is_nan() {
                f32::INFINITY
            } else {
                err / allowed
            };
            if worst.is_none_or(|(e, _)| excess > e) {
                worst = Some((excess, i));
            }
        }
    }
    worst.map(|(excess, i)| {
        format!(
            "{what}[{i}] = {} but the twin has {} ({excess:.1}× the allowance; max |ref| {scale})",
            got[i], want[i]
        )
    })
}

/// max |got − want| / max |want| over the flattened values; NaN in `got` is ignored (f32::max),
/// unlike [`rel_max`].
pub fn max_rel(got: &Tensor, want: &Tensor) -> f32 {
    let (a, b) = (values(got), values(want));
    let max = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
        / max
}

pub fn max_abs(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// Largest |got - want| as a fraction of max |want|, with where it is.
pub fn rel_err(got: &[f32], want: &[f32]) -> (f32, usize) {
    let scale = max_abs(want).max(f32::MIN_POSITIVE);
    got.iter()
        .zip(want)
        .enumerate()
        .fold((0f32, 0), |(m, at), (i, (a, b))| {
            let e = if a.is_nan() {
                f32::INFINITY
            } else {
                (a - b).abs() / scale
            };
            if e > m {
                (e, i)
            } else {
                (m, at)
            }
        })
}

/// The worst element of `got` against `want` as a multiple of its allowance: `ulps` ulp of `ty`
/// at the larger magnitude of the pair, or `rel` of `scale`, whichever is larger (NaN in `got`
/// is infinitely bad). Returns `(excess, index)`: the pair passes while the excess is at most 1.
pub fn worst_excess(
    got: &[f32],
    want: &[f32],
    ty: Ty,
    ulps: f32,
    rel: f32,
    scale: f32,
) -> (f32, usize) {
    let (mut worst, mut at) = (0f32, 0);
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        let allowed = (ulps * ty.ulp(a.abs().max(b.abs()))).max(rel * scale);
        let excess = if a.is_nan() {
            f32::INFINITY
        } else {
            (a - b).abs() / allowed
        };
        if excess > worst {
            (worst, at) = (excess, i);
        }
    }
    (worst, at)
}

/// ‖got − want‖ / ‖want‖ over all elements, in f64 (NaN when `got` has a NaN).
pub fn rel_l2(got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.dims(), want.dims());
    let (a, b) = (values(got), values(want));
    if a.iter().any(|x| x.is_nan()) {
        return f32::NAN;
    }
    let num: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt() as f32
}

/// Asserts that a relative error `err` is within `tol`, and prints both.
pub fn assert_rel_err(what: &str, err: f32, tol: f32) {
    eprintln!("{what}: rel err {err:.2e} (tol {tol:.0e})");
    assert!(err <= tol, "{what}: rel err {err:e} > {tol:e}");
}
