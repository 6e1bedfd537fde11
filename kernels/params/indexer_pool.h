// Parameters of the QSA indexer's block pooling (kernels/indexer_pool.metal, kernels/indexer_pool.cu),
// declared once for the shaders, the emulation harnesses and the host: mirrored field for field
// by `IndexerPoolParams` in crates/gdn-ops/src/ops/indexer_pool/mod.rs (#[repr(C)]).
#ifndef QWEN_GDN_PARAMS_INDEXER_POOL_H
#define QWEN_GDN_PARAMS_INDEXER_POOL_H

// The widest index key one simdgroup / warp pools (its shared copy of the pooled key);
// `MAX_DIM` in ops/indexer_pool/mod.rs.
#define INDEXER_POOL_MAX_DIM 1024

struct IndexerPoolParams {
  unsigned int key_offset;  // the key's first column in the projection row (n_heads * Di)
  unsigned int dim;         // Di: values of a key, 1..=INDEXER_POOL_MAX_DIM
  unsigned int rows;        // c: rows of the tail (the tokens of a block), >= 1
  unsigned int capacity;    // rows of the block buffer
  unsigned int rope_half;   // rotated pairs (d, d + rope_half) for d < rope_half; 2 * rope_half <= dim
  float eps;                // the key norm's epsilon
};

#endif
