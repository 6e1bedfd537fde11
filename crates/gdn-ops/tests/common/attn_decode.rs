//! `attn_decode`'s cases, run by every backend's test alike: the CPU twin against the composed
//! path (tests/attn_decode.rs), the Metal kernel and the CUDA bodies in emulation
//! (tests/attn_decode_emulation.rs) and the CUDA kernel (tests/cuda_attn_decode.rs): one list
//! of shapes, one input generator.

use super::dtype::Ty;
use super::random::Rng;
use gdn_ops::ops::attn_decode::{AttnDecodeDims, MAX_SPLITS, SIMDGROUPS, SPLIT_KEYS};

/// One decode query per sequence at position `pos` over KV buffers of `capacity` positions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub pos: usize,
    pub capacity: usize,
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Simdgroups a threadgroup of the emulated Metal kernel runs (the host's [`SIMDGROUPS`],
    /// or fewer).
    pub simdgroups: usize,
    /// Key ranges of the split-K pass (1: the one-pass kernel): the count the host picks from
    /// the capacity, or one forced on the emulated kernels, which take any.
    pub splits: usize,
}

impl Shape {
    /// Multiply-adds of the scores, `B·Nq·(pos + 1)·Dh`: what a case costs the emulator.
    pub fn work(&self) -> usize {
        self.batch * self.q_heads * (self.pos.min(self.capacity - 1) + 1) * self.head_dim
    }
    pub fn dims(&self) -> AttnDecodeDims {
        AttnDecodeDims {
            batch: self.batch,
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            capacity: self.capacity,
        }
    }
}

/// The most work ([`Shape::work`]) a case may have for the emulation and the composed path on
/// the CPU: the long contexts (8k to 64k positions) are the CUDA test's alone.
pub const EMULATION_MAX_WORK: usize = 4_000_000;

/// (B, Nq, Nkv, Dh, cap, pos) with the host's simdgroups and split count.
pub fn shape(
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    pos: usize,
) -> Shape {
    let mut s = Shape {
        batch,
        q_heads,
        kv_heads,
        head_dim,
        capacity,
        pos,
        simdgroups: SIMDGROUPS,
        splits: 1,
    };
    s.splits = s.dims().splits();
    s
}

/// `s` on `simdgroups` simdgroups.
fn on(simdgroups: usize, s: Shape) -> Shape {
    Shape { simdgroups, ..s }
}

/// `s` forced to `splits` key ranges.
fn split(splits: usize, s: Shape) -> Shape {
    Shape { splits, ..s }
}

