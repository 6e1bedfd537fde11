// Parameters of the attention decode kernels (kernels/attn_decode.metal,
// kernels/attn_decode.cu), declared once for the shaders, the emulation harness and the
// host: mirrored field for field by `AttnDecodeParams` in
// crates/gdn-ops/src/ops/attn_decode/mod.rs (#[repr(C)]).
#ifndef QWEN_GDN_PARAMS_ATTN_DECODE_H
#define QWEN_GDN_PARAMS_ATTN_DECODE_H

struct AttnDecodeParams {
  unsigned int batch;       // B: sequences, one query each
  unsigned int q_heads;     // Nq
  unsigned int kv_heads;    // Nkv (divides Nq)
  unsigned int head_dim;    // Dh: a multiple of 32, at most 256
  unsigned int capacity;    // cap: positions the KV buffers hold
  unsigned int simdgroups;  // S: simdgroups (warps) per threadgroup (block)
  unsigned int splits;      // P: key ranges (1: one pass; see attn_decode_split_*)
  float scale;              // Dh^-1/2
};

#endif
