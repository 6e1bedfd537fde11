//! `moe_combine`'s cases, run by every backend's test alike: the CPU twin against the composed
//! path (tests/moe_combine.rs), the Metal kernel in emulation (tests/moe_combine_emulation.rs)
//! and the CUDA kernel (tests/cuda_moe.rs), in both forms: the decode step's (slots in order,
//! residual, norm) and the prefill's (`moe_combine_rows`: rows read through a permutation).

use super::random::Rng;
use candle_core::{DType, Device, Tensor};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Form {
    /// `down [N, S, H]` in slot order, a residual, and an RMSNorm when `norm`.
    Decode { norm: bool },
    /// `tokens · slots` expert outputs in a random (grouped) order read through `rows`, plus
    /// `spare` rows no slot names; no residual, no norm.
    Rows { spare: usize },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    pub tokens: usize,
    pub slots: usize,
    pub hidden: usize,
    pub form: Form,
}

const fn case(tokens: usize, slots: usize, hidden: usize, form: Form) -> Case {
    Case {
        tokens,
        slots,
        hidden,
        form,
    }
}

/// The most expert-output values (`N·S·H`) a case may have for the emulation: Qwen3-Next's
/// 2048-token prefill chunk is the CPU twin's and the CUDA test's alone.
pub const EMULATION_MAX_VALUES: usize = 200_000;

/// Every backend's cases, at every dtype.
pub fn cases() -> Vec<Case> {
    use Form::{Decode, Rows};
    vec![
        // Qwen3-Next-80B: H = 2048, k = 10 routed + the shared slot.
        case(1, 11, 2048, Decode { norm: true }),
        case(2, 11, 2048, Decode { norm: true }),
        // H not a multiple of 32; one slot; no norm; a wider H.
        case(3, 9, 200, Decode { norm: true }),
        case(1, 1, 77, Decode { norm: true }),
        case(2, 1, 77, Decode { norm: true }),
        case(3, 1, 77, Decode { norm: true }),
        case(4, 9, 256, Decode { norm: true }),
        case(4, 5, 256, Decode { norm: false }),
        case(3, 5, 200, Decode { norm: false }),
        case(1, 3, 16, Decode { norm: false }),
        case(4, 9, 4096, Decode { norm: true }),
        // Wider than a threadgroup's registers (4 × 512 columns): the columns in turns.
        case(1, 2, 2100, Decode { norm: true }),
        // The prefill form: a permutation of the pairs, with and without spare rows; Qwen3-Next's
        // prefill chunk (2048 tokens, 10 routed + the shared slot).
        case(3, 11, 2048, Rows { spare: 0 }),
        case(7, 4, 200, Rows { spare: 5 }),
        case(37, 11, 256, Rows { spare: 0 }),
        case(37, 9, 200, Rows { spare: 5 }),
        case(5, 3, 77, Rows { spare: 4 }),
        case(1, 1, 8, Rows { spare: 0 }),
        case(1, 1, 77, Rows { spare: 0 }),
        case(2048, 11, 2048, Rows { spare: 0 }),
        // A token's cluster on CUDA with a block past the last column (H = 5 over 4 blocks of
        // 2 columns): it still takes part in the norm's cluster barrier.
        case(1, 3, 5, Decode { norm: true }),
    ]
}

/// The inputs' seed of case `i` of [`cases`] in `dtype`: the same on every backend.
pub fn seed(i: usize, dtype: DType) -> u64 {
    super::random::case_seed(7_919, i, super::dtype::Ty::of(dtype).code() as u64)
}

/// One case's inputs on the CPU, `down` and the residual and norm weight in the activation
/// dtype, the routing weights f32.
pub struct Inputs {
    /// `[N, S, H]`, or `[N·S + spare, H]` read through `rows`.
    pub down: Tensor,
    /// `[N, S]` u32: the prefill form's row of each slot in `down`.
    pub rows: Option<Tensor>,
    /// `[N, S]` in [0, 0.5).
    pub weights: Tensor,
    /// `[N, H]`: the decode form's.
    pub residual: Option<Tensor>,
    /// `[H]` around 1: the decode form's, with a norm.
    pub norm_weight: Option<Tensor>,
}

/// A random permutation of `0..n`.
fn permutation(rng: &mut Rng, n: usize) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        p.swap(i, rng.below(i + 1));
    }
    p
}

impl Case {
    /// This case's inputs in `dtype`, as case `i` of [`cases`].
    pub fn inputs(&self, i: usize, dtype: DType) -> Inputs {
        let mut rng = Rng::new(seed(i, dtype));
        let (n, s, h) = (self.tokens, self.slots, self.hidden);
        match self.form {
            Form::Decode { norm } => Inputs {
                down: rng.tensor_as(&[n, s, h], -2.0, 2.0, dtype),
                rows: None,
                weights: rng.tensor_as(&[n, s], 0.0, 0.5, DType::F32),
                residual: Some(rng.tensor_as(&[n, h], -4.0, 4.0, dtype)),
                norm_weight: norm.then(|| rng.tensor_as(&[h], 0.5, 1.5, dtype)),
            },
            Form::Rows { spare } => {
                let order = permutation(&mut rng, n * s + spare);
                let rows = Tensor::from_vec(order[..n * s].to_vec(), (n, s), &Device::Cpu).unwrap();
                Inputs {
                    down: rng.tensor_as(&[n * s + spare, h], -2.0, 2.0, dtype),
                    rows: Some(rows),
                    weights: rng.tensor_as(&[n, s], 0.0, 0.5, DType::F32),
                    residual: None,
                    norm_weight: None,
                }
            }
        }
    }
}
