//! How one n-gram table shard stores its rows, and the decoding of one row to f32 straight
//! from the mapped file (docs/qwen4_exp.md §4.3):
//!
//! - float rows (f32 / bf16 / f16): raw transformers checkpoints, unquantized conversions;
//! - MLX affine rows: mlx-vlm quantizes the shards like embeddings (`weight` U32
//!   `[rows, width·bits/32]`, `scales`/`biases` `[rows, width/group]`; 4-bit group 32 for the
//!   release's 160-wide rows, its `fallback_group_size`);
//! - FP8 e4m3 rows: the official FP8 checkpoint, `U8 [rows, width]` times one
//!   `ngram_embedding.weight_scale` per table (mlx-vlm `fp8.py` multiplies after decoding).
//!
//! The table is never read whole: one token reads `heads` rows per PLE layer.

use crate::weights::affine::{self, AffineMatrix};
use anyhow::{bail, ensure, Result};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::Dtype;
use std::sync::Arc;

/// Where a tensor's bytes are in a mapped file.
#[derive(Debug, Clone)]
pub struct MappedBytes {
    pub map: Arc<Mmap>,
    pub start: usize,
    pub end: usize,
}

impl MappedBytes {
    fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

/// Per-group scales or biases of an affine shard: `[rows, groups]` floats.
#[derive(Debug, Clone)]
pub struct GroupParamsAt {
    pub bytes: MappedBytes,
    pub dtype: Dtype,
}

#[derive(Debug, Clone)]
pub enum RowFormat {
    Float(Dtype),
    Affine {
        bits: usize,
        group_size: usize,
        scales: GroupParamsAt,
        biases: GroupParamsAt,
    },
    Fp8E4m3 {
        scale: f32,
    },
}

/// Bytes of one element of a float tensor, or an error naming what the table holds instead.
pub fn float_size(dtype: Dtype) -> Option<usize> {
    match dtype {
        Dtype::F32 => Some(4),
        Dtype::BF16 | Dtype::F16 => Some(2),
        _ => None,
    }
}

/// One float value of `dtype` from its little-endian bytes.
pub fn float_at(dtype: Dtype, b: &[u8]) -> f32 {
    match dtype {
        Dtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        Dtype::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        _ => f16::from_le_bytes([b[0], b[1]]).to_f32(),
    }
}

/// An FP8 e4m3 ("fn": no infinities, `S.1111.111` is NaN) code as f32: 4 exponent bits with
/// bias 7, 3 mantissa bits, subnormals below exponent 1.
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((code >> 3) & 0x0f) as i32;
    let man = (code & 0x07) as f32;
    if exp == 0x0f && code & 0x07 == 0x07 {
        return f32::NAN;
    }
    let magnitude = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    sign * magnitude
}

impl RowFormat {
    /// Bytes of one stored row of `width` values in the shard's main tensor.
    pub fn row_bytes(&self, width: usize) -> usize {
        match self {
            Self::Float(dtype) => width * float_size(*dtype).unwrap_or(4),
            Self::Affine { bits, .. } => width * bits / 8,
            Self::Fp8E4m3 { .. } => width,
        }
    }

    /// Checks an affine shard's packed and group shapes for `rows` rows of `width` values and
    /// returns its bits and group size (what the shapes imply, as for any MLX weight).
    pub fn affine_layout(
        what: &str,
        weight_shape: &[usize],
        group_shape: &[usize],
        rows: usize,
        width: usize,
    ) -> Result<(usize, usize)> {
        let (words, groups) = match (weight_shape, group_shape) {
            ([r, w], [gr, g]) if *r == rows && *gr == rows && *w > 0 && *g > 0 => (*w, *g),
            _ => bail!(
                "{what}: quantized shapes {weight_shape:?} (weight) and {group_shape:?} (scales) do not fit {rows} rows of {width}"
            ),
        };
        let bits = words * 32 / width;
        let group_size = width / groups;
        ensure!(
            words * 32 == bits * width
                && groups * group_size == width
                && affine::SUPPORTED_BITS.contains(&bits)
                && affine::SUPPORTED_GROUPS.contains(&group_size),
            "{what}: {words} packed words and {groups} groups per row do not fit {width}-wide rows of a supported MLX format"
        );
        Ok((bits, group_size))
    }

    /// Decodes row `row` of the shard whose main tensor is `main` into `out` (`width` values).
    pub fn decode(&self, main: &MappedBytes, row: usize, out: &mut [f32]) -> Result<()> {
        let w = out.len();
        let n = self.row_bytes(w);
        let bytes = &main.bytes()[row * n..(row + 1) * n];
        match self {
            Self::Float(dtype) => {
                let size = n / w;
                for (d, c) in out.iter_mut().zip(bytes.chunks_exact(size)) {
                    *d = float_at(*dtype, c);
                }
            }
            Self::Fp8E4m3 { scale } => {
                for (d, &c) in out.iter_mut().zip(bytes) {
                    *d = e4m3_to_f32(c) * scale;
                }
            }
            Self::Affine {
                bits,
                group_size,
                scales,
                biases,
            } => {
                let groups = w / group_size;
                let words: Vec<u32> = bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let params = |p: &GroupParamsAt| -> Vec<f32> {
                    let size = float_size(p.dtype).unwrap_or(4);
                    p.bytes.bytes()[row * groups * size..(row + 1) * groups * size]
                        .chunks_exact(size)
                        .map(|c| float_at(p.dtype, c))
                        .collect()
                };
                // The tested MLX dequantization, on a one-row matrix.
                let one = AffineMatrix::new(
                    *bits,
                    *group_size,
                    [1, 1, w],
                    words,
                    params(scales),
                    params(biases),
                )?;
                one.dequantize_row(0, out);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::e4m3_to_f32;

    #[test]
    fn e4m3_codes() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0); // exponent 7 = bias
        assert_eq!(e4m3_to_f32(0xb8), -1.0);
        assert_eq!(e4m3_to_f32(0x7e), 448.0); // largest finite
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6)); // smallest normal
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    }
}
