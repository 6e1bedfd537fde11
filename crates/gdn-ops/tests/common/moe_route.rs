//! `moe_route`'s cases, run by every backend's test alike: the CPU twin against the composed
//! router (tests/moe_route.rs), the Metal kernel in emulation (tests/moe_route_emulation.rs) and
//! the CUDA kernel (tests/cuda_moe.rs): one list of router shapes, one logits generator.

use super::random::Rng;
use candle_core::{DType, Device, Tensor};

/// `tokens` rows of `experts` router logits (plus the shared expert's gate when `has_shared`),
/// the top `top_k` taken.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    pub tokens: usize,
    pub experts: usize,
    pub top_k: usize,
    pub renormalise: bool,
    pub has_shared: bool,
    /// Logits drawn from this many distinct values (exact ties), or continuous when 0.
    pub levels: u64,
}

const fn case(
    tokens: usize,
    experts: usize,
    top_k: usize,
    renormalise: bool,
    has_shared: bool,
    levels: u64,
) -> Case {
    Case {
        tokens,
        experts,
        top_k,
        renormalise,
        has_shared,
        levels,
    }
}

/// Every backend's cases, at every dtype.
pub fn cases() -> Vec<Case> {
    vec![
        // Qwen3-Next-80B / Qwen3.5-397B, Qwen3.5-35B-A3B.
        case(4, 512, 10, true, true, 0),
        case(1, 256, 8, true, true, 0),
        case(3, 256, 8, true, true, 0),
        // Without the shared slot, without renormalisation.
        case(3, 128, 8, false, false, 0),
        case(2, 64, 4, false, false, 0),
        // E not a multiple of 32; k = 32 (every lane a slot); k = E.
        case(2, 37, 5, true, false, 0),
        case(3, 37, 32, false, false, 0),
        case(1, 37, 32, false, true, 0),
        case(2, 40, 32, false, true, 0),
        case(1, 7, 7, true, true, 0),
        case(2, 7, 7, true, true, 0),
        case(2, 5, 5, true, false, 0),
        case(1, 1, 1, false, true, 0),
        // Many exact ties: the lower index first.
        case(4, 512, 10, false, true, 3),
        case(2, 64, 20, true, false, 2),
        // Every logit equal (every expert a candidate of the block body), and ties at the top
        // of the real shapes, one not a multiple of 32.
        case(2, 512, 10, true, true, 1),
        case(3, 256, 8, true, true, 12),
        case(2, 100, 10, true, false, 4),
    ]
}

/// The logits' seed of case `i` of [`cases`] in `dtype`: the same on every backend.
pub fn seed(i: usize, dtype: DType) -> u64 {
    super::random::case_seed(104_729, i, super::dtype::Ty::of(dtype).code() as u64)
}

impl Case {
    /// This case's `[tokens, experts + has_shared]` logits in `dtype`, as case `i` of
    /// [`cases`]: uniform in [-6, 6), or from `levels` values half a unit apart.
    pub fn logits(&self, i: usize, dtype: DType) -> Tensor {
        let mut rng = Rng::new(seed(i, dtype));
        let width = self.experts + self.has_shared as usize;
        let v: Vec<f32> = (0..self.tokens * width)
            .map(|_| match self.levels {
                0 => rng.uniform(-6.0, 6.0),
                l => (rng.next() % l) as f32 * 0.5 - 2.0,
            })
            .collect();
        Tensor::from_vec(v, (self.tokens, width), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    }
}
