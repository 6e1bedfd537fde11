//! The second source of a [`super::Checkpoint`]'s bytes: random weights of the real shapes,
//! for benchmarks at full size without a 45–220 GB checkpoint on disk (`qwen-gdn bench
//! --config <config.json> --random-weights`).
//!
//! Nothing here knows a family's tensor list: the loaders ask for each tensor by name and
//! shape as they do from a checkpoint, and [`layout`] says how mlx-lm (mlx-vlm for
//! `qwen4_exp`) would have stored it: quantized as config.json's `quantization` block
//! declares for that module (per-module overrides first; left float where the group size does
//! not divide the width, as mlx's quantizer does), with bf16 scales, biases and floats, except
//! the f32 `A_log` of the families mlx-lm keeps it so (footprint.rs assumes the same layout).
//! The checkpoint then reads these bytes through the very code that reads a file.
//!
//! Values (as scripts/gpu/full_checkpoint.py writes its random checkpoint): packed words
//! uniform; scales and biases that put a dequantized weight in [-0.02, 0.02] at 4 bits,
//! [-0.01, 0.01] at 8 (±0.02 · 4 / bits otherwise); norm weights 1 (0 where the model adds 1:
//! zero-centred norms); `A_log` = ln U(1, 16); `dt_bias` U(0, 1); every other float N(0, 0.02).
//! Each tensor's stream is seeded by (seed, name, 1 MiB chunk), so a run is reproducible
//! whatever the thread count.

use crate::config::{Config, Family, QuantSpec};
use half::bf16;
use rayon::prelude::*;
use safetensors::Dtype;

/// What a tensor's values are drawn from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fill {
    /// Uniform 32-bit words (quantized weights).
    Words,
    Constant(f32),
    Normal {
        std: f32,
    },
    Uniform {
        low: f32,
        high: f32,
    },
    /// ln U(low, high): `A_log`, so that the decay stays in a trained model's range.
    LogUniform {
        low: f32,
        high: f32,
    },
}

/// How a matrix is stored: MLX affine at these bits, or floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixLayout {
    Affine(QuantSpec),
    Float,
}

/// The layout mlx-lm gives the linear (or stacked experts) `module` (canonical name) of
/// width `cols`: the module's own entry in config.json's `quantization` block, else the
/// global one, and float where there is none or its group size does not divide `cols`.
pub fn layout(config: &Config, module: &str, cols: usize) -> MatrixLayout {
    let spec = match config.quant_spec_for(&stored_key(config.family, module)) {
        Some(own) => own,
        None => config.quantization,
    };
    match spec {
        Some(s) if cols.is_multiple_of(s.group_size) && (cols * s.bits).is_multiple_of(32) => {
            MatrixLayout::Affine(s)
        }
        _ => MatrixLayout::Float,
    }
}

/// The key as an mlx conversion spells a canonical name: Qwen3-Next (mlx-lm) keeps `model.*`,
/// Qwen3.5 and `qwen4_exp` (mlx-vlm) prefix the text model with `language_model.`.
pub fn stored_key(family: Family, name: &str) -> String {
    match family {
        Family::Qwen3Next => name.to_string(),
        _ => format!("language_model.{name}"),
    }
}

/// The float dtype a tensor is stored in.
pub fn float_dtype(family: Family, name: &str) -> Dtype {
    if name.ends_with(".A_log") && family != Family::Qwen3Next {
        Dtype::F32
    } else {
        Dtype::BF16
    }
}

/// The fill of the scales and biases of an affine matrix at `bits`: the dequantized weight
/// `scale · q + bias`, q in [0, 2^bits), spans [-r, r].
pub fn group_fills(bits: usize) -> (Fill, Fill) {
    let range = 0.02 * 4.0 / bits as f32;
    let levels = ((1u64 << bits) - 1) as f32;
    (Fill::Constant(2.0 * range / levels), Fill::Constant(-range))
}