/// Every backend's cases.
pub fn cases() -> Vec<Shape> {
    vec![
        // Qwen3-Next-80B-A3B: Nq = 16, Nkv = 2, Dh = 256, a few hundred cached positions, the
        // first position, the buffer's last, long contexts (split-K: 16, 32 and 64 ranges).
        shape(1, 16, 2, 256, 512, 300),
        shape(1, 16, 2, 256, 512, 0),
        shape(1, 16, 2, 256, 512, 511),
        shape(1, 16, 2, 256, 256, 0),
        shape(1, 16, 2, 256, 8192, 8000),
        shape(1, 16, 2, 256, 16384, 16000),
        shape(1, 16, 2, 256, 65536, 65000),
        // Qwen3.8-Flash-Next's release: Nq = 24, Nkv = 2 (GQA ratio 12), inside one range and
        // split-K.
        shape(1, 24, 2, 256, 512, 300),
        shape(1, 24, 2, 256, 8192, 8000),
        // The first position (most simdgroups see no key), fewer keys than simdgroups, a
        // count of keys not a multiple of them.
        shape(1, 4, 2, 256, 256, 0),
        shape(1, 4, 1, 128, 8, 5),
        shape(2, 8, 2, 64, 64, 44),
        shape(3, 8, 2, 64, 64, 44),
        // GQA ratios 1 and 16, Dh 32, 64 and 128, several sequences.
        shape(2, 4, 4, 128, 32, 31),
        shape(2, 4, 4, 128, 64, 63),
        shape(2, 4, 4, 64, 32, 17),
        shape(1, 16, 1, 64, 32, 20),
        shape(3, 2, 1, 32, 16, 9),
        // One simdgroup, and 4.
        on(1, shape(1, 4, 2, 256, 64, 40)),
        on(4, shape(1, 4, 2, 128, 64, 63)),
        // pos past the buffer: clamped to its last position.
        shape(1, 2, 1, 64, 16, 40),
        // Split-K: one range at SPLIT_KEYS, two past it (the host's choice), ranges of
        // several hundred keys; the buffers far longer than the context, 3 keys in many ranges.
        shape(1, 4, 2, 128, SPLIT_KEYS, SPLIT_KEYS - 1),
        shape(1, 4, 2, 128, SPLIT_KEYS + 256, 700),
        shape(1, 4, 2, 128, 768, 600),
        shape(2, 8, 2, 64, 1536, 1400),
        shape(1, 4, 1, 64, 1536, 40),
        shape(2, 8, 2, 64, 1536, 3),
        // Forced (emulation): more ranges than keys (empty ranges), the first position, ranges
        // not dividing the keys, pos past the buffer, the most ranges, Dh 256 with 4
        // simdgroups.
        split(8, shape(1, 4, 2, 128, 64, 5)),
        split(3, shape(1, 2, 1, 64, 16, 0)),
        split(7, shape(2, 4, 4, 32, 100, 98)),
        split(5, shape(1, 2, 1, 64, 16, 40)),
        split(MAX_SPLITS, shape(1, 2, 2, 64, 4096, 4000)),
        split(4, on(4, shape(1, 4, 2, 256, 300, 299))),
        // The long-context split passes (16 bytes a lane; the host's from 4 096 positions of
        // capacity on): ranges of 500 keys, 16 batches of four a warp, the last one partial;
        // f32 at Dh 128 over 32 ranges (the op launches them there on CUDA).
        split(4, shape(1, 4, 2, 256, 2048, 2000)),
        shape(1, 4, 2, 128, 8192, 7000),
    ]
}

/// One case's inputs as values rounded to the activation type: q `[B, Nq, Dh]` and gate
/// `[B, Nq·Dh]`, keys and values `[B, Nkv, cap, Dh]`. Scores of a few units: a softmax that is
/// neither flat nor one-hot.
pub struct Inputs {
    pub q: Vec<f32>,
    pub gate: Vec<f32>,
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

pub fn inputs(s: Shape, ty: Ty, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let q_len = s.batch * s.q_heads * s.head_dim;
    let kv_len = s.batch * s.kv_heads * s.capacity * s.head_dim;
    Inputs {
        q: rng.values(q_len, -1.0, 1.0, ty),
        gate: rng.values(q_len, -4.0, 4.0, ty),
        keys: rng.values(kv_len, -1.0, 1.0, ty),
        values: rng.values(kv_len, -2.0, 2.0, ty),
    }
}

impl Inputs {
    /// q, gate, keys and values as CPU tensors of `ty`.
    pub fn tensors(&self, s: Shape, ty: Ty) -> [candle_core::Tensor; 4] {
        use super::dtype::tensor;
        let kv_shape = [s.batch, s.kv_heads, s.capacity, s.head_dim];
        [
            tensor(&self.q, &[s.batch, s.q_heads, s.head_dim], ty),
            tensor(&self.gate, &[s.batch, s.q_heads * s.head_dim], ty),
            tensor(&self.keys, &kv_shape, ty),
            tensor(&self.values, &kv_shape, ty),
        ]
    }
}

/// The inputs' seed of case `i` of [`cases`] at `ty`: the same on every backend.
pub fn seed(i: usize, ty: Ty) -> u64 {
    super::random::case_seed(15_485_863, i, ty.code() as u64)
}
