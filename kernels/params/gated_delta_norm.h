// Parameters of the gated-delta recurrence with the gated RMSNorm folded in
// (kernels/gated_delta_norm.metal, kernels/gated_delta_norm.cu), declared once for the
// shaders, the emulation harness and the host: mirrored field for field by `GdnNormParams` in
// crates/gdn-ops/src/ops/gated_delta_norm/mod.rs (#[repr(C)], u32 and f32 fields).
#ifndef QWEN_GDN_PARAMS_GATED_DELTA_NORM_H
#define QWEN_GDN_PARAMS_GATED_DELTA_NORM_H

struct GdnNormParams {
  unsigned int batch;           // B
  unsigned int steps;           // T
  unsigned int key_heads;       // Hk
  unsigned int value_heads;     // Hv, a multiple of Hk
  unsigned int key_dim;         // Dk, a multiple of 32 up to 256
  unsigned int value_dim;       // Dv, at most 8 rows per simdgroup
  unsigned int z_batch_stride;  // elements from z[b, t] to z[b + 1, t]
  unsigned int z_token_stride;  // elements from z[b, t] to z[b, t + 1]
  float eps;                    // of the gated RMSNorm
  unsigned int sigmoid_gate;    // 1: out = sigmoid(z) * n (qwen4_exp); 0: silu(z) * n
};

#endif
