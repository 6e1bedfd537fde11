//! `gated_delta_norm`'s cases, run by every backend's test alike: the CPU twin against the
//! two-op path (tests/gated_delta_norm.rs), the Metal kernel in emulation
//! (tests/gated_delta_norm_emulation.rs) and the CUDA kernel (tests/cuda_gated_delta_norm.rs).
//! Each backend keeps its own gate; the shapes and the tensor inputs the CPU and CUDA tests
//! draw are here once (the emulation draws the harness's values with
//! [`super::gated_delta::gdn_inputs`]).

use super::gated_delta::GdnDims;
use super::random::Rng;
use candle_core::{DType, Tensor};

/// A case: the recurrence's dims, and the simdgroups the emulation launches (the Metal host
/// picks them from Dv; the cases also try counts it does not pick).
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub d: GdnDims,
    /// 1 to 32, each owning at most 8 of Dv's rows.
    pub simdgroups: usize,
}

const fn shape(
    b: usize,
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    simdgroups: usize,
) -> Shape {
    Shape {
        d: GdnDims::new(b, t, hk, hv, dk, dv),
        simdgroups,
    }
}

/// Every backend's cases: Qwen3-Next-80B-A3B decode (32 simdgroups of 4 rows) and batched
/// decode; prefills, GQA 1 to 8; 8 rows per simdgroup; Dk 32 to 256; Dv not a multiple of the
/// simdgroups (some own 6 rows, some 7), Dv 20 to 256; an odd count of simdgroups (threadgroup
/// memory rounded up to 16 bytes); Dv not a multiple of 4; Qwen3.8-Flash-Next's release
/// decode (16 key heads, 48 value heads: GQA 3).
pub fn cases() -> Vec<Shape> {
    vec![
        shape(1, 1, 16, 32, 128, 128, 32),
        shape(1, 1, 16, 48, 128, 128, 32),
        shape(2, 5, 2, 4, 64, 64, 16),
        shape(1, 3, 1, 2, 256, 64, 8),
        shape(1, 4, 1, 3, 32, 100, 16),
        shape(2, 2, 1, 1, 96, 40, 5),
        shape(4, 1, 16, 64, 128, 128, 32),
        shape(1, 37, 4, 8, 128, 128, 16),
        shape(2, 9, 1, 1, 32, 96, 12),
        shape(1, 5, 2, 2, 256, 256, 32),
        shape(2, 3, 1, 3, 64, 20, 4),
        shape(2, 7, 2, 4, 64, 96, 24),
        shape(1, 3, 1, 2, 32, 20, 3),
        shape(2, 1, 16, 32, 128, 128, 32),
        shape(1, 5, 2, 4, 64, 64, 8),
        // Dv not a multiple of 4: CUDA's one-block-a-head kernel (the others take its cluster
        // kernel, a quarter of the rows a block).
        shape(1, 3, 2, 4, 64, 50, 16),
        shape(2, 1, 1, 3, 128, 30, 8),
        // Qwen3-Next-80B's speculative verify pass of 4 tokens (tests/gated_delta_norm_window.rs).
        shape(1, 4, 16, 32, 128, 128, 32),
    ]
}

/// z, the `[B, T, Hv·Dv]` slice of the projection 5 columns past its first `Hv·Dv` (a view,
/// as the model passes it).
pub fn z_of(proj: &Tensor, d: GdnDims) -> Tensor {
    proj.narrow(2, d.hv * d.dv + 5, d.hv * d.dv).unwrap()
}

/// q, k, v, g, beta, state, the projection z is sliced from ([`z_of`]) and the norm weight,
/// drawn from `rng` in that order: q and k uniform in ±1/√Dk, v in ±1, decays in [0.85, 1),
/// beta in [0, 1), the state in ±0.5 (in `st`), the projection in ±6, the weight around 1;
/// all but g, beta and the state in `dtype`.
pub fn norm_tensors(rng: &mut Rng, d: GdnDims, dtype: DType, st: DType) -> [Tensor; 8] {
    let (b, t, hk, hv, dk, dv) = d.tuple();
    let scale = 1.0 / (dk as f64).sqrt();
    let c = |x: Tensor| x.to_dtype(dtype).unwrap();
    [
        c((rng.tensor(&[b, t, hk, dk], -1.0, 1.0) * scale).unwrap()),
        c((rng.tensor(&[b, t, hk, dk], -1.0, 1.0) * scale).unwrap()),
        c(rng.tensor(&[b, t, hv, dv], -1.0, 1.0)),
        rng.tensor(&[b, t, hv], 0.85, 1.0),
        rng.tensor(&[b, t, hv], 0.0, 1.0),
        rng.tensor(&[b, hv, dv, dk], -0.5, 0.5)
            .to_dtype(st)
            .unwrap(),
        c(rng.tensor(&[b, t, 2 * hv * dv + 5], -6.0, 6.0)),
        c(rng.tensor(&[dv], 0.5, 1.5)),
    ]
}
