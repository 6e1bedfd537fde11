// Parameters of the MLX affine kernels (kernels/affine.metal, kernels/affine.cu), declared
// once for the shaders, the emulation harness and the host: mirrored field for field by
// `AffineParams` in crates/gdn-ops/src/ops/affine/mod.rs (#[repr(C)], u32 fields).
#ifndef QWEN_GDN_PARAMS_AFFINE_H
#define QWEN_GDN_PARAMS_AFFINE_H

struct AffineParams {
  unsigned int rows;        // R: output rows per expert (qmv) / total stacked rows E*R (dequant, for bounds only)
  unsigned int cols;        // K
  unsigned int bits;
  unsigned int group_size;
  unsigned int out_rows;    // M: number of output rows (qmv: products; dequant: rows written)
  unsigned int x_div;       // qmv: output row i reads x row i / x_div
  unsigned int has_ids;     // 1: ids buffer is read; 0: it is not (still bound, never read)
};

#endif
