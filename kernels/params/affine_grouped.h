// Parameters of the grouped quantized GEMM (kernels/affine_grouped.cu), declared once for the
// kernel, its emulation harness and the host: mirrored field for field by
// `AffineGroupedParams` in crates/gdn-ops/src/ops/affine_grouped/mod.rs (#[repr(C)], u32 fields).
#ifndef QWEN_GDN_PARAMS_AFFINE_GROUPED_H
#define QWEN_GDN_PARAMS_AFFINE_GROUPED_H

struct AffineGroupedParams {
  unsigned int rows;        // R: output rows per expert (the width of y)
  unsigned int cols;        // K: the width of x, a multiple of 32
  unsigned int bits;        // 2, 4 or 8
  unsigned int group_size;  // a multiple of 32 dividing cols
  unsigned int experts;     // E: experts in the stack (tile entries name one of them)
  unsigned int pairs;       // P: rows of x and y
  unsigned int tiles;       // entries of the tile schedule (the grid's x extent)
  unsigned int tile_pairs;  // pairs per tile at most: 16, 32 or 64
  unsigned int slice_steps; // split-K: steps of 64 columns per slice (grid z); 0: one slice
};

#endif
