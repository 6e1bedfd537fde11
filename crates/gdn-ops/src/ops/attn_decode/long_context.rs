//! Which split passes the CUDA kernels take: the shipped `attn_decode_split_*` +
//! `attn_decode_combine_*` (rows that are not 16 bytes a lane), or the pipelined pair of
//! kernels/attn_decode.cu (`attn_decode::run_pipelined`, `attn_decode::combine_wide`): the
//! same keys a warp in the same order — the same bits — with a batch's value rows and the next
//! batch's keys loaded early, from [`LONG_CONTEXT_CAPACITY`] positions on a warp serving two
//! query heads of its KV head where the GQA group is even, and a thread per feature in the
//! combine. CUDA only: the Metal kernels keep one pair.

use super::AttnDecodeDims;

/// KV capacity from which head pairs run: where the split count reaches
/// [`MAX_SPLITS`](super::MAX_SPLITS) (32 × [`SPLIT_KEYS`](super::SPLIT_KEYS)) and the ranges
/// grow with the context, so that a block has enough keys to share its loaded rows between two
/// heads (docs/perf-notes-gpu.md, "attn_decode, loads in flight at long contexts").
pub const LONG_CONTEXT_CAPACITY: usize = 4096;

/// The two launches of a split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitPasses {
    /// `attn_decode_split_*`, then `attn_decode_combine_*` on one warp a head.
    Shipped,
    /// `attn_decode_split_pipelined_*` (a query head a block), then
    /// `attn_decode_combine_wide_*` on `Dh` threads a head.
    Pipelined,
    /// `attn_decode_split_pair_*` (two query heads of one KV head a block), then
    /// `attn_decode_combine_wide_*`.
    HeadPairs,
}

/// Entry points (without the type suffix) and geometry of [`SplitPasses`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitKernels {
    pub split: &'static str,
    pub combine: &'static str,
    /// Query heads a block of the split pass takes: its grid is `(Nq / heads, B, splits)`.
    pub heads_per_block: usize,
    /// Threads a block of the combine pass (grid `(Nq, B)`).
    pub combine_threads: usize,
}

impl SplitPasses {
    /// The passes for `d` in an element type of `elem_bytes`: the long-context passes need
    /// rows of exactly 16 bytes a lane (`Dh / 32 · elem_bytes`: Dh 256 in f16/bf16, Dh 128
    /// in f32), which they hold in registers as loaded; head pairs need an even GQA group.
    pub fn for_dims(d: AttnDecodeDims, elem_bytes: usize) -> Self {
        if d.head_dim / 32 * elem_bytes != 16 {
            Self::Shipped
        } else if d.capacity >= LONG_CONTEXT_CAPACITY && (d.q_heads / d.kv_heads).is_multiple_of(2)
        {
            Self::HeadPairs
        } else {
            // Below the long-context capacity the one-head pipelined pass still beats the
            // shipped pair (capacity 768: 9.4 against 14.7 µs a layer on the H200, the same
            // bits), while head pairs halve a grid that is already small there.
            Self::Pipelined
        }
    }

    pub fn kernels(self, head_dim: usize) -> SplitKernels {
        let (split, combine, heads_per_block, combine_threads) = match self {
            Self::Shipped => ("attn_decode_split", "attn_decode_combine", 1, 32),
            Self::Pipelined => (
                "attn_decode_split_pipelined",
                "attn_decode_combine_wide",
                1,
                head_dim,
            ),
            Self::HeadPairs => (
                "attn_decode_split_pair",
                "attn_decode_combine_wide",
                2,
                head_dim,
            ),
        };
        SplitKernels {
            split,
            combine,
            heads_per_block,
            combine_threads,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(q_heads: usize, head_dim: usize, capacity: usize) -> AttnDecodeDims {
        AttnDecodeDims {
            batch: 1,
            q_heads,
            kv_heads: 2,
            head_dim,
            capacity,
        }
    }

    #[test]
    fn long_contexts_of_16_byte_rows_take_the_long_context_passes() {
        use SplitPasses::*;
        // Qwen3-Next in bf16 (16 query heads over 2): after 512 positions the one-head
        // pipelined pass, from 4k on head pairs.
        assert_eq!(SplitPasses::for_dims(dims(16, 256, 768), 2), Pipelined);
        assert_eq!(SplitPasses::for_dims(dims(16, 256, 4095), 2), Pipelined);
        assert_eq!(SplitPasses::for_dims(dims(16, 256, 4096), 2), HeadPairs);
        assert_eq!(SplitPasses::for_dims(dims(16, 256, 16640), 2), HeadPairs);
        // An odd group (6 over 2): one head a block.
        assert_eq!(SplitPasses::for_dims(dims(6, 256, 16640), 2), Pipelined);
        // Rows of another width a lane: f32 at Dh 256 (32 bytes), bf16 at Dh 128 (8).
        assert_eq!(SplitPasses::for_dims(dims(16, 256, 16640), 4), Shipped);
        assert_eq!(SplitPasses::for_dims(dims(16, 128, 16640), 2), Shipped);
        assert_eq!(SplitPasses::for_dims(dims(16, 128, 16640), 4), HeadPairs);
        assert_eq!(HeadPairs.kernels(256).heads_per_block, 2);
        assert_eq!(HeadPairs.kernels(256).combine_threads, 256);
    }
}
