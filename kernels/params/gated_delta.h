// Parameters of the gated-delta kernels (kernels/gated_delta.metal), declared once for the
// shader, the emulation harness and the host: mirrored field for field by `GdnParams` in
// crates/gdn-ops/src/ops/gated_delta/mod.rs (#[repr(C)], u32 fields).
#ifndef QWEN_GDN_PARAMS_GATED_DELTA_H
#define QWEN_GDN_PARAMS_GATED_DELTA_H

struct GdnParams {
  unsigned int batch;
  unsigned int steps;
  unsigned int key_heads;
  unsigned int value_heads;
  unsigned int key_dim;
  unsigned int value_dim;
  unsigned int has_mask;
};

#endif
