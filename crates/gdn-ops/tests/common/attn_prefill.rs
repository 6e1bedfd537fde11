//! `attn_prefill`'s cases, run by every backend's test alike: the CPU twin against the composed
//! path (tests/attn_prefill.rs), the CUDA body in emulation (tests/attn_prefill_cuda_emulation.rs)
//! and the CUDA kernel (tests/cuda_attn_prefill.rs). One list of shapes, one input generator,
//! one gate.

use super::dtype::{tensor, Ty};
use super::random::Rng;
use super::{close, values};
use candle_core::{Device, Tensor};

super::shape_and_constructor! {
    /// One chunk of queries over a KV buffer.
    ///
    /// `shape` takes (B, Nq, Nkv, Dh, S, offset, cap).
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub struct Shape {
        pub batch: usize,
        pub q_heads: usize,
        pub kv_heads: usize,
        pub head_dim: usize,
        /// S.
        pub queries: usize,
        /// The position of the first query: the keys cached before the chunk.
        pub offset: usize,
        /// Positions the KV buffers hold (≥ T = offset + S): K and V are views narrowed to T.
        pub capacity: usize,
    }
}

impl Shape {
    /// T, the keys the chunk attends to.
    pub fn keys(&self) -> usize {
        self.offset + self.queries
    }
    /// Multiply-adds of one product, `B·Nq·S·T·Dh`: what a case costs the emulator.
    pub fn work(&self) -> usize {
        self.batch * self.q_heads * self.queries * self.keys() * self.head_dim
    }
}

/// The most work ([`Shape::work`]) a case may have for the emulation test: the emulator runs
/// every lane as a fiber, thousands of times slower than the GPU, so Qwen3-Next's 16 heads on
/// 200-token chunks are the CUDA test's alone.
pub const EMULATION_MAX_WORK: usize = 40_000_000;

/// Every backend's cases: first chunks (T = S) and later ones over cached keys in longer
/// buffers; S below, at and above the 64-row query tile, one query; key counts on and off the
/// 64-key tile; GQA 1, 2 and 8; Dh 16, 64, 128 (a scale that is not a power of two) and 256;
/// batches of 2 and 3; Qwen3-Next's heads (Nq 16, Nkv 2, Dh 256).
pub fn cases() -> Vec<Shape> {
    vec![
        shape(1, 8, 1, 256, 70, 0, 70),
        shape(1, 8, 1, 256, 33, 100, 160),
        shape(2, 4, 2, 64, 100, 37, 140),
        shape(1, 4, 4, 64, 65, 64, 129),
        shape(1, 4, 2, 128, 1, 90, 96),
        shape(1, 2, 1, 16, 17, 5, 22),
        shape(1, 16, 2, 256, 200, 0, 200),
        shape(1, 16, 2, 256, 130, 300, 512),
        shape(1, 16, 2, 256, 1, 77, 128),
        shape(2, 8, 2, 128, 129, 3, 200),
        shape(1, 2, 1, 16, 33, 130, 200),
        // Tile-exact: S and T multiples of 64.
        shape(1, 8, 1, 256, 128, 128, 256),
        shape(3, 2, 1, 256, 64, 0, 64),
        shape(1, 8, 1, 256, 133, 0, 133),
        shape(1, 8, 1, 256, 70, 100, 256),
        shape(1, 4, 2, 64, 100, 37, 160),
        shape(2, 2, 2, 64, 20, 0, 24),
        shape(1, 2, 2, 64, 64, 64, 128),
        shape(2, 4, 2, 128, 65, 3, 80),
    ]
}

/// The inputs' seed of case `i` of [`cases`] at `ty`: the same on every backend.
pub fn seed(i: usize, ty: Ty) -> u64 {
    i as u64 * 101 + ty.code() as u64
}

/// One case's inputs as values rounded to the activation type: q `[B, Nq, S, Dh]`, k and v
/// the whole `[B, Nkv, cap, Dh]` buffers.
pub struct Inputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// Scores of a unit or so (a softmax neither flat nor one-hot), values in [-2, 2).
pub fn inputs(s: Shape, ty: Ty, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let spread = 3.0 / (s.head_dim as f32).powf(0.25);
    let q = rng.values(
        s.batch * s.q_heads * s.queries * s.head_dim,
        -spread,
        spread,
        ty,
    );
    let kv_len = s.batch * s.kv_heads * s.capacity * s.head_dim;
    let k = rng.values(kv_len, -spread, spread, ty);
    let v = rng.values(kv_len, -2.0, 2.0, ty);
    Inputs { q, k, v }
}

impl Inputs {
    /// q, and k and v narrowed to T as the KV cache passes them, on `device` (the buffers are
    /// moved whole, then narrowed there).
    pub fn tensors(&self, s: Shape, ty: Ty, device: &Device) -> [Tensor; 3] {
        let q = tensor(&self.q, &[s.batch, s.q_heads, s.queries, s.head_dim], ty);
        let kv_shape = [s.batch, s.kv_heads, s.capacity, s.head_dim];
        let view = |x: &[f32]| {
            tensor(x, &kv_shape, ty)
                .to_device(device)
                .unwrap()
                .narrow(2, 0, s.keys())
                .unwrap()
        };
        [q.to_device(device).unwrap(), view(&self.k), view(&self.v)]
    }
}

/// The gate: every output within 2 ulp of InT of the reference's plus
/// [`relative_allowance`] of max |reference|; `None` when `got` passes.
pub fn compare(got: &[f32], want: &Tensor, ty: Ty) -> Option<String> {
    close("out", got, &values(want), ty, 2.0, relative_allowance(ty))
}

/// The gate's share of max |reference| beside 2 ulp of InT: the twin, the kernel and the
/// composed path round the same values at the same points, from f32 sums in other orders (the
/// composed path rounds the normalized probabilities, the others the unnormalized ones).
pub fn relative_allowance(ty: Ty) -> f32 {
    match ty {
        Ty::Bf16 => 4e-3,
        Ty::F16 => 1e-3,
        Ty::F32 => 1e-5,
    }
}
