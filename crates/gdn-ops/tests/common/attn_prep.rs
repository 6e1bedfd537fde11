//! `attn_prep`'s cases, run by every backend's test alike: the CPU twin against the composed
//! path (tests/attn_prep.rs), the Metal kernel in emulation (tests/attn_prep_emulation.rs) and
//! the CUDA kernel (tests/cuda_attn_prep.rs): one list of shapes, one input generator, and the
//! kernels' gate against the twin.

use super::compare::close;
use super::dtype::Ty;
use super::random::Rng;

super::shape_and_constructor! {
    /// One decode token per sequence at position `pos` of KV buffers of `capacity` slots.
    ///
    /// `shape` takes (B, Nq, Nkv, Dh, R, cap, pos).
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub struct Shape {
        pub batch: usize,
        pub q_heads: usize,
        pub kv_heads: usize,
        pub head_dim: usize,
        /// R, the rotated dims at the front of each head (0: no rotation).
        pub rope_dims: usize,
        pub capacity: usize,
        pub pos: usize,
    }
}

/// Every backend's cases.
pub fn cases() -> Vec<Shape> {
    vec![
        // Qwen3-Next-80B-A3B: Nq = 16, Nkv = 2, Dh = 256, R = 64; the first position, ones
        // inside the buffer, its last slot, and a long-context one.
        shape(1, 16, 2, 256, 64, 256, 0),
        shape(1, 16, 2, 256, 64, 256, 137),
        shape(1, 16, 2, 256, 64, 256, 255),
        shape(1, 16, 2, 256, 64, 4096, 4000),
        // Qwen3.8-Flash-Next's release: Nq = 24, Nkv = 2 (GQA ratio 12), R = 64.
        shape(1, 24, 2, 256, 64, 512, 301),
        // pos ≥ cap: nothing is written to the KV buffers.
        shape(1, 4, 2, 256, 64, 8, 8),
        // Full rotation, a rotated half not a multiple of 32 lanes, Dh not a multiple of 32,
        // no rotation, several sequences, GQA ratio 1 and 16.
        shape(2, 4, 4, 64, 64, 16, 5),
        shape(3, 6, 2, 128, 32, 8, 7),
        shape(2, 2, 1, 96, 48, 4, 3),
        shape(1, 4, 2, 64, 0, 4, 1),
        shape(1, 16, 1, 128, 64, 4, 2),
        shape(1, 16, 2, 256, 64, 256, 200),
        shape(1, 16, 2, 256, 64, 512, 0),
        shape(1, 16, 2, 256, 64, 512, 301),
        shape(1, 16, 2, 256, 64, 512, 511),
        shape(3, 4, 2, 64, 64, 16, 7),
    ]
}

/// The inputs' seed of case `i` of [`cases`] at `ty`: the same on every backend.
pub fn seed(i: usize, ty: Ty) -> u64 {
    super::random::case_seed(104_729, i, ty.code() as u64)
}

/// `theta^(-2i/R)` for `i < R/2` with Qwen3-Next's theta 1e7, as f32 (computed in f64 as the
/// model's tables are).
pub fn inv_freq(rope_dims: usize) -> Vec<f32> {
    (0..rope_dims / 2)
        .map(|i| 10_000_000f64.powf(-((2 * i) as f64) / rope_dims as f64) as f32)
        .collect()
}

/// One case's inputs as values rounded to the activation type: the token's `[B, (2Nq +
/// 2Nkv)·Dh]` projection, the q and k norm weights, and the KV buffers `[B, Nkv, cap, Dh]`.
pub struct Inputs {
    pub qkv: Vec<f32>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

pub fn inputs(s: Shape, ty: Ty, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let width = (2 * s.q_heads + 2 * s.kv_heads) * s.head_dim;
    let kv_len = s.batch * s.kv_heads * s.capacity * s.head_dim;
    Inputs {
        qkv: rng.values(s.batch * width, -3.0, 3.0, ty),
        q_norm: rng.values(s.head_dim, 0.5, 1.5, ty),
        k_norm: rng.values(s.head_dim, 0.5, 1.5, ty),
        keys: rng.values(kv_len, -1.0, 1.0, ty),
        values: rng.values(kv_len, -1.0, 1.0, ty),
    }
}

/// A kernel's outputs against the twin's, as `[q, gate, keys, values]` (the KV buffers
/// whole): gate and values bit for bit; q and keys within 1 ulp of InT plus 1e-5 of max |ref|
/// (the kernels' rsqrt and sin/cos differ from the CPU's by a few f32 ulp). The first miss.
pub fn kernel_gate(ty: Ty, got: [&[f32]; 4], want: [&[f32]; 4]) -> Option<String> {
    close("q", got[0], want[0], ty, 1.0, 1e-5)
        .or_else(|| close("gate", got[1], want[1], ty, 0.0, 0.0))
        .or_else(|| close("keys", got[2], want[2], ty, 1.0, 1e-5))
        .or_else(|| close("values", got[3], want[3], ty, 0.0, 0.0))
}