/// The fill of a float tensor other than a norm weight, from what its name says it is
/// (`hc_norm`, read as a plain tensor, is a zero-centred norm).
pub fn float_fill(name: &str) -> Fill {
    if name.ends_with(".A_log") {
        Fill::LogUniform {
            low: 1.0,
            high: 16.0,
        }
    } else if name.ends_with(".dt_bias") {
        Fill::Uniform {
            low: 0.0,
            high: 1.0,
        }
    } else if name.ends_with("hc_norm.weight") {
        Fill::Constant(0.0)
    } else {
        Fill::Normal { std: 0.02 }
    }
}

const CHUNK: usize = 1 << 20;

/// SplitMix64: a fast, well-mixed stream from any seed.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// FNV-1a of the name, so that every tensor has its own stream.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// `len` bytes of the tensor `name` stored as `dtype`, drawn from `fill`.
pub fn bytes(seed: u64, name: &str, dtype: Dtype, fill: Fill, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    fill_bytes(seed, name, dtype, fill, &mut out);
    out
}

/// Fills `out` (a whole tensor) in parallel, one 1 MiB chunk per task.
pub fn fill_bytes(seed: u64, name: &str, dtype: Dtype, fill: Fill, out: &mut [u8]) {
    let base = seed ^ name_hash(name);
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng =
                SplitMix(base.wrapping_add((i as u64).wrapping_mul(0xD134_2543_DE82_EF95)));
            match (dtype, fill) {
                (_, Fill::Words) => chunk
                    .chunks_mut(8)
                    .for_each(|c| c.copy_from_slice(&rng.next().to_le_bytes()[..c.len()])),
                (Dtype::F32, _) => chunk
                    .chunks_exact_mut(4)
                    .for_each(|c| c.copy_from_slice(&value(&mut rng, fill).to_le_bytes())),
                (Dtype::BF16, _) => chunk.chunks_exact_mut(2).for_each(|c| {
                    c.copy_from_slice(&bf16::from_f32(value(&mut rng, fill)).to_le_bytes())
                }),
                (other, _) => unreachable!("random floats are f32 or bf16, not {other:?}"),
            }
        });
}

fn value(rng: &mut SplitMix, fill: Fill) -> f32 {
    match fill {
        Fill::Words => unreachable!("words are not floats"),
        Fill::Constant(v) => v,
        Fill::Uniform { low, high } => low + (high - low) * rng.unit(),
        Fill::LogUniform { low, high } => (low + (high - low) * rng.unit()).ln(),
        Fill::Normal { std } => {
            // Box–Muller; 1 - u keeps the logarithm finite.
            let (u, v) = (1.0 - rng.unit(), rng.unit());
            std * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_and_values_in_range() {
        let a = bytes(7, "x", Dtype::F32, Fill::Normal { std: 0.02 }, 4 * 3000);
        assert_eq!(
            a,
            bytes(7, "x", Dtype::F32, Fill::Normal { std: 0.02 }, 4 * 3000)
        );
        assert_ne!(
            a,
            bytes(8, "x", Dtype::F32, Fill::Normal { std: 0.02 }, 4 * 3000)
        );
        let v: Vec<f32> = a
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let std = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        assert!((0.018..0.022).contains(&std), "std {std}");
        let a_log = bytes(1, "l.A_log", Dtype::F32, float_fill("l.A_log"), 400);
        for c in a_log.chunks_exact(4) {
            let x = f32::from_le_bytes(c.try_into().unwrap());
            assert!((0.0..=16f32.ln()).contains(&x), "A_log {x}");
        }
    }

    #[test]
    fn group_params_span_the_documented_range() {
        for (bits, range) in [(4, 0.02f32), (8, 0.01)] {
            let (Fill::Constant(s), Fill::Constant(b)) = group_fills(bits) else {
                panic!("constant fills")
            };
            let top = s * ((1u32 << bits) - 1) as f32 + b;
            assert!((b + range).abs() < 1e-7 && (top - range).abs() < 1e-6);
        }
    }
}
