// Parameters of the attention decode-preparation kernels (kernels/attn_prep.metal,
// kernels/attn_prep.cu), declared once for the shaders, the emulation harness and the host:
// mirrored field for field by `AttnPrepParams` in crates/gdn-ops/src/ops/attn_prep/mod.rs
// (#[repr(C)]).
#ifndef QWEN_GDN_PARAMS_ATTN_PREP_H
#define QWEN_GDN_PARAMS_ATTN_PREP_H

struct AttnPrepParams {
  unsigned int batch;      // B: sequences, one token each
  unsigned int q_heads;    // Nq
  unsigned int kv_heads;   // Nkv
  unsigned int head_dim;   // Dh
  unsigned int rope_dims;  // R: rotated features per head (even, <= Dh)
  unsigned int capacity;   // cap: positions the KV buffers hold
  float eps;               // of the q and k RMSNorms
};

#endif
