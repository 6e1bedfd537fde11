//! `add_rms_norm`'s cases, run by every backend's test alike: the CPU twin against the composed
//! path (tests/add_rms_norm.rs), the Metal kernel in emulation (tests/add_rms_norm_emulation.rs)
//! and the CUDA kernel (tests/cuda_add_rms_norm.rs): one list of shapes, one input generator.

use super::dtype::Ty;
use super::random::Rng;

/// Every backend's cases, as the residual's shape `[.., H]`: Qwen3-Next-80B-A3B (H = 2048) as
/// the model passes a decode token (`[B, S, H]`) and a prefill chunk, the widest row (8192),
/// rows not a multiple of 32 wide, one column.
pub fn cases() -> Vec<&'static [usize]> {
    vec![
        &[1, 1, 2048],
        &[3, 200],
        &[2, 8192],
        &[5, 1],
        &[4, 1],
        &[64, 2048],
        &[5, 64],
        &[2, 33],
        &[1, 2600],
    ]
}

/// (rows, H) of a case's shape.
pub fn rows_cols(shape: &[usize]) -> (usize, usize) {
    let cols = *shape.last().unwrap();
    (shape.iter().product::<usize>() / cols, cols)
}

/// The inputs' seed of case `i` of [`cases`] at `ty`: the same on every backend.
pub fn seed(i: usize, ty: Ty) -> u64 {
    super::random::case_seed(7919, i, ty.code() as u64)
}

/// One case's inputs as values rounded to `ty`: the residual and the delta (`rows·H`, in
/// [-4, 4)) and the weight (`H`, around 1).
pub struct Inputs {
    pub residual: Vec<f32>,
    pub delta: Vec<f32>,
    pub weight: Vec<f32>,
}

pub fn inputs(shape: &[usize], ty: Ty, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let (rows, cols) = rows_cols(shape);
    Inputs {
        residual: rng.values(rows * cols, -4.0, 4.0, ty),
        delta: rng.values(rows * cols, -4.0, 4.0, ty),
        weight: rng.values(cols, 0.5, 1.5, ty),
    }
}

/// Each case at each type and with and without a delta: `(case index, shape, ty, delta)`.
pub fn runs(types: &[Ty]) -> Vec<(usize, &'static [usize], Ty, bool)> {
    let mut out = vec![];
    for (i, shape) in cases().into_iter().enumerate() {
        for &ty in types {
            for delta in [true, false] {
                out.push((i, shape, ty, delta));
            }
        }
    }
    out
}
