// Causal prefill attention in one kernel (flash attention's forward pass): the queries of a
// chunk over the cached keys, with an online softmax, so that no score matrix ever reaches
// global memory. crates/gdn-ops/src/ops/attn_prefill/cpu.rs is the reference it must match,
// and crates/gdn-ops/src/ops/attn_prefill/mod.rs states the maths and rounding.
//
// ENTRY POINTS (extern "C"; <t> in {f16, bf16}):
//   attn_prefill_<t>(const T* q, const T* k, const T* v, T* out, AttnPrefillParams p)
//   q, out [B, Nq, S, Dh] contiguous; k, v rows of Dh contiguous values at the strides of p
//   (views of the KV cache: [B, Nkv, T, Dh] narrowed from its capacity); every row start
//   16-byte aligned (the host checks: strides and view starts multiples of 8 elements).
// LAUNCH: grid (ceil(S / 64), Nq, B), blocks of 128 threads (kThreads), dynamic shared memory
//   smem_bytes(Dh) (over 48 KB: the host raises CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
//
// DESIGN. A block takes 64 query rows (kRows) of one query head; its KV head is
// h / (Nq / Nkv). Its 4 warps take 16 rows each. It walks the keys 0..min(T, offset + last row
// + 1) in tiles of 64 (kKeys), the causal limit of its last row; only the tiles that cross the
// diagonal mask anything. Per tile:
//   1. K tile -> shared memory (cp.async, issued at the end of the previous tile);
//   2. each warp: S = Q K^T on tensor cores (wmma 16x16x16, f32 accumulators), 16 x 64;
//   3. the V tile is copied into the buffer K leaves (all warps done with K) while
//   4. each warp stores S to its scratch and 2 lanes per row do the online softmax: scores
//      rounded as the composed path rounds them, masked, running max m and sum l in f32,
//      p = exp(s - m) written back as InT, and the factor exp(m_old - m) by which the output
//      so far shrinks;
//   5. O (16 x Dh per warp, in f32 accumulator fragments: 128 registers a thread at Dh 256)
//      is scaled by that factor and O += P V on tensor cores.
// The accumulator layout is opaque, so a per-row factor is applied as an elementwise product
// with a fragment loaded from a 16x16 matrix whose row r holds row r's factor (fragments of
// one type share one layout). At the end O / l is written once, rounded to InT.
// Shared memory (Dh 256): Q 64 x 264 and one K/V tile 64 x 264 in InT (rows padded by 8
// elements so that the 16-byte rows of a fragment fall in distinct banks), and a 16 x 68 f32
// scratch per warp (scores, then probabilities and factors): 84 992 bytes, two blocks an SM.
// Query tiles run heaviest first (blockIdx.x 0 is the last tile): the causal work per tile
// grows with its row, and the long ones should not be the stragglers.
//
// The body (attn_prefill::run) takes its thread and block indices and its shared memory as
// arguments, so that kernels/emu/attn_prefill_cuda_harness.cpp runs it on the CPU
// (kernels/emu/cuda/cuda_emu.h).
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/attn_prefill.cu

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>
#include <mma.h>
#include <stdint.h>

#include "params/attn_prefill.h"
#include "cuda_convert.h"

namespace attn_prefill {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

constexpr unsigned kRows = 64;                 // query rows per block
constexpr unsigned kKeys = 64;                 // keys per tile
constexpr unsigned kWarps = kRows / 16;        // 16 rows a warp
constexpr unsigned kThreads = kWarps * 32;
constexpr unsigned kMaxDh = 256;
constexpr unsigned kMaxFrags = kMaxDh / 16;    // output fragments a warp holds at Dh 256
constexpr unsigned kPad = 8;                   // InT elements of padding per Q/K/V row
constexpr unsigned kScoreLd = kKeys + 4;       // f32 scores per scratch row
constexpr unsigned kProbLd = kKeys + 8;        // InT probabilities per scratch row
constexpr unsigned kScratchFloats = 16 * kScoreLd;
// The 16x16 f32 matrix of row factors sits after the probabilities (16 rows of kProbLd
// 2-byte values) in a warp's scratch.
constexpr unsigned kFactorAt = 16 * kProbLd * 2 / 4;
static_assert(kFactorAt + 256 <= kScratchFloats, "probabilities and factors fit the scratch");
static_assert(kFactorAt % 8 == 0, "the factor matrix is 32-byte aligned");

// Bytes of dynamic shared memory for head dim dh (2-byte InT).
__host__ __device__ constexpr unsigned smem_bytes(unsigned dh) {
  return 2 * kRows * (dh + kPad) * 2 + kWarps * kScratchFloats * 4;
}

constexpr float kLog2e = 1.4426950408889634f;

// A copy of rows first..first+kRows of a head (row r at src + r * row_stride) into dst (row r
// at dst + r * ld), 16 bytes a copy; rows at or past `limit` are zero-filled, so that no
// masked product meets NaN or stale data. Committed as one cp.async group.
template <typename T>
__device__ __forceinline__ void copy_rows(T* dst, unsigned ld, const T* src, size_t row_stride,
                                          unsigned first, unsigned limit, unsigned dh,
                                          unsigned tid) {
  const unsigned chunks = dh / 8;
  for (unsigned i = tid; i < kRows * chunks; i += kThreads) {
    const unsigned r = i / chunks, c = i % chunks;
    const bool inside = first + r < limit;
    const T* from = inside ? src + (size_t)(first + r) * row_stride + c * 8 : src;
    __pipeline_memcpy_async(dst + r * ld + c * 8, from, 16, inside ? 0 : 16);
  }
  __pipeline_commit();
}

// InT rounding of an f32 value, as the composed path's stores round.
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_f32(from_f32<T>(x));
}

