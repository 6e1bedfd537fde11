//! MLX affine quantization (mlx-lm-reference.md §6): packing and exact dequantization.
//!
//! A row of `cols` elements is one little-endian bitstream: element `j` occupies bits
//! `[j*bits, (j+1)*bits)`, bit `n` being bit `n % 32` of word `n / 32`. Groups of
//! `group_size` consecutive elements share a scale and a bias: `w = scale * q + bias`
//! (scales may be negative).

use anyhow::{bail, Result};
use candle_core::DType;

/// Bit widths MLX's affine mode produces.
pub const SUPPORTED_BITS: [usize; 6] = [2, 3, 4, 5, 6, 8];
pub const SUPPORTED_GROUPS: [usize; 3] = [32, 64, 128];

/// One or more stacked affine-quantized matrices `[experts, rows, cols]`.
#[derive(Debug, Clone)]
pub struct AffineMatrix {
    pub bits: usize,
    pub group_size: usize,
    pub rows: usize,
    pub cols: usize,
    pub experts: usize,
    /// `[experts * rows, cols * bits / 32]`.
    packed: Vec<u32>,
    /// `[experts * rows, cols / group_size]`, upcast to f32 once at load.
    scales: Vec<f32>,
    biases: Vec<f32>,
    /// The checkpoint's dtype of scales and biases: device copies keep it (the f32 values
    /// here are exact upcasts of it), so they cost what the checkpoint costs.
    scale_dtype: DType,
}

impl AffineMatrix {
    /// Checks the geometry and wraps the parts of a `[experts, rows, cols]` matrix; `packed`,
    /// `scales` and `biases` are row-major.
    pub fn new(
        bits: usize,
        group_size: usize,
        [experts, rows, cols]: [usize; 3],
        packed: Vec<u32>,
        scales: Vec<f32>,
        biases: Vec<f32>,
    ) -> Result<Self> {
        if !SUPPORTED_BITS.contains(&bits) {
            bail!("unsupported quantization: {bits} bits (supported: 2, 3, 4, 5, 6, 8)");
        }
        if group_size == 0 || !cols.is_multiple_of(group_size) || !(cols * bits).is_multiple_of(32)
        {
            bail!("quantized width {cols} does not fit {bits}-bit groups of {group_size}");
        }
        let n = experts * rows;
        if packed.len() != n * cols * bits / 32
            || scales.len() != n * cols / group_size
            || biases.len() != scales.len()
        {
            bail!("quantized tensor parts have inconsistent sizes");
        }
        Ok(Self {
            bits,
            group_size,
            rows,
            cols,
            experts,
            packed,
            scales,
            biases,
            scale_dtype: DType::F32,
        })
    }

    /// Records the dtype the scales and biases were stored in (f32, f16 or bf16).
    pub fn with_scale_dtype(mut self, dtype: DType) -> Self {
        self.scale_dtype = dtype;
        self
    }

    pub fn scale_dtype(&self) -> DType {
        self.scale_dtype
    }

    /// `[experts * rows, words_per_row]` packed words, row-major.
    pub fn packed(&self) -> &[u32] {
        &self.packed
    }

