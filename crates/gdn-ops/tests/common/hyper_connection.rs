//! The hyper-connection kernels' cases, run by every backend's test alike: the CPU twin
//! against the composed candle ops it replaces (tests/hyper_connection.rs), the Metal kernels
//! in emulation (tests/hyper_connection_emulation.rs) and the CUDA kernels
//! (tests/cuda_hyper_connection.rs): one list of shapes, one input generator.

use super::dtype::Ty;
use super::random::Rng;

/// `(tokens N, streams S, H)`: Qwen3.8-Flash-Next's release (4 streams of 2560) and the tiny
/// fixture's (4 of 64) as a decode step passes them, a prefill chunk, the widest stream
/// (8192), streams not a multiple of 32 wide, one stream, one column.
pub fn cases() -> Vec<(usize, usize, usize)> {
    vec![
        (1, 4, 2560),
        (1, 4, 64),
        (5, 4, 64),
        (2, 3, 200),
        (1, 2, 8192),
        (3, 2, 33),
        (1, 1, 100),
        (2, 4, 1),
    ]
}

/// The inputs' seed of case `i` at `ty`: the same on every backend.
pub fn seed(i: usize, ty: Ty) -> u64 {
    super::random::case_seed(40_961, i, ty.code() as u64)
}

/// One case's inputs as values rounded to `ty` (the norm weight stays f32, as the model keeps
/// it): the streams `hs` and a block output `y` in [-4, 4), the injection gate logits `[N, S]`
/// in [-8, 8), the norm weight `[S, H]` around 1, the up product's logits `[N, S·H]` in
/// [-6, 6), normed streams in [-3, 3), and a down product's output `[N, R]` (R = H here) in
/// [-12, 12) for the low-rank activation.
pub struct Inputs {
    pub hs: Vec<f32>,
    pub y: Vec<f32>,
    pub gate: Vec<f32>,
    pub weight: Vec<f32>,
    pub up: Vec<f32>,
    pub normed: Vec<f32>,
    pub down: Vec<f32>,
}

pub fn inputs((n, s, h): (usize, usize, usize), ty: Ty, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    Inputs {
        hs: rng.values(n * s * h, -4.0, 4.0, ty),
        y: rng.values(n * h, -4.0, 4.0, ty),
        gate: rng.values(n * s, -8.0, 8.0, ty),
        weight: rng.values(s * h, 0.5, 1.5, Ty::F32),
        up: rng.values(n * s * h, -6.0, 6.0, ty),
        normed: rng.values(n * s * h, -3.0, 3.0, ty),
        down: rng.values(n * h, -12.0, 12.0, ty),
    }
}

/// What `hc_inject_norm` is asked for: an injection, a norm, or both.
pub const FORMS: [(bool, bool); 3] = [(true, true), (true, false), (false, true)];

/// Each case at each type: `(case index, shape, ty)`.
pub fn runs(types: &[Ty]) -> Vec<(usize, (usize, usize, usize), Ty)> {
    let mut out = vec![];
    for (i, shape) in cases().into_iter().enumerate() {
        for &ty in types {
            out.push((i, shape, ty));
        }
    }
    out
}
