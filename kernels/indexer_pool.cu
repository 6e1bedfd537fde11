// The QSA indexer's block pooling on CUDA in one launch: the twin of kernels/indexer_pool.metal;
// crates/gdn-ops/src/ops/indexer_pool/cpu.rs is the reference, ops/indexer_pool/mod.rs the spec.
// It replaces 14 small candle launches a QSA layer of every decode step (the cast, the key's
// scatter, the mean, the norm's seven ops, the rotation and its concat, the block's scatter).
//
// ENTRY POINTS (extern "C"; <x> in {f32, f16, bf16}, the projection's dtype):
//   indexer_pool_<x>(qk, tail, blocks, tail_row, block_row, cos, sin, norm, IndexerPoolParams p)
//     qk [1, >= key_offset + Di] in <x>; tail [c, Di] f32 and blocks [capacity, Di] f32, both
//     written in place; tail_row, block_row: one u32 each (device memory, so that a replayed
//     CUDA graph reads the step's rows); cos, sin [rope_half] f32; norm [Di] f32 (1 + w).
//     grid = 1, block = 32 threads (one warp; lane l takes columns l, l + 32, ...).
// Per column d, in f32: tail[tail_row, d] = key[d]; pooled[d] = (sum over the c tail rows in
// row order) / c; inv = 1 / sqrt(sum(pooled^2) / Di + eps), the squares summed per lane in column
// order and then over the lanes by an xor butterfly (the twin does the same); v[d] = pooled[d] *
// (inv * norm[d]); then the half-split rotation of the first 2 * rope_half values (candle's
// `rope`): out[d] = v[d] cos - v[d + h] sin, out[d + h] = v[d] sin + v[d + h] cos; the rest as
// is; blocks[block_row, d] = out[d]. The products are rounded one at a time (__fmul_rn and
// friends: no contraction into FMAs), as the twin computes them. A row past its buffer writes
// nothing. The body takes its lane and shared memory as arguments, so that
// kernels/emu/indexer_pool_cuda_harness.cpp runs it on the CPU.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/indexer_pool.cu

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/indexer_pool.h"
#include "cuda_convert.h"

namespace indexer_pool {

using cuda_convert::to_f32;

template <typename X>
__device__ __forceinline__ void pool(const X* __restrict__ qk, float* __restrict__ tail,
                                     float* __restrict__ blocks, const uint32_t* tail_row_at,
                                     const uint32_t* block_row_at, const float* __restrict__ cos,
                                     const float* __restrict__ sin, const float* __restrict__ norm,
                                     const IndexerPoolParams& p, float* pooled, uint32_t lane) {
  const uint32_t tail_row = *tail_row_at, block_row = *block_row_at;
  if (tail_row >= p.rows || block_row >= p.capacity) return;  // the whole warp alike
  float squares = 0.f;
  for (uint32_t d = lane; d < p.dim; d += 32) {
    const float key = to_f32(qk[p.key_offset + d]);
    tail[(size_t)tail_row * p.dim + d] = key;
    float sum = 0.f;
    for (uint32_t r = 0; r < p.rows; ++r) sum = __fadd_rn(sum, r == tail_row ? key : tail[(size_t)r * p.dim + d]);
    const float mean = __fdiv_rn(sum, (float)p.rows);
    pooled[d] = mean;
    squares = __fadd_rn(squares, __fmul_rn(mean, mean));
  }
  for (int o = 16; o > 0; o >>= 1) squares = __fadd_rn(squares, __shfl_xor_sync(0xffffffffu, squares, o));
  const float inv = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(squares, (float)p.dim), p.eps)));
  __syncwarp();
  const uint32_t h = p.rope_half;
  for (uint32_t d = lane; d < p.dim; d += 32) {
    const float v = __fmul_rn(pooled[d], __fmul_rn(inv, norm[d]));
    float out = v;
    if (d < h) {
      const float w = __fmul_rn(pooled[d + h], __fmul_rn(inv, norm[d + h]));
      out = __fsub_rn(__fmul_rn(v, cos[d]), __fmul_rn(w, sin[d]));
    } else if (d < 2 * h) {
      const float u = __fmul_rn(pooled[d - h], __fmul_rn(inv, norm[d - h]));
      out = __fadd_rn(__fmul_rn(u, sin[d - h]), __fmul_rn(v, cos[d - h]));
    }
    blocks[(size_t)block_row * p.dim + d] = out;
  }
}

}  // namespace indexer_pool

#define INDEXER_POOL_ENTRY(TN, X)                                                                  \
  extern "C" __global__ void indexer_pool_##TN(const X* qk, float* tail, float* blocks,          \
                                               const uint32_t* tail_row, const uint32_t* block_row, \
                                               const float* cos, const float* sin, const float* norm, \
                                               const IndexerPoolParams p) {                        \
    __shared__ float pooled[INDEXER_POOL_MAX_DIM];                                                 \
    indexer_pool::pool<X>(qk, tail, blocks, tail_row, block_row, cos, sin, norm, p, pooled,       \
                          threadIdx.x);                                                            \
  }

INDEXER_POOL_ENTRY(f32, float)
INDEXER_POOL_ENTRY(f16, __half)
INDEXER_POOL_ENTRY(bf16, __nv_bfloat16)
