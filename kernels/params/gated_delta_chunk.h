// Parameters of the chunked gated-delta kernels (kernels/gated_delta_chunk.metal and .cu),
// declared once for the shaders, the emulation harness and the host: mirrored field for
// field by `GdnChunkParams` in crates/gdn-ops/src/ops/gated_delta/{metal,cuda}_chunked.rs
// (#[repr(C)], u32 fields).
#ifndef QWEN_GDN_PARAMS_GATED_DELTA_CHUNK_H
#define QWEN_GDN_PARAMS_GATED_DELTA_CHUNK_H

struct GdnChunkParams {
  unsigned int batch;
  unsigned int steps;   // T: the token stride of q, k, v, g, beta, y and mask
  unsigned int chunks;  // full chunks of 64 tokens to run, from token 0: chunks * 64 <= steps
  unsigned int key_heads;
  unsigned int value_heads;
  unsigned int key_dim;
  unsigned int value_dim;
  unsigned int has_mask;
};

#endif
