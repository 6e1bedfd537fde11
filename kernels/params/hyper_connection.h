// Parameters of the hyper-connection kernels (kernels/hyper_connection.metal,
// kernels/hyper_connection.cu), declared once for the shaders, the emulation harness and the
// host: mirrored field for field by `HcInjectNormParams`, `HcActParams`, `HcMixParams` and
// `HcUpMixParams` in
// crates/gdn-ops/src/ops/hyper_connection/mod.rs (#[repr(C)]).
#ifndef QWEN_GDN_PARAMS_HYPER_CONNECTION_H
#define QWEN_GDN_PARAMS_HYPER_CONNECTION_H

struct HcInjectNormParams {
  unsigned int tokens;      // N
  unsigned int streams;     // S
  unsigned int cols;        // H, the width of one stream
  unsigned int has_inject;  // 1: sum = hs + w[s] * y is written; 0: sum is hs itself
  unsigned int has_norm;    // 1: normed is written
  float eps;
  unsigned int slots;       // 0: y is the block's output [N, H]; K > 0: y is a MoE block's K
                            // slot outputs [N, K, H], summed with the f32 slot_weights [N, K]
};

struct HcActParams {
  unsigned int len;      // values of the down product's output, N * R
  unsigned int streams;  // S
};

struct HcMixParams {
  unsigned int tokens;   // N
  unsigned int streams;  // S
  unsigned int cols;     // H
};

struct HcUpMixParams {
  unsigned int tokens;      // N
  unsigned int streams;     // S
  unsigned int cols;        // H
  unsigned int rank;        // R, the down product's width and the up matrix's columns
  unsigned int bits;        // the up matrix's bits (2, 4 or 8: whole values per word)
  unsigned int group_size;  // its group size (a multiple of the values in a word)
};

#endif
