// Parameters of the gated RMSNorm kernels (kernels/gated_rms_norm.metal,
// kernels/gated_rms_norm.cu), declared once for the shaders, the emulation harness and the
// host: mirrored field for field by `GatedRmsNormParams` in
// crates/gdn-ops/src/ops/gated_rms_norm/mod.rs (#[repr(C)], u32 and f32 fields).
#ifndef QWEN_GDN_PARAMS_GATED_RMS_NORM_H
#define QWEN_GDN_PARAMS_GATED_RMS_NORM_H

struct GatedRmsNormParams {
  unsigned int rows;            // B * T * Hv: one normalised row of Dv values each
  unsigned int tokens;          // T
  unsigned int value_heads;     // Hv
  unsigned int value_dim;       // Dv
  unsigned int z_batch_stride;  // elements from z[b, t] to z[b + 1, t]
  unsigned int z_token_stride;  // elements from z[b, t] to z[b, t + 1]
  float eps;                    // inside the rsqrt of y's mean square
};

#endif