    /// `[experts * rows, groups_per_row]`, upcast to f32.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    pub fn biases(&self) -> &[f32] {
        &self.biases
    }

    pub fn words_per_row(&self) -> usize {
        self.cols * self.bits / 32
    }

    pub fn groups_per_row(&self) -> usize {
        self.cols / self.group_size
    }

    /// Dequantizes row `row` of the stacked `[experts * rows]` matrix into `out` (`cols` long).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let words = &self.packed[row * self.words_per_row()..(row + 1) * self.words_per_row()];
        let gpr = self.groups_per_row();
        let scales = &self.scales[row * gpr..(row + 1) * gpr];
        let biases = &self.biases[row * gpr..(row + 1) * gpr];
        dequantize_row(words, scales, biases, self.bits, out);
    }

    /// Whether [`AffineMatrix::row_dot`] has a fused kernel for this bit width.
    pub fn has_fused_dot(&self) -> bool {
        matches!(self.bits, 4 | 8)
    }

    /// `Σ_j w[row, j] · x[j]` without materialising the dequantized row: per group
    /// `scale · Σ q_j x_j + bias · Σ x_j` (the form MLX's qmv uses), with the integer
    /// unpacking fused into the dot product. `group_sums` holds `Σ x_j` per group of `x`.
    /// Only for 4- and 8-bit rows (see [`AffineMatrix::has_fused_dot`]).
    pub fn row_dot(&self, row: usize, x: &[f32], group_sums: &[f32]) -> f32 {
        let wpr = self.words_per_row();
        let gpr = self.groups_per_row();
        packed_row_dot(
            &self.packed[row * wpr..(row + 1) * wpr],
            &self.scales[row * gpr..(row + 1) * gpr],
            &self.biases[row * gpr..(row + 1) * gpr],
            x,
            group_sums,
            self.bits,
        )
    }

    /// Keeps the listed rows of every expert, in that order (lossless: groups run along cols).
    pub fn select_rows(&self, rows: &[usize]) -> Self {
        let (wpr, gpr) = (self.words_per_row(), self.groups_per_row());
        let mut packed = Vec::with_capacity(self.experts * rows.len() * wpr);
        let mut scales = Vec::with_capacity(self.experts * rows.len() * gpr);
        let mut biases = Vec::with_capacity(scales.capacity());
        for e in 0..self.experts {
            for &r in rows {
                let g = e * self.rows + r;
                packed.extend_from_slice(&self.packed[g * wpr..(g + 1) * wpr]);
                scales.extend_from_slice(&self.scales[g * gpr..(g + 1) * gpr]);
                biases.extend_from_slice(&self.biases[g * gpr..(g + 1) * gpr]);
            }
        }
        Self {
            rows: rows.len(),
            packed,
            scales,
            biases,
            ..*self
        }
    }

    /// Stacks single matrices with identical format along the row axis.
    pub fn concat_rows(parts: &[&Self]) -> Option<Self> {
        let first = parts.first()?;
        let same = |m: &&Self| {
            m.bits == first.bits
                && m.group_size == first.group_size
                && m.cols == first.cols
                && m.experts == 1
        };
        if !parts.iter().all(same) {
            return None;
        }
        let mut out = Self {
            rows: 0,
            packed: vec![],
            scales: vec![],
            biases: vec![],
            ..**first
        };
        for m in parts {
            out.rows += m.rows;
            out.packed.extend_from_slice(&m.packed);
            out.scales.extend_from_slice(&m.scales);
            out.biases.extend_from_slice(&m.biases);
        }
        Some(out)
    }

    /// Bytes this matrix reads per full pass (packed weights plus f32 scales and biases).
    pub fn bytes(&self) -> usize {
        4 * (self.packed.len() + self.scales.len() + self.biases.len())
    }
}

/// `Σ q_j x_j` for 4-bit values, eight per word: one lane per nibble position, so the
/// shifts and the multiply-adds vectorise.
/// `Σ q_j x_j` for 4-bit values, eight per word, left in eight lanes (one per nibble
/// position) so that the shifts and the multiply-adds vectorise. Groups hold an even number
/// of words (at least 32 values).
#[inline(always)]
fn dot_u4(words: &[u32], x: &[f32]) -> [f32; 8] {
    // Two words per step: sixteen lanes, one AVX-512 register.
    let mut acc = [0f32; 16];
    for (w, xs) in words.chunks_exact(2).zip(x.chunks_exact(16)) {
        for l in 0..16 {
            acc[l] += ((w[l / 8] >> (4 * (l % 8))) & 0xF) as f32 * xs[l];
        }
    }
    std::array::from_fn(|l| acc[l] + acc[l + 8])
}

/// `Σ q_j x_j` for 8-bit values, two words (eight bytes) per step.
#[inline(always)]
fn dot_u8(words: &[u32], x: &[f32]) -> [f32; 8] {
    let mut acc = [0f32; 8];
    for (w, xs) in words.chunks_exact(2).zip(x.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ((w[l / 4] >> (8 * (l % 4))) & 0xFF) as f32 * xs[l];
        }
    }
    acc
}

crate::multiversion! {
    /// Dequantizes one row: `out[j] = scales[g] · q_j + biases[g]`, `g = j / group_size`,
    /// where the group size is `out.len() / scales.len()`.
    pub fn dequantize_row(words: &[u32], scales: &[f32], biases: &[f32], bits: usize, out: &mut [f32]) -> () {
        let group_size = out.len() / scales.len();
        unpack_row(words, bits, out);
        for ((chunk, &s), &b) in out.chunks_exact_mut(group_size).zip(scales).zip(biases) {
            for v in chunk {
                *v = s * *v + b;
            }
        }
    }
}

