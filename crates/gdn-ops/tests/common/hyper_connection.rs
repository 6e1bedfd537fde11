//! The hyper-connection kernels' cases, run by every backend's test alike: the CPU twin
//! against the composed candle ops it replaces (tests/hyper_connection.rs), the Metal kernels
//! in emulation (tests/hyper_connection_emulation.rs) and the CUDA kernels
//! (tests/cuda_hyper_connection.rs): one list of shapes, one input generator.

use super::dtype::Ty;
use super::random::{scaled_matrix, Rng};
use gdn_ops::ops::affine::AffineMatrix;

/// `(tokens N, streams S, H)`: Qwen3.8-Flash-Next's release (4 streams of 2560) and the tiny
/// fixture's (4 of 64) as a decode step passes them, a prefill chunk, the widest stream
/// (8192), streams not a multiple of 32 wide, one stream, one column, and 2 048 and 4 000
/// (the CUDA injection's 1 024 threads a row holding 2 and 4 columns each; 2 560 holds 3,
/// 8 192 8), and 1 100 (a CUDA cluster's block of 138 columns, not whole warps, the last
/// block 134).
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
        (1, 2, 2048),
        (1, 2, 4000),
        (1, 3, 1100),
    ]
}

/// The inputs' seed of case `i` at `ty`: the same on every backend.
pub fn seed(i: usize, ty: Ty) -> u64 {
    super::random::case_seed(40_961, i, ty.code() as u64)
}

/// One case's inputs as values rounded to `ty` (the norm weight stays f32, as the model keeps
/// it): the streams `hs` and a block output `y` in [-4, 4), the injection gate logits `[N, S]`
/// in [-8, 8), the norm weight `[S, H]` around 1, the up product's logits `[N, S·H]` in
/// [-6, 6), normed streams in [-3, 3), a down product's output `[N, R]` (R = H here) in
/// [-12, 12) for the low-rank activation, and a MoE block's [`SLOTS`] slot outputs `[N, K, H]`
/// in [-4, 4) with their f32 weights `[N, K]` in [0, 0.5).
pub struct Inputs {
    pub hs: Vec<f32>,
    pub y: Vec<f32>,
    pub gate: Vec<f32>,
    pub weight: Vec<f32>,
    pub up: Vec<f32>,
    pub normed: Vec<f32>,
    pub down: Vec<f32>,
    pub slot_down: Vec<f32>,
    pub slot_weights: Vec<f32>,
}

/// The slots of the MoE outputs `hc_inject_slots_norm` is tested with: the release's 11 (10
/// routed experts and the shared one), so that the CUDA kernel's slot sum runs both its
/// 4-slots-at-a-time loop and the rest.
pub const SLOTS: usize = 11;

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
        slot_down: rng.values(n * SLOTS * h, -4.0, 4.0, ty),
        slot_weights: rng.values(n * SLOTS, 0.0, 0.5, Ty::F32),
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

/// One `hc_up_mix` case: `N` tokens of `S` streams of `H`, the up matrix `[S·H, R]` at `bits`
/// in groups of `group` with `scales`-typed scales and biases.
#[derive(Debug, Clone, Copy)]
pub struct UpMixCase {
    pub tokens: usize,
    pub streams: usize,
    pub cols: usize,
    pub rank: usize,
    pub bits: usize,
    pub group: usize,
    pub scales: Ty,
}

/// The release's (4 streams of 2560, R = 320, 4-bit g64, bf16 scales), the tiny fixture's (4
/// of 64, R = 64), a prefill chunk at 8 bits with f32 scales and H not a whole block of
/// warps, 2 bits with f16 scales over 3 streams, one stream of 5 columns, a wide rank.
pub fn up_mix_cases() -> Vec<UpMixCase> {
    let case = |tokens, streams, cols, rank, bits, group, scales| UpMixCase {
        tokens,
        streams,
        cols,
        rank,
        bits,
        group,
        scales,
    };
    vec![
        case(1, 4, 2560, 320, 4, 64, Ty::Bf16),
        case(1, 4, 64, 64, 4, 64, Ty::Bf16),
        case(3, 2, 100, 128, 8, 64, Ty::F32),
        case(2, 3, 33, 96, 2, 32, Ty::F16),
        case(1, 1, 5, 64, 4, 32, Ty::F16),
        case(1, 2, 16, 2048, 4, 128, Ty::F32),
    ]
}

/// The inputs' seed of `hc_up_mix` case `i` at `ty`: the same on every backend.
pub fn up_mix_seed(i: usize, ty: Ty) -> u64 {
    super::random::case_seed(40_967, i, ty.code() as u64)
}

/// One `hc_up_mix` case's inputs: the up matrix (weights of about ±0.2), the down product's
/// output `d` `[N, R]` in [-12, 12) and the normed streams `[N, S·H]` in [-3, 3), rounded to
/// `ty`.
pub struct UpMixInputs {
    pub m: AffineMatrix,
    pub d: Vec<f32>,
    pub normed: Vec<f32>,
}

pub fn up_mix_inputs(c: &UpMixCase, ty: Ty, seed: u64) -> UpMixInputs {
    let mut rng = Rng::new(seed);
    let shape = [1, c.streams * c.cols, c.rank];
    let m = scaled_matrix(&mut rng, c.bits, c.group, shape, c.scales.dtype(), None);
    UpMixInputs {
        m,
        d: rng.values(c.tokens * c.rank, -12.0, 12.0, ty),
        normed: rng.values(c.tokens * c.streams * c.cols, -3.0, 3.0, ty),
    }
}

/// Each `hc_up_mix` case at each activation type: `(case index, case, ty)`.
pub fn up_mix_runs(types: &[Ty]) -> Vec<(usize, UpMixCase, Ty)> {
    let mut out = vec![];
    for (i, c) in up_mix_cases().into_iter().enumerate() {
        for &ty in types {
            out.push((i, c, ty));
        }
    }
    out
}
