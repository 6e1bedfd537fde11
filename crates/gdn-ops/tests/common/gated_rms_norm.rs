//! `gated_rms_norm`'s cases, run by every backend's test alike: the CPU twin against the
//! composed path (tests/gated_rms_norm.rs), the Metal kernel in emulation
//! (tests/gated_rms_norm_emulation.rs) and the CUDA kernel (tests/cuda_gated_rms_norm.rs). Each
//! backend keeps its own gate; the shapes and the projection-slice inputs are here once.

use super::random::Rng;
use candle_core::{DType, Tensor};

super::shape_and_constructor! {
    /// y `[B, T, Hv, Dv]`, and the gap between z's tokens where z is a strided view.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub struct Shape {
        pub b: usize,
        pub t: usize,
        pub hv: usize,
        pub dv: usize,
        /// Elements between two tokens' z rows in the emulation's strided z (NaN there).
        pub z_gap: usize,
    }
}

/// Every backend's cases: Qwen3-Next decode (z a slice of the merged projection), prefill,
/// Qwen3.5's 48 value heads; Dv not a multiple of 32, below 32, above 256; 3 and 7 rows
/// (partial threadgroups).
pub fn cases() -> Vec<Shape> {
    vec![
        shape(1, 1, 32, 128, 8192 + 64),
        shape(2, 1, 32, 128, 40),
        shape(1, 5, 48, 128, 96),
        shape(1, 1, 3, 100, 0),
        shape(1, 7, 1, 20, 3),
        shape(2, 2, 2, 300, 1),
        shape(4, 1, 64, 128, 16),
        shape(1, 37, 48, 128, 5),
        shape(2, 3, 3, 100, 2),
        shape(1, 5, 1, 20, 7),
        shape(2, 5, 6, 64, 4),
        shape(1, 3, 2, 100, 1),
        shape(1, 9, 4, 128, 0),
    ]
}

/// y `[B, T, Hv, Dv]` in [-3, 3), z as the `[B, T, Hv·Dv]` slice of a wider projection
/// `[B, T, 3·Hv·Dv + 7]` in [-8, 8) (as the model passes it), and a weight around 1
/// (checkpoint weights are `1 + w`), drawn from `rng` in that order, in `dtype`.
pub fn projection_inputs(
    rng: &mut Rng,
    (b, t, hv, dv): (usize, usize, usize, usize),
    dtype: DType,
) -> [Tensor; 3] {
    let y = rng
        .tensor(&[b, t, hv, dv], -3.0, 3.0)
        .to_dtype(dtype)
        .unwrap();
    let proj = rng
        .tensor(&[b, t, 3 * hv * dv + 7], -8.0, 8.0)
        .to_dtype(dtype)
        .unwrap();
    let z = proj.narrow(2, hv * dv + 3, hv * dv).unwrap();
    let w = rng.tensor(&[dv], 0.5, 1.5).to_dtype(dtype).unwrap();
    [y, z, w]
}

impl Shape {
    /// (B, T, Hv, Dv).
    pub fn dims(&self) -> (usize, usize, usize, usize) {
        (self.b, self.t, self.hv, self.dv)
    }
}
