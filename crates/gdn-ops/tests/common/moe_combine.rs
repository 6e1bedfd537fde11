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

const fn decode(tokens: usize, slots: usize, hidden: usize, norm: bool) -> Case {
    Case {
        tokens,
        slots,
        hidden,
        form: Form::Decode { norm },
    }
}

const fn rows(tokens: usize, slots: usize, hidden: usize, spare: usize) -> Case {
    Case {
        tokens,
        slots,
        hidden,
        form: Form::Rows { spare },
    }
}

/// The most expert-output values (`N·S·H`) a case may have for the emulation: Qwen3-Next's
/// 2048-token prefill chunk is the CPU twin's and the CUDA test's alone.
pub const EMULATION_MAX_VALUES: usize = 200_000;

/// Every backend's cases, at every dtype.
pub fn cases() -> Vec<Case> {
    vec![
        // Qwen3-Next-80B: H = 2048, k = 10 routed + the shared slot.
        decode(1, 11, 2048, true),
        decode(2, 11, 2048, true),
        // H not a multiple of 32; one slot; no norm; a wider H.
        decode(3, 9, 200, true),
        decode(1, 1, 77, true),
        decode(2, 1, 77, true),
        decode(3, 1, 77, true),
        decode(4, 9, 256, true),
        decode(4, 5, 256, false),
        decode(3, 5, 200, false),
        decode(1, 3, 16, false),
        decode(4, 9, 4096, true),
        // Wider than a threadgroup's registers (4 × 512 columns): the columns in turns.
        decode(1, 2, 2100, true),
        // The prefill form: a permutation of the pairs, with and without spare rows; Qwen3-Next's
        // prefill chunk (2048 tokens, 10 routed + the shared slot).
        rows(3, 11, 2048, 0),
        rows(7, 4, 200, 5),
        rows(37, 11, 256, 0),
        rows(37, 9, 200, 5),
        rows(5, 3, 77, 4),
        rows(1, 1, 8, 0),
        rows(1, 1, 77, 0),
        rows(2048, 11, 2048, 0),
    ]
}

/// The inputs' seed of case `i` of [`cases`] in `dtype`: the same on every backend.
pub fn seed(i: usize, dtype: DType) -> u64 {
    let code = [DType::F32, DType::F16, DType::BF16]
        .iter()
        .position(|&d| d == dtype)
        .expect("an activation dtype") as u64;
    (i as u64 * 3 + code + 1) * 7_919
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
                let rows =
                    Tensor::from_vec(order[..n * s].to_vec(), (n, s), &Device::Cpu).unwrap();
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
