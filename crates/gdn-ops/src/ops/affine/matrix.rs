//! The host's affine-quantized matrix: one or more stacked `[experts, rows, cols]` matrices
//! in MLX's packed format ([`packing`](super::packing)), their rows dequantized or dotted on
//! the CPU, and the q8 mode's repacked layout ([`q8_interleaved`](super::q8_interleaved))
//! where it was made at load.

pub use super::group_params::GroupParams;
use super::packing::{dequantize_row, packed_row_dot, SUPPORTED_BITS, SUPPORTED_GROUPS};
use super::q8_interleaved::{Interleaved, PlainLayout};
use super::q8_kernel;
use anyhow::{bail, Result};
use candle_core::DType;
use std::borrow::Cow;
use std::sync::Arc;

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

    /// A copy of experts `range` of the stack (the shard one rank of an expert-parallel plan
    /// holds), as a stack of `range.len()` experts. The plain layout only: the q8 mode's
    /// interleaved words are made after sharding.
    pub fn experts_range(&self, range: std::ops::Range<usize>) -> Result<Self> {
        if range.start >= range.end || range.end > self.experts {
            bail!("experts {range:?} of a stack of {}", self.experts);
        }
        if self.interleaved.is_some() {
            bail!("experts of a matrix already in the q8 interleaved layout");
        }
        let rows = range.start * self.rows..range.end * self.rows;
        let (words, groups) = (self.cols * self.bits / 32, self.cols / self.group_size);
        Self::new(
            self.bits,
            self.group_size,
            [range.len(), self.rows, self.cols],
            self.packed[rows.start * words..rows.end * words].to_vec(),
            self.scales.slice(rows.start * groups..rows.end * groups),
            self.biases.slice(rows.start * groups..rows.end * groups),
        )
    }

    /// The same matrix with its packed words in the q8 kernel's interleaved layout (sixteen
    /// rows four bytes at a time; [`q8_interleaved`](super::q8_interleaved)), the plain words dropped;
    /// unchanged if the q8 mode does not take it. Dequantizing and the other row accessors
    /// read the interleaved words; only [`AffineMatrix::packed`] (the device upload) needs the
    /// plain layout.
    pub fn into_q8_interleaved(mut self) -> Self {
        if self.interleaved.is_none() && q8_kernel::supports_format(self.bits, self.group_size) {
            self.interleaved = Some(Arc::new(Interleaved::new(self.plain_layout())));
            self.packed = Vec::new();
        }
        self
    }

    /// The plain layout's parts, as the interleaved repacking reads them.
    fn plain_layout(&self) -> PlainLayout<'_> {
        PlainLayout {
            experts: self.experts,
            rows: self.rows,
            cols: self.cols,
            group_size: self.group_size,
            packed: &self.packed,
            scales: &self.scales,
            biases: &self.biases,
        }
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

#[cfg(test)]
mod tests {
    use super::super::packing::pack_row;
    use super::*;

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
