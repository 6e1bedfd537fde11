//! Which split passes the CUDA kernels take: the shipped `attn_decode_split_*` +
//! `attn_decode_combine_*`, or from [`LONG_CONTEXT_CAPACITY`] positions on the long-context
//! pair `attn_decode_split_pipelined_*` + `attn_decode_combine_wide_*` (kernels/attn_decode.cu:
//! the same keys a warp in the same order, the same bits, with a batch's value rows and the
//! next batch's keys loaded early, and a thread per feature in the combine). CUDA only: the
//! Metal kernels keep one pair.

use super::AttnDecodeDims;

/// KV capacity from which the long-context passes run: where the split count reaches
/// [`MAX_SPLITS`](super::MAX_SPLITS) (32 × [`SPLIT_KEYS`](super::SPLIT_KEYS)) and the ranges
/// grow with the context, so that each warp walks several batches whose loads the pipeline
/// overlaps. Below it (decode after a few hundred positions) the launches are the ones
/// measured before (docs/perf-notes-gpu.md, "attn_decode: loads in flight at long contexts").
pub const LONG_CONTEXT_CAPACITY: usize = 4096;

/// The two launches of a split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitPasses {
    /// `attn_decode_split_*`, then `attn_decode_combine_*` on one warp a head.
    Shipped,
    /// `attn_decode_split_pipelined_*`, then `attn_decode_combine_wide_*` on `Dh` threads
    /// a head.
    LongContext,
}

impl SplitPasses {
    /// The passes for `d` in an element type of `elem_bytes`: the long-context pair needs
    /// rows of exactly 16 bytes a lane (`Dh / 32 · elem_bytes`: Dh 256 in f16/bf16, Dh 128
    /// in f32), which it holds in registers as loaded.
    pub fn for_dims(d: AttnDecodeDims, elem_bytes: usize) -> Self {
        if d.capacity >= LONG_CONTEXT_CAPACITY && d.head_dim / 32 * elem_bytes == 16 {
            Self::LongContext
        } else {
            Self::Shipped
        }
    }

    /// Entry points (without the type suffix) of the split and the combine pass, and the
    /// combine's threads a block.
    pub fn kernels(self, head_dim: usize) -> (&'static str, &'static str, usize) {
        match self {
            Self::Shipped => ("attn_decode_split", "attn_decode_combine", 32),
            Self::LongContext => (
                "attn_decode_split_pipelined",
                "attn_decode_combine_wide",
                head_dim,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(head_dim: usize, capacity: usize) -> AttnDecodeDims {
        AttnDecodeDims {
            batch: 1,
            q_heads: 16,
            kv_heads: 2,
            head_dim,
            capacity,
        }
    }

    #[test]
    fn long_contexts_of_16_byte_rows_take_the_pipelined_passes() {
        // Qwen3-Next in bf16: after 512 positions the shipped pair, after 4k and 16k the new.
        assert_eq!(
            SplitPasses::for_dims(dims(256, 768), 2),
            SplitPasses::Shipped
        );
        assert_eq!(
            SplitPasses::for_dims(dims(256, 4095), 2),
            SplitPasses::Shipped
        );
        assert_eq!(
            SplitPasses::for_dims(dims(256, 4096), 2),
            SplitPasses::LongContext
        );
        assert_eq!(
            SplitPasses::for_dims(dims(256, 16640), 2),
            SplitPasses::LongContext
        );
        // Rows of another width a lane: f32 at Dh 256 (32 bytes), bf16 at Dh 128 (8).
        assert_eq!(
            SplitPasses::for_dims(dims(256, 16640), 4),
            SplitPasses::Shipped
        );
        assert_eq!(
            SplitPasses::for_dims(dims(128, 16640), 2),
            SplitPasses::Shipped
        );
        assert_eq!(
            SplitPasses::for_dims(dims(128, 16640), 4),
            SplitPasses::LongContext
        );
    }
}
