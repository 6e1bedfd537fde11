// Parameters of the causal prefill attention kernel (kernels/attn_prefill.cu), declared once
// for the kernel, the emulation harness and the host: mirrored field for field by
// `AttnPrefillParams` in crates/gdn-ops/src/ops/attn_prefill/mod.rs (#[repr(C)]).
#ifndef QWEN_GDN_PARAMS_ATTN_PREFILL_H
#define QWEN_GDN_PARAMS_ATTN_PREFILL_H

struct AttnPrefillParams {
  unsigned int batch;            // B
  unsigned int q_heads;          // Nq
  unsigned int kv_heads;         // Nkv (divides Nq)
  unsigned int head_dim;         // Dh: a multiple of 16, at most 256
  unsigned int queries;          // S: queries of the chunk, at positions offset..offset+S
  unsigned int keys;             // T: keys 0..T
  unsigned int offset;           // query i sees keys j <= offset + i (and j < T)
  unsigned int q_tiles;          // ceil(S / 64): the grid's x
  unsigned int k_batch_stride;   // elements between sequences of k
  unsigned int k_head_stride;    // elements between KV heads of k
  unsigned int k_row_stride;     // elements between positions of k
  unsigned int v_batch_stride;   // the same for v
  unsigned int v_head_stride;
  unsigned int v_row_stride;
  float scale;                   // Dh^-1/2 rounded to InT, as the composed path multiplies
};

#endif
