//! `greedy_pick`'s cases, run by every backend's test alike: the CPU twin against the spec
//! (tests/greedy_pick.rs), the Metal kernel and the CUDA bodies in emulation
//! (tests/greedy_pick_emulation.rs) and the CUDA kernel (tests/cuda_greedy_pick.rs): one list of
//! row shapes and value kinds, one logits generator.

use super::random::Rng;
use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::greedy_pick::THREADS;

/// The logits' dtypes, in the harnesses' type-code order.
pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// How a case's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Values {
    /// Uniform in [-8, 8).
    Continuous,
    /// From this many levels: the maximum repeats, across slices too.
    Levels(usize),
    /// Continuous, with the maximum (once) at the last index, in the last slice.
    MaxLast,
    /// Continuous, with this many NaN/±Inf per row, +Inf far above the finite maximum.
    NonFinite(usize),
    /// As `NonFinite`, with the finite maximum at the last index.
    NonFiniteMaxLast(usize),
    /// Every value NaN.
    AllNan,
}

/// `rows` rows of `vocab` logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    pub rows: usize,
    pub vocab: usize,
    pub values: Values,
}

const fn case(rows: usize, vocab: usize, values: Values) -> Case {
    Case {
        rows,
        vocab,
        values,
    }
}

/// The most logits (`rows · vocab`) a case may have for the emulation: the emulator runs every
/// lane as a fiber, so one vocabulary-sized row is the most it takes.
pub const EMULATION_MAX_VALUES: usize = 160_000;

/// Every backend's cases, at every dtype.
pub fn cases() -> Vec<Case> {
    use Values::*;
    vec![
        // Qwen3-Next's vocabulary: 149 blocks of 1020 values; Qwen3.5's; a longer one.
        case(1, 151_936, Continuous),
        case(1, 151_936, MaxLast),
        case(1, 151_936, NonFinite(40)),
        case(1, 248_320, Continuous),
        case(1, 300_007, Continuous),
        // Several rows; odd lengths, lengths around the slices, the block counts and the
        // threads.
        case(3, 1, Continuous),
        case(2, 1, Continuous),
        case(3, 2, Continuous),
        case(3, 31, Continuous),
        case(1, 37, MaxLast),
        case(3, 255, Continuous),
        case(2, THREADS + 1, Continuous),
        case(3, 1023, Continuous),
        case(3, 1025, Continuous),
        case(2, 1025, MaxLast),
        case(3, 4097, Continuous),
        case(3, 5_000, Continuous),
        case(4, 5_000, Continuous),
        // Ties across threads, simdgroups and slices.
        case(4, 7, Levels(3)),
        case(2, 3, Levels(2)),
        case(4, 1000, Levels(3)),
        case(3, 3_001, Levels(5)),
        case(4, 5000, Levels(3)),
        case(3, 9_999, Levels(2)),
        case(2, 20_000, Levels(2)),
        case(1, 151_936, Levels(2)),
        case(4, 151_936, Levels(3)),
        // Non-finite values: counted, never picked; a row of NaN picks 0.
        case(2, 3, NonFinite(2)),
        case(2, 3, NonFiniteMaxLast(5)),
        case(3, 9_999, NonFinite(7)),
        case(3, 9_999, NonFiniteMaxLast(5)),
        case(1, 151_936, NonFiniteMaxLast(5)),
        case(2, 2_500, AllNan),
        case(2, 4_000, AllNan),
    ]
}

/// The logits' seed of case `i` of [`cases`] in `DTYPES[dtype]`: the same on every backend.
pub fn seed(i: usize, dtype: usize) -> u64 {
    super::random::case_seed(7_919, i, dtype as u64)
}

/// `[rows, vocab]` logits of `kind` drawn from `seed`, rounded to `dtype`.
pub fn logits(rows: usize, vocab: usize, kind: Values, dtype: DType, seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    let mut v: Vec<f32> = (0..rows * vocab)
        .map(|_| match kind {
            Values::Levels(l) => rng.below(l) as f32 * 0.5 - 1.0,
            Values::AllNan => f32::NAN,
            _ => rng.uniform(-8.0, 8.0),
        })
        .collect();
    for row in v.chunks_exact_mut(vocab) {
        if let Values::NonFinite(k) | Values::NonFiniteMaxLast(k) = kind {
            for j in 0..k {
                row[rng.below(vocab)] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][j % 3];
            }
        }
        if let Values::MaxLast | Values::NonFiniteMaxLast(_) = kind {
            row[vocab - 1] = 100.0;
        }
    }
    Tensor::from_vec(v, (rows, vocab), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

impl Case {
    /// This case's logits in `DTYPES[dtype]`, as case `i` of [`cases`].
    pub fn logits(&self, i: usize, dtype: usize) -> Tensor {
        logits(
            self.rows,
            self.vocab,
            self.values,
            DTYPES[dtype],
            seed(i, dtype),
        )
    }
}
