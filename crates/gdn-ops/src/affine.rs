//! MLX affine quantization (mlx-lm-reference.md §6): packing and exact dequantization.
//!
//! A row of `cols` elements is one little-endian bitstream: element `j` occupies bits
//! `[j*bits, (j+1)*bits)`, bit `n` being bit `n % 32` of word `n / 32`. Groups of
//! `group_size` consecutive elements share a scale and a bias: `w = scale * q + bias`
//! (scales may be negative).

use crate::affine_q8_interleaved::Interleaved;
use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::borrow::Cow;
use std::sync::Arc;

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
    /// `[experts * rows, cols * bits / 32]`; empty once the words are interleaved.
    packed: Vec<u32>,
    /// `[experts * rows, groups_per_row]`, in the checkpoint's dtype.
    scales: GroupParams,
    biases: GroupParams,
    /// The q8 mode's repacked words ([`AffineMatrix::into_q8_interleaved`]), which replace
    /// `packed`: one copy of the weights either way.
    interleaved: Option<Arc<Interleaved>>,
}

/// Per-group scales or biases, kept in the dtype they were stored in: f32 copies of bf16
/// values would add a ninth to a 4-bit group-64 matrix (8 bytes per 64 weights instead of
/// 4), to resident memory and to the bytes every decoded token reads. Kernels widen one
/// row's worth at a time.
#[derive(Debug, Clone)]
pub enum GroupParams {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl From<Vec<f32>> for GroupParams {
    fn from(v: Vec<f32>) -> Self {
        Self::F32(v)
    }
}

impl From<Vec<bf16>> for GroupParams {
    fn from(v: Vec<bf16>) -> Self {
        Self::Bf16(v)
    }
}

impl From<Vec<f16>> for GroupParams {
    fn from(v: Vec<f16>) -> Self {
        Self::F16(v)
    }
}

impl GroupParams {
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::Bf16(v) => v.len(),
            Self::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self {
            Self::F32(_) => DType::F32,
            Self::Bf16(_) => DType::BF16,
            Self::F16(_) => DType::F16,
        }
    }

    pub fn bytes(&self) -> usize {
        self.len() * self.dtype().size_in_bytes()
    }

    /// Widens elements `start .. start + out.len()` into `out` (exactly: f32 holds every
    /// bf16 and f16 value).
    #[inline]
    pub fn widen_into(&self, start: usize, out: &mut [f32]) {
        let range = start..start + out.len();
        match self {
            Self::F32(v) => out.copy_from_slice(&v[range]),
            // A bf16 is the top half of an f32: a shift the compiler vectorises.
            Self::Bf16(v) => out
                .iter_mut()
                .zip(&v[range])
                .for_each(|(o, x)| *o = f32::from_bits((x.to_bits() as u32) << 16)),
            Self::F16(v) => v[range].convert_to_f32_slice(out),
        }
    }

    /// Every element widened to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        self.widen_into(0, &mut out);
        out
    }

    /// A tensor of `shape` on `device`, in this dtype.
    pub fn to_tensor(&self, shape: (usize, usize), device: &Device) -> Result<Tensor> {
        Ok(match self {
            Self::F32(v) => Tensor::from_slice(v, shape, device)?,
            Self::Bf16(v) => Tensor::from_slice(v, shape, device)?,
            Self::F16(v) => Tensor::from_slice(v, shape, device)?,
        })
    }

    fn empty_like(&self) -> Self {
        match self {
            Self::F32(_) => Self::F32(vec![]),
            Self::Bf16(_) => Self::Bf16(vec![]),
            Self::F16(_) => Self::F16(vec![]),
        }
    }

    /// Appends `other[range]`; `None` if the dtypes differ.
    fn extend_from(&mut self, other: &Self, range: std::ops::Range<usize>) -> Option<()> {
        match (self, other) {
            (Self::F32(a), Self::F32(b)) => a.extend_from_slice(&b[range]),
            (Self::Bf16(a), Self::Bf16(b)) => a.extend_from_slice(&b[range]),
            (Self::F16(a), Self::F16(b)) => a.extend_from_slice(&b[range]),
            _ => return None,
        }
        Some(())
    }
}

