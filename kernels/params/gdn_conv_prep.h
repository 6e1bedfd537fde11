// Parameters of the GDN conv front kernels (kernels/gdn_conv_prep.metal,
// kernels/gdn_conv_prep.cu), declared once for the shaders, the emulation harness and the host:
// mirrored field for field by `ConvPrepParams` in crates/gdn-ops/src/ops/gdn_conv_prep/mod.rs
// (#[repr(C)], u32 and f32 fields).
#ifndef QWEN_GDN_PARAMS_GDN_CONV_PREP_H
#define QWEN_GDN_PARAMS_GDN_CONV_PREP_H

struct ConvPrepParams {
  unsigned int batch;             // B
  unsigned int tokens;            // S >= 1: tokens per sequence (1 for a decode step)
  unsigned int key_heads;         // Hk
  unsigned int key_dim;           // Dk, a multiple of 32 up to 256
  unsigned int value_heads;       // Hv, a multiple of Hk
  unsigned int value_dim;         // Dv, a multiple of 32 up to 256
  unsigned int kernel_size;       // K, 2 to 8: taps per channel; the conv state keeps K - 1 rows
  unsigned int qkv_batch_stride;  // elements from one batch row of qkv to the next
  unsigned int qkv_token_stride;  // elements from one token's row of qkv to the next
  unsigned int b_batch_stride;    // likewise for b
  unsigned int b_token_stride;
  unsigned int a_batch_stride;    // likewise for a
  unsigned int a_token_stride;
  float q_scale;                  // 1 / Dk: the attention scale folded into q's L2 norm
  float k_scale;                  // 1 / sqrt(Dk)
  float norm_eps;                 // 1e-6, inside the rsqrt of q's and k's mean square
};

#endif