template <typename T>
__device__ void run(const T* q, const T* k, const T* v, T* out, const AttnPrefillParams p,
                    unsigned block_x, unsigned h, unsigned b, unsigned tid, float* smem) {
  using namespace nvcuda;
  static_assert(sizeof(T) == 2, "f16 and bf16 (tensor-core operands)");
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
  using FragKt = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
  using FragV = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
  using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

  const unsigned dh = p.head_dim, ld = dh + kPad, frags = dh / 16;
  const unsigned warp = tid / 32, lane = tid % 32;
  const unsigned q_tile = p.q_tiles - 1 - block_x;  // heaviest first
  const unsigned row0 = q_tile * kRows;
  const unsigned kvh = h / (p.q_heads / p.kv_heads);

  T* q_smem = reinterpret_cast<T*>(smem);
  T* kv_smem = q_smem + kRows * ld;
  float* scratch = reinterpret_cast<float*>(kv_smem + kRows * ld) + warp * kScratchFloats;
  T* probs = reinterpret_cast<T*>(scratch);  // over the scores, once every lane has read them
  float* factors = scratch + kFactorAt;

  const T* q_head = q + ((size_t)b * p.q_heads + h) * p.queries * dh;
  const T* k_head = k + (size_t)b * p.k_batch_stride + (size_t)kvh * p.k_head_stride;
  const T* v_head = v + (size_t)b * p.v_batch_stride + (size_t)kvh * p.v_head_stride;

  // Keys the block sees: up to its last row's causal limit.
  const unsigned last_row = min(row0 + kRows, p.queries) - 1;
  const unsigned key_end = min(p.keys, p.offset + last_row + 1);
  const unsigned tiles = (key_end + kKeys - 1) / kKeys;

  // This lane's row of the softmax (two lanes a row, 32 keys each) and its key limit.
  const unsigned row = lane / 2, half = lane % 2;
  const unsigned query = row0 + warp * 16 + row;
  const unsigned limit = min(p.keys, p.offset + query + 1);

  copy_rows(q_smem, ld, q_head, dh, row0, p.queries, dh, tid);
  copy_rows(kv_smem, ld, k_head, p.k_row_stride, 0, p.keys, dh, tid);

  FragAcc o[kMaxFrags];
#pragma unroll
  for (unsigned n = 0; n < kMaxFrags; ++n) wmma::fill_fragment(o[n], 0.f);
  // Key 0 is open to every row and sits in the first tile, so m is finite after it.
  float m = -INFINITY, l = 0.f;
  const T* q_rows = q_smem + warp * 16 * ld;

  for (unsigned tile = 0; tile < tiles; ++tile) {
    const unsigned key0 = tile * kKeys;
    __pipeline_wait_prior(0);
    __syncthreads();  // the K tile (and Q) in shared memory

    // 2. S = Q K^T for the warp's 16 rows.
    FragAcc s[kKeys / 16];
#pragma unroll
    for (unsigned n = 0; n < kKeys / 16; ++n) wmma::fill_fragment(s[n], 0.f);
    for (unsigned kk = 0; kk < frags; ++kk) {
      FragA a;
      wmma::load_matrix_sync(a, q_rows + kk * 16, ld);
#pragma unroll
      for (unsigned n = 0; n < kKeys / 16; ++n) {
        FragKt bt;
        wmma::load_matrix_sync(bt, kv_smem + n * 16 * ld + kk * 16, ld);
        wmma::mma_sync(s[n], a, bt, s[n]);
      }
    }
    __syncthreads();  // every warp done with K: V may take its place
    // 3. V streams in while the softmax runs.
    copy_rows(kv_smem, ld, v_head, p.v_row_stride, key0, p.keys, dh, tid);
#pragma unroll
    for (unsigned n = 0; n < kKeys / 16; ++n)
      wmma::store_matrix_sync(scratch + n * 16, s[n], kScoreLd, wmma::mem_row_major);
    __syncwarp();

    // 4. Online softmax of this lane's 32 scores. Rounded as the composed path rounds: the
    // product to InT, then its product with the InT scale to InT.
    float x[kKeys / 2];
    float tile_max = -INFINITY;
#pragma unroll
    for (unsigned j = 0; j < kKeys / 2; ++j) {
      const unsigned col = half * (kKeys / 2) + j;
      const float score = round_to<T>(round_to<T>(scratch[row * kScoreLd + col]) * p.scale);
      x[j] = key0 + col < limit ? score : -INFINITY;
      tile_max = fmaxf(tile_max, x[j]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float factor = exp2f((m - m_new) * kLog2e);  // 0 at the first tile (m = -inf)
    float sum = 0.f;
#pragma unroll
    for (unsigned j = 0; j < kKeys / 2; ++j) {
      x[j] = exp2f((x[j] - m_new) * kLog2e);  // 0 where masked
      sum += x[j];
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * factor + sum;
    m = m_new;
    __syncwarp();  // every lane has read its scores: probabilities go over them
#pragma unroll
    for (unsigned j = 0; j < kKeys / 2; ++j) probs[row * kProbLd + half * (kKeys / 2) + j] = from_f32<T>(x[j]);
#pragma unroll
    for (unsigned j = 0; j < 8; ++j) factors[row * 16 + half * 8 + j] = factor;
    __syncwarp();

    // 5. O = O * factor + P V.
    FragAcc f;
    wmma::load_matrix_sync(f, factors, 16, wmma::mem_row_major);
#pragma unroll
    for (unsigned n = 0; n < kMaxFrags; ++n) {
      if (n < frags) {
        for (int e = 0; e < f.num_elements; ++e) o[n].x[e] *= f.x[e];
      }
    }
    __pipeline_wait_prior(0);
    __syncthreads();  // the V tile in shared memory
#pragma unroll
    for (unsigned kk = 0; kk < kKeys / 16; ++kk) {
      FragA a;
      wmma::load_matrix_sync(a, probs + kk * 16, kProbLd);
#pragma unroll
      for (unsigned n = 0; n < kMaxFrags; ++n) {
        if (n < frags) {
          FragV bv;
          wmma::load_matrix_sync(bv, kv_smem + kk * 16 * ld + n * 16, ld);
          wmma::mma_sync(o[n], a, bv, o[n]);
        }
      }
    }
    __syncthreads();  // every warp done with V: the next K may take its place
    if (tile + 1 < tiles) copy_rows(kv_smem, ld, k_head, p.k_row_stride, key0 + kKeys, p.keys, dh, tid);
  }

  // O / l, rounded to InT once. Rows past S (a partial last tile) are not written.
  for (unsigned j = 0; j < 8; ++j) factors[row * 16 + half * 8 + j] = 1.f / l;
  __syncwarp();
  FragAcc f;
  wmma::load_matrix_sync(f, factors, 16, wmma::mem_row_major);
  T* out_rows = out + (((size_t)b * p.q_heads + h) * p.queries + query) * dh;
#pragma unroll
  for (unsigned n = 0; n < kMaxFrags; ++n) {
    if (n < frags) {
      for (int e = 0; e < f.num_elements; ++e) o[n].x[e] *= f.x[e];
      wmma::store_matrix_sync(scratch, o[n], 16, wmma::mem_row_major);
      __syncwarp();
      if (query < p.queries) {
#pragma unroll
        for (unsigned j = 0; j < 8; ++j) out_rows[n * 16 + half * 8 + j] = from_f32<T>(scratch[row * 16 + half * 8 + j]);
      }
      __syncwarp();  // every lane has read the fragment before the next goes over it
    }
  }
}

}  // namespace attn_prefill

#define ATTN_PREFILL_ENTRY(name, T)                                                                    \
  extern "C" __global__ void __launch_bounds__(attn_prefill::kThreads, 2)                              \
      name(const T* q, const T* k, const T* v, T* out, const AttnPrefillParams p) {                    \
    extern __shared__ __align__(128) float attn_prefill_smem[];                                        \
    attn_prefill::run<T>(q, k, v, out, p, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x,             \
                         attn_prefill_smem);                                                           \
  }

ATTN_PREFILL_ENTRY(attn_prefill_f16, __half)
ATTN_PREFILL_ENTRY(attn_prefill_bf16, __nv_bfloat16)
