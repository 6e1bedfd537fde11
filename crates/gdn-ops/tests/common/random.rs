//! Reproducible random inputs without a dependency: the same values everywhere.

use super::dtype::Ty;
use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::affine::{pack_row, AffineMatrix};

/// The generator behind an [`Rng`]; each test keeps the one its inputs were tuned with.
#[derive(Clone, Copy, Debug)]
enum Gen {
    /// splitmix64.
    SplitMix,
    /// xorshift64*.
    XorShift,
    /// The 64-bit LCG of Knuth's MMIX.
    Lcg,
}

pub struct Rng {
    state: u64,
    gen: Gen,
}

impl Rng {
    /// splitmix64 from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed,
            gen: Gen::SplitMix,
        }
    }
    /// xorshift64* from `seed` (not 0).
    pub fn xorshift(seed: u64) -> Self {
        Self {
            state: seed,
            gen: Gen::XorShift,
        }
    }
    /// The MMIX LCG from `seed`.
    pub fn lcg(seed: u64) -> Self {
        Self {
            state: seed,
            gen: Gen::Lcg,
        }
    }
    pub fn next(&mut self) -> u64 {
        match self.gen {
            Gen::SplitMix => {
                self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = self.state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^ (z >> 31)
            }
            Gen::XorShift => {
                self.state ^= self.state >> 12;
                self.state ^= self.state << 25;
                self.state ^= self.state >> 27;
                self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
            }
            Gen::Lcg => {
                self.state = self
                    .state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                self.state
            }
        }
    }
    /// A value in `[lo, hi)` from the top 24 bits.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
    /// A value in `[lo, hi)`, negated half the time.
    pub fn signed(&mut self, lo: f32, hi: f32) -> f32 {
        let x = self.uniform(lo, hi);
        if self.next() & 1 == 0 {
            x
        } else {
            -x
        }
    }
    /// An index below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// `n` values in `[lo, hi)`, rounded to `ty`.
    pub fn values(&mut self, n: usize, lo: f32, hi: f32, ty: Ty) -> Vec<f32> {
        (0..n).map(|_| ty.round(self.uniform(lo, hi))).collect()
    }
    /// A CPU f32 tensor of `shape` with values in `[lo, hi)`.
    pub fn tensor(&mut self, shape: &[usize], lo: f32, hi: f32) -> Tensor {
        self.tensor_as(shape, lo, hi, DType::F32)
    }
    /// A CPU tensor of `shape` with values in `[lo, hi)`, drawn in f32 and converted to `dtype`.
    pub fn tensor_as(&mut self, shape: &[usize], lo: f32, hi: f32, dtype: DType) -> Tensor {
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| self.uniform(lo, hi)).collect();
        Tensor::from_vec(v, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    }
}

/// The inputs' seed of case `i` of an op's list in its `variant` (a type code, say), the same
/// on every backend: `(i + 1)·step + variant`.
pub fn case_seed(step: u64, i: usize, variant: u64) -> u64 {
    (i as u64 + 1) * step + variant
}

/// Case seeds `step`, `2·step`, `3·step`, ...: one a call, so that each case of a list has
/// its own inputs and adding a case at the end changes no other.
pub fn seeds(step: u64) -> impl FnMut() -> u64 {
    let mut seed = 0u64;
    move || {
        seed += 1;
        seed * step
    }
}

/// A random stack of `experts` `[rows, cols]` matrices quantized as MLX quantizes (a group's
/// bias its minimum, its scale its range over the levels, negative scales too: weights of
/// about ±0.1), scales and biases stored in `scale_dtype` as a checkpoint stores them.
pub fn random_matrix(
    rng: &mut Rng,
    bits: usize,
    group: usize,
    shape: [usize; 3],
    scale_dtype: DType,
) -> AffineMatrix {
    scaled_matrix(rng, bits, group, shape, scale_dtype, None)
}

/// As [`random_matrix`], every |scale| in `[s/2, s]` for `scale_mag` `Some(s)` (biases of the
/// same order as `s·q`).
pub fn scaled_matrix(
    rng: &mut Rng,
    bits: usize,
    group: usize,
    [experts, rows, cols]: [usize; 3],
    scale_dtype: DType,
    scale_mag: Option<f32>,
) -> AffineMatrix {
    let n = experts * rows;
    let levels = (1u32 << bits) - 1;
    let q: Vec<u32> = (0..n * cols)
        .map(|_| (rng.next() % (levels as u64 + 1)) as u32)
        .collect();
    let words: Vec<u32> = q.chunks(cols).flat_map(|row| pack_row(row, bits)).collect();
    let groups = n * cols / group;
    let (mut scales, mut biases) = (Vec::with_capacity(groups), Vec::with_capacity(groups));
    for _ in 0..groups {
        // w spans about [bias, bias + scale·levels].
        let mag = scale_mag.unwrap_or(0.2 / levels as f32);
        let scale = rng.signed(0.5 * mag, mag);
        scales.push(scale);
        biases.push(-scale * levels as f32 * rng.uniform(0.3, 0.7));
    }
    let shape = [experts, rows, cols];
    match scale_dtype {
        DType::BF16 => {
            let to = |v: &[f32]| -> Vec<half::bf16> {
                v.iter().map(|&x| half::bf16::from_f32(x)).collect()
            };
            AffineMatrix::new(bits, group, shape, words, to(&scales), to(&biases))
        }
        DType::F16 => {
            let to = |v: &[f32]| -> Vec<half::f16> {
                v.iter().map(|&x| half::f16::from_f32(x)).collect()
            };
            AffineMatrix::new(bits, group, shape, words, to(&scales), to(&biases))
        }
        _ => AffineMatrix::new(bits, group, shape, words, scales, biases),
    }
    .unwrap()
}
