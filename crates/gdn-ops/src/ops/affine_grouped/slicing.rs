//! How the split-K grouped GEMM ([`super::split_k`]) cuts a matrix's columns into slices: the
//! hosts' launches (`super::cuda`, `super::metal`: one cut for both backends, so that a product
//! slices alike everywhere) and the emulation tests use the same cut, so it sits apart from all.

use super::{TILE_COLS, TILE_ROWS};

/// Blocks a split launch aims at: two per SM of an H100/H200 (132 SMs), so that one block's
/// dequantization overlaps the other's loads. Metal's threadgroups are a quarter of a CUDA
/// block's outputs (32 rows, not 128), so the same cut gives it four times as many: ~1 000
/// for Qwen3-Next's projections, several per core of the largest Apple GPU (80 cores).
pub const TARGET_BLOCKS: usize = 264;

/// The cut of `cols` columns for a matrix of `rows` outputs: `(slice_steps, slices)`, each
/// slice `slice_steps` steps of [`TILE_COLS`] columns (the last may hold fewer), every slice at
/// least one step. `slices` = 1 means one launch writing y directly (the plain grouped GEMM).
pub fn slicing(rows: usize, cols: usize) -> (usize, usize) {
    let steps = cols.div_ceil(TILE_COLS).max(1);
    let row_blocks = rows.div_ceil(TILE_ROWS).max(1);
    let wanted = TARGET_BLOCKS.div_ceil(row_blocks).clamp(1, steps);
    let slice_steps = steps.div_ceil(wanted);
    (slice_steps, steps.div_ceil(slice_steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_fill_the_gpu_and_hold_whole_steps() {
        // Qwen3-Next-80B: in_proj 12 352 × 2 048 (97 row blocks, 32 steps), out_proj
        // 2 048 × 4 096 (16 row blocks, 64 steps), the head 151 936 × 2 048 (one slice).
        assert_eq!(slicing(12_352, 2048), (11, 3));
        assert_eq!(slicing(2048, 4096), (4, 16));
        assert_eq!(slicing(151_936, 2048), (32, 1));
        // Fewer steps than wanted slices: one step a slice; 32 columns: one step.
        assert_eq!(slicing(200, 256), (1, 4));
        assert_eq!(slicing(72, 32), (1, 1));
        for (rows, cols) in [(12_352, 2048), (2048, 4096), (9216, 2048), (200, 1024)] {
            let (slice_steps, slices) = slicing(rows, cols);
            let steps = cols.div_ceil(TILE_COLS);
            assert!(slices * slice_steps >= steps && (slices - 1) * slice_steps < steps);
        }
    }
}
