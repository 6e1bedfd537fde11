// The QSA indexer's block pooling in one dispatch (crates/gdn-ops/src/ops/indexer_pool: the spec;
// its cpu.rs is the twin this must match; kernels/indexer_pool.cu is the CUDA twin, the same
// arithmetic in the same order):
//   tail[tail_row, d]   = key[d] = qk[key_offset + d]              (f32)
//   pooled[d]           = (sum of the c tail rows, in row order) / c
//   inv                 = 1 / sqrt(sum_d pooled[d]^2 / Di + eps)    (per lane in column order,
//                                                                    then an xor butterfly)
//   v[d]                = pooled[d] * (inv * norm[d])
//   blocks[block_row,d] = v[d] cos[d] - v[d+h] sin[d]               d < h
//                         v[d-h] sin[d-h] + v[d] cos[d-h]           h <= d < 2h
//                         v[d]                                      otherwise (h = rope_half)
// tail_row and block_row are read from device memory (one uint each); a row past its buffer
// writes nothing. Metal compiles with fast math, which may contract a product and a sum
// into an FMA: within an ulp of the twin's, which the tests' gates allow.
//
// Dispatch: threadgroups (1, 1, 1) of (32, 1, 1) threads (one simdgroup; lane l takes columns
// l, l + 32, ...), threadgroup memory of Di floats at index 0 (the pooled key, which each
// lane's rotation partner reads). bfloat needs MSL 3.1 or later.

#include <metal_stdlib>
using namespace metal;

#include "params/indexer_pool.h"

template <typename InT>
inline void indexer_pool_impl(
    const device InT* qk,
    device float* tail,
    device float* blocks,
    const device uint* tail_row_at,
    const device uint* block_row_at,
    const device float* cs,
    const device float* sn,
    const device float* norm,
    constant IndexerPoolParams& p,
    threadgroup float* pooled,
    uint lane) {
  const uint tail_row = tail_row_at[0], block_row = block_row_at[0];
  if (tail_row >= p.rows || block_row >= p.capacity) {
    return;  // the whole simdgroup alike
  }
  float squares = 0.0f;
  for (uint d = lane; d < p.dim; d += 32) {
    const float key = float(qk[p.key_offset + d]);
    tail[ulong(tail_row) * p.dim + d] = key;
    float sum = 0.0f;
    for (uint r = 0; r < p.rows; ++r) {
      sum += r == tail_row ? key : tail[ulong(r) * p.dim + d];
    }
    const float mean = sum / float(p.rows);
    pooled[d] = mean;
    squares += mean * mean;
  }
  for (ushort o = 16; o > 0; o >>= 1) {
    squares += simd_shuffle_xor(squares, o);
  }
  const float inv = 1.0f / sqrt(squares / float(p.dim) + p.eps);
  simdgroup_barrier(mem_flags::mem_threadgroup);
  const uint h = p.rope_half;
  for (uint d = lane; d < p.dim; d += 32) {
    const float v = pooled[d] * (inv * norm[d]);
    float out = v;
    if (d < h) {
      const float w = pooled[d + h] * (inv * norm[d + h]);
      out = v * cs[d] - w * sn[d];
    } else if (d < 2 * h) {
      const float u = pooled[d - h] * (inv * norm[d - h]);
      out = u * sn[d - h] + v * cs[d - h];
    }
    blocks[ulong(block_row) * p.dim + d] = out;
  }
}

// The entry points, named as the host looks them up: indexer_pool_{InT}.
#define INDEXER_POOL(name, InT)                                                      \
  [[kernel]] void name(                                                              \
      const device InT* qk [[buffer(0)]],          /* [1, >= key_offset + Di] */     \
      device float* tail [[buffer(1)]],            /* [c, Di], in place */           \
      device float* blocks [[buffer(2)]],          /* [capacity, Di], in place */    \
      const device uint* tail_row [[buffer(3)]],   /* one uint */                    \
      const device uint* block_row [[buffer(4)]],  /* one uint */                    \
      const device float* cs [[buffer(5)]],        /* [rope_half] */                 \
      const device float* sn [[buffer(6)]],        /* [rope_half] */                 \
      const device float* norm [[buffer(7)]],      /* [Di], 1 + w */                 \
      constant IndexerPoolParams& p [[buffer(8)]],                                   \
      threadgroup float* pooled [[threadgroup(0)]],                                  \
      uint lane [[thread_index_in_simdgroup]]) {                                     \
    indexer_pool_impl<InT>(qk, tail, blocks, tail_row, block_row, cs, sn, norm, p,  \
                           pooled, lane);                                            \
  }

INDEXER_POOL(indexer_pool_f32, float)
INDEXER_POOL(indexer_pool_f16, half)
#if defined(__HAVE_BFLOAT__)
INDEXER_POOL(indexer_pool_bf16, bfloat)
#endif
