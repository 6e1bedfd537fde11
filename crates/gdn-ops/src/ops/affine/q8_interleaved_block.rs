//! One block of the interleaved q8 layout ([`q8_interleaved`](super::q8_interleaved)) as its
//! kernels read it: sixteen weight rows' words chunk by chunk, and their per-group scales and
//! biases in the stored type. Shared by the portable kernel and the SIMD copies
//! (`q8_interleaved_avx2`, `q8_interleaved_neon`), which the layout's module dispatches to.

use super::q8_kernel::{Activation, CHUNK};
use half::bf16;

/// Weight rows per interleaved block: one 32-bit lane each in a 512-bit register.
pub const ROWS: usize = 16;

/// Packed 32-bit words per row and chunk (64 four-bit values).
pub(super) const WORDS_PER_CHUNK: usize = CHUNK / 8;

/// One interleaved block: `[chunks, WORDS_PER_CHUNK, ROWS]` words, `[groups, ROWS]` params.
pub(super) struct Block<'a, P> {
    pub(super) words: &'a [u32],
    pub(super) scales: &'a [P],
    pub(super) biases: &'a [P],
    pub(super) chunks_per_group: usize,
}

impl<'a, P> Block<'a, P> {
    /// `(words, params, chunks_per_group)`: the block's words, with the range `params` of
    /// the per-group `scales` and `biases` in whichever type they are stored.
    #[inline(always)]
    pub(super) fn new(
        (words, params, chunks_per_group): (&'a [u32], std::ops::Range<usize>, usize),
        scales: &'a [P],
        biases: &'a [P],
    ) -> Self {
        Self {
            words,
            scales: &scales[params.clone()],
            biases: &biases[params],
            chunks_per_group,
        }
    }
}

impl<P> Block<'_, P> {
    /// The block's groups, with the block's and the activation rows' sizes checked once, so
    /// that the SIMD kernels' loops read unchecked.
    pub(super) fn checked_groups(&self, xs: &[Activation]) -> usize {
        let groups = self.scales.len() / ROWS;
        let chunks = groups * self.chunks_per_group;
        assert!(self.words.len() == chunks * WORDS_PER_CHUNK * ROWS);
        assert!(self.biases.len() == groups * ROWS);
        for x in xs {
            assert!(x.q.values().len() == chunks * CHUNK && x.q.lane_scales().len() == 8 * chunks);
            assert!(x.group_sums.len() == groups);
        }
        groups
    }
}

/// A stored scale or bias type the kernel widens sixteen at a time.
pub(super) trait Param: Copy {
    /// Read by the SIMD kernels only.
    #[allow(dead_code)]
    const IS_BF16: bool;
    fn widen(self) -> f32;
}

impl Param for f32 {
    const IS_BF16: bool = false;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Param for bf16 {
    const IS_BF16: bool = true;
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}
