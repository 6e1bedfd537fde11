// Parameters of the grouped quantized matmul (kernels/affine_grouped.metal), declared once for
// the shader, the emulation harness and the host: mirrored field for field by
// `AffineGroupedParams`, `AffineSplitSumParams` and `GroupedTile` in crates/gdn-ops/src/ops/affine_grouped/tiles.rs
// (#[repr(C)], u32 fields).
#ifndef QWEN_GDN_PARAMS_AFFINE_GROUPED_METAL_H
#define QWEN_GDN_PARAMS_AFFINE_GROUPED_METAL_H

struct AffineGroupedParams {
  unsigned int experts;     // E: experts in the stacked matrix
  unsigned int rows;        // R: output rows per expert (the width of y)
  unsigned int cols;        // K
  unsigned int bits;
  unsigned int group_size;
  unsigned int x_rows;      // P: rows of x and of y
  unsigned int tiles;       // entries of the tile schedule (threadgroups along y)
  unsigned int slice_cols;  // split-K: columns per slice (threadgroups along z); 0: one pass writing y
};

// affine_split_sum_*: y [n] = the sum of partial [slices, n] over the slices, in order.
struct AffineSplitSumParams {
  unsigned int n;       // P * R
  unsigned int slices;
};

// One threadgroup row of the grid: rows [row_begin, row_end) of x, all of expert `expert`,
// at most 32 of them (kTileM).
struct GroupedTile {
  unsigned int expert;
  unsigned int row_begin;
  unsigned int row_end;
};

#endif