crate::multiversion! {
    /// `Σ_j w_j x_j` over one packed 4- or 8-bit row, per group `scale · Σ q x + bias · Σ x`
    /// (`group_sums` holds `Σ x` per group of `x`).
    fn packed_row_dot(
        words: &[u32],
        scales: &[f32],
        biases: &[f32],
        x: &[f32],
        group_sums: &[f32],
        bits: usize,
    ) -> f32 {
        let group_size = x.len() / scales.len();
        let words_per_group = group_size * bits / 32;
        // Eight lanes carried across groups (scaled per group, summed once per row): a
        // horizontal sum per group would cost as much as the group's products.
        let mut lanes = [0f32; 8];
        let mut bias_total = 0f32;
        for (g, (gw, gx)) in words
            .chunks_exact(words_per_group)
            .zip(x.chunks_exact(group_size))
            .enumerate()
        {
            let qx = match bits {
                4 => dot_u4(gw, gx),
                8 => dot_u8(gw, gx),
                _ => unreachable!("row_dot needs 4 or 8 bits"),
            };
            for l in 0..8 {
                lanes[l] += scales[g] * qx[l];
            }
            bias_total += biases[g] * group_sums[g];
        }
        lanes.iter().sum::<f32>() + bias_total
    }
}

/// Unpacks one row's bitstream into unsigned integers stored as f32.
#[inline(always)]
pub fn unpack_row(words: &[u32], bits: usize, out: &mut [f32]) {
    match bits {
        // The common widths never straddle a word: a straight shift-and-mask loop.
        4 | 8 | 2 => {
            let per_word = 32 / bits;
            let mask = (1u32 << bits) - 1;
            for (w, chunk) in words.iter().zip(out.chunks_exact_mut(per_word)) {
                for (i, v) in chunk.iter_mut().enumerate() {
                    *v = ((w >> (bits * i)) & mask) as f32;
                }
            }
        }
        _ => {
            let mask = (1u64 << bits) - 1;
            for (j, v) in out.iter_mut().enumerate() {
                let bit = j * bits;
                let (word, shift) = (bit / 32, bit % 32);
                let lo = words[word] as u64;
                let hi = words.get(word + 1).copied().unwrap_or(0) as u64;
                *v = ((((hi << 32) | lo) >> shift) & mask) as f32;
            }
        }
    }
}

/// Packs unsigned integers (each `< 2^bits`) into MLX's LSB-first bitstream. Used by tests
/// and by tools that write checkpoints.
pub fn pack_row(values: &[u32], bits: usize) -> Vec<u32> {
    let mut words = vec![0u32; values.len() * bits / 32];
    for (j, &q) in values.iter().enumerate() {
        let bit = j * bits;
        let (word, shift) = (bit / 32, bit % 32);
        words[word] |= q << shift;
        if shift + bits > 32 {
            words[word + 1] |= q >> (32 - shift);
        }
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_unpack_roundtrip_every_width() {
        for bits in SUPPORTED_BITS {
            let values: Vec<u32> = (0..128u32).map(|j| (j * 7 + 3) % (1 << bits)).collect();
            let words = pack_row(&values, bits);
            let mut out = vec![0f32; values.len()];
            unpack_row(&words, bits, &mut out);
            let back: Vec<u32> = out.iter().map(|&v| v as u32).collect();
            assert_eq!(back, values, "{bits} bits");
        }
    }

    #[test]
    fn nibble_order_is_lsb_first() {
        let mut out = [0f32; 8];
        unpack_row(&[0x8765_4321], 4, &mut out);
        assert_eq!(out, [1., 2., 3., 4., 5., 6., 7., 8.]);
    }

    #[test]
    fn negative_scales_dequantize() {
        let q: Vec<u32> = (0..32).map(|j| j % 16).collect();
        let m =
            AffineMatrix::new(4, 32, [1, 1, 32], pack_row(&q, 4), vec![-0.5], vec![2.0]).unwrap();
        let mut out = vec![0f32; 32];
        m.dequantize_row(0, &mut out);
        assert_eq!(out[0], 2.0);
        assert_eq!(out[3], 0.5);
        assert_eq!(out[15], -5.5);
    }
}