impl AffineMatrix {
    /// Checks the geometry and wraps the parts of a `[experts, rows, cols]` matrix; `packed`,
    /// `scales` and `biases` are row-major.
    pub fn new(
        bits: usize,
        group_size: usize,
        [experts, rows, cols]: [usize; 3],
        packed: Vec<u32>,
        scales: impl Into<GroupParams>,
        biases: impl Into<GroupParams>,
    ) -> Result<Self> {
        let (scales, biases) = (scales.into(), biases.into());
        if !SUPPORTED_BITS.contains(&bits) {
            bail!("unsupported quantization: {bits} bits (supported: 2, 3, 4, 5, 6, 8)");
        }
        // The kernels walk whole words per group: a group must be one MLX produces (a 4-bit
        // group of 4 would fill half a word).
        if !SUPPORTED_GROUPS.contains(&group_size) {
            bail!("unsupported quantization: groups of {group_size} (supported: 32, 64, 128)");
        }
        if !cols.is_multiple_of(group_size) || !(cols * bits).is_multiple_of(32) {
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
            interleaved: None,
        })
    }

    /// The same matrix with its packed words in the q8 kernel's interleaved layout (sixteen
    /// rows four bytes at a time; [`crate::affine_q8_interleaved`]), the plain words dropped;
    /// unchanged if the q8 mode does not take it. Dequantizing and the other row accessors
    /// read the interleaved words; only [`AffineMatrix::packed`] (the device upload) needs the
    /// plain layout.
    pub fn into_q8_interleaved(mut self) -> Self {
        if self.interleaved.is_none() && crate::affine_q8::supports(&self) {
            self.interleaved = Some(Arc::new(Interleaved::new(&self)));
            self.packed = Vec::new();
        }
        self
    }

    /// The interleaved words, if [`AffineMatrix::into_q8_interleaved`] made them.
    pub fn q8_interleaved(&self) -> Option<&Interleaved> {
        self.interleaved.as_deref()
    }

    /// The packed words of stacked row `row`, from whichever layout holds them.
    fn row_words(&self, row: usize) -> Cow<'_, [u32]> {
        let wpr = self.words_per_row();
        match &self.interleaved {
            None => Cow::Borrowed(&self.packed[row * wpr..(row + 1) * wpr]),
            Some(il) => {
                let mut words = vec![0u32; wpr];
                il.row_words(row, &mut words);
                Cow::Owned(words)
            }
        }
    }

    /// The dtype the scales were stored in (f32, f16 or bf16).
    pub fn scale_dtype(&self) -> DType {
        self.scales.dtype()
    }

    /// `[experts * rows, words_per_row]` packed words, row-major. Not for a matrix whose
    /// words were interleaved (the q8 mode runs on the CPU only).
    pub fn packed(&self) -> &[u32] {
        assert!(
            self.interleaved.is_none(),
            "the plain words of an interleaved matrix are gone"
        );
        &self.packed
    }

    /// `[experts * rows, groups_per_row]`, in their stored dtype.
    pub fn scales(&self) -> &GroupParams {
        &self.scales
    }

    pub fn biases(&self) -> &GroupParams {
        &self.biases
    }

    /// Runs `f` on row `row`'s scales and biases widened to f32 (on the stack for rows of
    /// up to 64 groups, the common case).
    #[inline]
    pub fn with_row_params<R>(&self, row: usize, f: impl FnOnce(&[f32], &[f32]) -> R) -> R {
        const ON_STACK: usize = 64;
        let gpr = self.groups_per_row();
        let (mut stack_s, mut stack_b) = ([0f32; ON_STACK], [0f32; ON_STACK]);
        let (mut heap_s, mut heap_b);
        let (s, b): (&mut [f32], &mut [f32]) = if gpr <= ON_STACK {
            (&mut stack_s[..gpr], &mut stack_b[..gpr])
        } else {
            (heap_s, heap_b) = (vec![0f32; gpr], vec![0f32; gpr]);
            (&mut heap_s, &mut heap_b)
        };
        self.scales.widen_into(row * gpr, s);
        self.biases.widen_into(row * gpr, b);
        f(s, b)
    }

    pub fn words_per_row(&self) -> usize {
        self.cols * self.bits / 32
    }

    pub fn groups_per_row(&self) -> usize {
        self.cols / self.group_size
    }

    /// Dequantizes row `row` of the stacked `[experts * rows]` matrix into `out` (`cols` long).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let words = self.row_words(row);
        self.with_row_params(row, |scales, biases| {
            dequantize_row(&words, scales, biases, self.bits, out)
        });
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
        let words = self.row_words(row);
        self.with_row_params(row, |scales, biases| {
            packed_row_dot(&words, scales, biases, x, group_sums, self.bits)
        })
    }

    /// Keeps the listed rows of every expert, in that order (lossless: groups run along cols).
    pub fn select_rows(&self, rows: &[usize]) -> Self {
        let (wpr, gpr) = (self.words_per_row(), self.groups_per_row());
        let mut packed = Vec::with_capacity(self.experts * rows.len() * wpr);
        let mut scales = self.scales.empty_like();
        let mut biases = self.biases.empty_like();
        for e in 0..self.experts {
            for &r in rows {
                let g = e * self.rows + r;
                packed.extend_from_slice(&self.row_words(g));
                let groups = g * gpr..(g + 1) * gpr;
                scales.extend_from(&self.scales, groups.clone());
                biases.extend_from(&self.biases, groups);
            }
        }
        let out = Self {
            rows: rows.len(),
            packed,
            scales,
            biases,
            interleaved: None,
            ..*self
        };
        out.same_layout_as(self.interleaved.is_some())
    }

    /// Interleaves a plain result of the row accessors below if its sources were.
    fn same_layout_as(self, interleaved: bool) -> Self {
        if interleaved {
            self.into_q8_interleaved()
        } else {
            self
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
            scales: first.scales.empty_like(),
            biases: first.biases.empty_like(),
            interleaved: None,
            ..**first
        };
        for m in parts {
            out.rows += m.rows;
            for row in 0..m.rows {
                out.packed.extend_from_slice(&m.row_words(row));
            }
            out.scales.extend_from(&m.scales, 0..m.scales.len())?;
            out.biases.extend_from(&m.biases, 0..m.biases.len())?;
        }
        Some(out.same_layout_as(parts.iter().all(|m| m.interleaved.is_some())))
    }

    /// A `[experts, rows, cols]` matrix whose stacked rows are, in order, the listed stacked
    /// rows of `sources` (`(matrix, row of its [experts * rows])`): lossless regrouping, e.g.
    /// an expert's gate and up rows side by side, or a shared expert appended as one more
    /// expert. `None` unless every source has this format (bits, group size, cols, scale
    /// dtype) and the count is `experts * rows`.
    pub fn gather_stacked(sources: &[(&Self, usize)], experts: usize, rows: usize) -> Option<Self> {
        let first = sources.first()?.0;
        if sources.len() != experts * rows {
            return None;
        }
        let mut out = Self {
            rows,
            experts,
            packed: Vec::with_capacity(sources.len() * first.words_per_row()),
            scales: first.scales.empty_like(),
            biases: first.biases.empty_like(),
            interleaved: None,
            ..*first
        };
        for &(m, row) in sources {
            if m.bits != first.bits || m.group_size != first.group_size || m.cols != first.cols {
                return None;
            }
            let gpr = m.groups_per_row();
            if row >= m.experts * m.rows {
                return None;
            }
            out.packed.extend_from_slice(&m.row_words(row));
            out.scales
                .extend_from(&m.scales, row * gpr..(row + 1) * gpr)?;
            out.biases
                .extend_from(&m.biases, row * gpr..(row + 1) * gpr)?;
        }
        let interleaved = sources.iter().all(|(m, _)| m.interleaved.is_some());
        Some(out.same_layout_as(interleaved))
    }

    /// Bytes this matrix reads per full pass (packed weights, scales and biases; for an
    /// interleaved matrix its repacked words, scales and biases).
    pub fn bytes(&self) -> usize {
        match &self.interleaved {
            None => 4 * self.packed.len() + self.scales.bytes() + self.biases.bytes(),
            Some(il) => il.bytes(),
        }
    }
}

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
    fn groups_smaller_than_a_word_are_rejected() {
        for group in [1, 2, 4, 16] {
            let q = vec![0u32; 32];
            let err = AffineMatrix::new(
                4,
                group,
                [1, 1, 32],
                pack_row(&q, 4),
                vec![1.0; 32 / group],
                vec![0.0; 32 / group],
            )
            .unwrap_err();
            assert!(err.to_string().contains("groups of"), "{err}");
        }
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
