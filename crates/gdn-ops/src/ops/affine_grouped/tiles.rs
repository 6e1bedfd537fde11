//! The launch contract of the grouped quantized matmul kernel (`kernels/affine_grouped.metal`,
//! its split-K entries and their sum included): its tile sizes, its parameter and tile structs (mirrors of `kernels/params/affine_grouped_metal.h`),
//! and the tile schedule the host builds from offsets checked by
//! [`check_offsets`](super::check_offsets).
//! Backend-neutral, so that the emulation test feeds the kernel the schedule the host builds.

use super::expert_tiles;

/// Rows of x (one expert's) per tile, the kernel's `kTileM`.
pub const GROUPED_TILE_ROWS: usize = 32;
/// Output columns (weight rows) per threadgroup, `kTileN`.
pub const GROUPED_TILE_COLS: usize = 32;
/// Threads per threadgroup, `kThreads`: four simdgroups.
pub const GROUPED_THREADS: usize = 128;
/// Threadgroup memory, `kScratchBytes`: the float output tile, then the x and weight tiles
/// (each 32 × 32, sized for f32).
pub const GROUPED_SCRATCH_BYTES: usize =
    (GROUPED_TILE_ROWS * GROUPED_TILE_COLS + 2 * GROUPED_TILE_ROWS * 32) * 4;
/// Threads per threadgroup of the split-K sum (`affine_split_sum_*`), `kSumThreads`.
pub const SPLIT_SUM_THREADS: usize = 256;

/// `AffineGroupedParams` of kernels/params/affine_grouped_metal.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffineGroupedParams {
    pub experts: u32,
    pub rows: u32,
    pub cols: u32,
    pub bits: u32,
    pub group_size: u32,
    pub x_rows: u32,
    pub tiles: u32,
    /// Split-K: columns per slice (threadgroups along z, [`super::slicing::slicing`]'s cut in
    /// columns); 0: one pass writing y.
    pub slice_cols: u32,
}

/// `AffineSplitSumParams` of kernels/params/affine_grouped_metal.h: the split-K sum's
/// `n` = P × R outputs over `slices` planes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffineSplitSumParams {
    pub n: u32,
    pub slices: u32,
}

/// `GroupedTile` of kernels/params/affine_grouped_metal.h: rows `row_begin..row_end` of x, all of
/// expert `expert`, at most [`GROUPED_TILE_ROWS`] of them.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupedTile {
    pub expert: u32,
    pub row_begin: u32,
    pub row_end: u32,
}

/// One tile per run of up to [`GROUPED_TILE_ROWS`] rows of one expert, experts in order; an
/// expert without rows has none. `offsets` must have passed
/// [`check_offsets`](super::check_offsets).
pub fn tile_schedule(offsets: &[u32]) -> Vec<GroupedTile> {
    expert_tiles(offsets, GROUPED_TILE_ROWS)
        .map(|(expert, row_begin, row_end)| GroupedTile {
            expert,
            row_begin,
            row_end,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_every_row_once_in_runs_of_one_expert() {
        let offsets = [0, 0, 1, 33, 33, 98, 130];
        super::super::check_offsets(&offsets, 6, 130).unwrap();
        let tiles = tile_schedule(&offsets);
        let t = |expert, row_begin, row_end| GroupedTile {
            expert,
            row_begin,
            row_end,
        };
        assert_eq!(
            tiles,
            [
                t(1, 0, 1),
                t(2, 1, 33),
                t(4, 33, 65),
                t(4, 65, 97),
                t(4, 97, 98),
                t(5, 98, 130)
            ]
        );
        assert!(tile_schedule(&[0, 0, 0]).is_empty());
    }
}
