// Grouped quantized GEMM: every expert's product of a MoE projection in ONE launch, as mlx's
// gather_qmm and vLLM's fused MoE do, where the per-expert path costs a dequantization, a
// matmul and a copy per expert in use. The CPU twin (crates/gdn-ops/src/ops/affine/grouped.rs,
// per expert: dequantize, round to X, multiply in f32) is the reference it must match.
//
// x [P, cols] holds the MoE pairs sorted by expert; expert e's rows are offsets[e] ..
// offsets[e + 1]. y [P, rows]: y[p, r] = X(sum_j w_e[r, j] * x[p, j]), with w the MLX affine
// dequantization (w = s * q + b per group of group_size columns, a multiply then an add as the
// CPU reference rounds) rounded once into X before the product, and f32 sums.
//
// ENTRY POINTS (extern "C"): affine_grouped_<x>_<s>, <x> (X of x and y) and <s> (scales and
// biases) in {f32, f16, bf16}.
// SIGNATURE: (const uint32_t* packed [E * rows, cols * bits / 32], const S* scales,
//             const S* biases [E * rows, cols / group_size], const X* x [P, cols],
//             const uint32_t* tiles [tiles, 3], X* y [P, rows], AffineGroupedParams p (by value,
//             kernels/params/affine_grouped.h)).
// THE TILE SCHEDULE (built on the host from the offsets): entry t = (expert, first pair,
//   count), 1 <= count <= p.tile_pairs; every pair of every expert in exactly one entry.
//   Experts without pairs have no entry, so no block reads their weights. p.tile_pairs is 16,
//   32 or 64 (the host picks the smallest that holds an average expert's pairs: a short chunk
//   spreads ~10 pairs over each expert, and a 64-pair tile would be mostly padding).
// LAUNCH: grid (tiles, ceil(rows / kTileN), 1), block (kThreads, 1, 1), static shared memory
//   kSmemBytes (under the 48 KB that needs no opt-in).
// HOST MUST CHECK: bits in {2, 4, 8}; cols % 32 == 0; group_size % 32 == 0 and divides cols;
//   tile_pairs in {16, 32, 64}; the schedule's entries inside [0, P) and experts < E. An entry
//   that is not (the kernel cannot report it) leaves its rows of y unwritten.
//
// DESIGN: a block owns TM (= tile_pairs) pairs of one expert and kTileN output rows. It walks
// the columns kTileK at a time: stages the x tile, dequantizes the matching weight tile (one
// scale and bias per weight row: kTileK divides the group size) into shared memory in X, and
// multiplies. For f16 and bf16 the product runs on wmma m16n16k16 tensor cores with f32
// accumulators (4 warps over the TM x 64 tile: 2 x 2 warps of 2 x 2 fragments at TM 64, 2 x 2
// warps of 1 x 2 at 32, 1 x 4 warps of one fragment at 16), staged through shared memory to
// write only the tile's own pairs; for f32 each thread sums a (TM / 8) x 4 patch with FMAs.
// Pair rows past count and weight rows past rows are zero in shared memory and never written.
//
// Compile for candle: nvcc -ptx -arch=sm_90 -O3 kernels/affine_grouped.cu (sm_80+: bf16 wmma).
// The body (affine_grouped::grouped_kernel) takes its thread and block indices and its shared
// memory as arguments, so that kernels/emu/affine_grouped_cuda_harness.cpp runs it on the CPU
// (crates/gdn-ops/tests/affine_grouped_cuda_emulation.rs).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <stdint.h>

#include "params/affine_grouped.h"
#include "cuda_convert.h"

namespace affine_grouped {

using namespace nvcuda;

constexpr int kTileM = 64;          // pairs per tile, at most (TM <= kTileM)
constexpr int kTileN = 64;          // output rows per block
constexpr int kTileK = 32;          // columns per step: within one quantization group
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kLdK = kTileK + 8;    // padded rows of the x and weight tiles: 32-byte wmma
                                    // alignment kept, banks spread
constexpr int kLdOut = kTileN + 4;  // padded rows of the f32 accumulator staging
constexpr int kTileEntry = 3;       // u32 per schedule entry: expert, first pair, count

// x tile and weight tile in X, then (16-bit X only) the f32 staging of the accumulators.
template <typename X>
__host__ __device__ constexpr int operand_bytes() {
  return 2 * kTileM * kLdK * int(sizeof(X));
}
constexpr int kSmemBytes = 2 * kTileM * kLdK * 2 + kTileM * kLdOut * 4;
static_assert(2 * kTileM * kLdK * 4 <= kSmemBytes, "the f32 operands fit");
static_assert(kTileM == kTileN, "x and weight tiles share a shape");

using cuda_convert::from_f32;
using cuda_convert::to_f32;

// The values of one packed word, w = s * q + b, rounded once into X.
template <uint32_t BITS, typename X>
__device__ __forceinline__ void dequantize_word(uint32_t word, float s, float b, X* out) {
  constexpr uint32_t kPerWord = 32 / BITS, kMask = (1u << BITS) - 1u;
#pragma unroll
  for (uint32_t j = 0; j < kPerWord; ++j) {
    out[j] = from_f32<X>(__fadd_rn(__fmul_rn(s, (float)((word >> (j * BITS)) & kMask)), b));
  }
}

// f32 activations: each thread sums a (TM / 8) x 4 patch of the tile with FMAs.
template <int TM>
struct ScalarAccum {
  static constexpr int kRows = TM / 8;
  float v[kRows][4];

  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) v[i][j] = 0.0f;
  }

  __device__ void step(const float* xs, const float* ws, int tid) {
    const int tm = tid / 16, tn = tid % 16;
#pragma unroll 4
    for (int k = 0; k < kTileK; ++k) {
      float a[kRows], b[4];
#pragma unroll
      for (int i = 0; i < kRows; ++i) a[i] = xs[(tm * kRows + i) * kLdK + k];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[(tn * 4 + j) * kLdK + k];
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) v[i][j] = fmaf(a[i], b[j], v[i][j]);
    }
  }

  __device__ void store(float* y, const AffineGroupedParams& p, uint32_t first, uint32_t count,
                        uint32_t n0, int tid, unsigned char*) {
    const int tm = tid / 16, tn = tid % 16;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const uint32_t m = tm * kRows + i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t n = n0 + tn * 4 + j;
        if (m < count && n < p.rows) y[(size_t)(first + m) * p.rows + n] = v[i][j];
      }
    }
  }
};

// f16 / bf16 activations: tensor cores, kWarpsM x kWarpsN warps over the TM x kTileN tile,
// each owning kFragsM x kFragsN fragments of 16 x 16.
template <typename H, int TM>
struct TensorAccum {
  static constexpr int kWarpsM = TM >= 32 ? 2 : 1;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kFragsM = TM / 16 / kWarpsM;
  static constexpr int kFragsN = kTileN / 16 / kWarpsN;
  static_assert(kFragsM >= 1 && kFragsN >= 1, "every warp owns a fragment");
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, H, wmma::row_major>;
  // The weight tile is [n][k]: as the k x n operand B, element (k, n) at ws[n * kLdK + k].
  using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, H, wmma::col_major>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  Acc c[kFragsM][kFragsN];

  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) wmma::fill_fragment(c[i][j], 0.0f);
  }

  // The first pair row and output row of this warp's fragments.
  __device__ static int row0(int tid) { return (tid / 32 / kWarpsN) * kFragsM * 16; }
  __device__ static int col0(int tid) { return (tid / 32 % kWarpsN) * kFragsN * 16; }

  __device__ void step(const H* xs, const H* ws, int tid) {
    const int m0 = row0(tid), n0 = col0(tid);
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      FragA a[kFragsM];
      FragB b[kFragsN];
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) wmma::load_matrix_sync(a[i], xs + (m0 + i * 16) * kLdK + kk, kLdK);
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) wmma::load_matrix_sync(b[j], ws + (n0 + j * 16) * kLdK + kk, kLdK);
#pragma unroll
      for (int i = 0; i < kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) wmma::mma_sync(c[i][j], a[i], b[j], c[i][j]);
    }
  }

  __device__ void store(H* y, const AffineGroupedParams& p, uint32_t first, uint32_t count, uint32_t n0,
                        int tid, unsigned char* smem) {
    float* stage = reinterpret_cast<float*>(smem + operand_bytes<H>());
    const int m0 = row0(tid), c0 = col0(tid);
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j)
        wmma::store_matrix_sync(stage + (m0 + i * 16) * kLdOut + c0 + j * 16, c[i][j], kLdOut, wmma::mem_row_major);
    __syncthreads();
    for (int at = tid; at < TM * kTileN; at += kThreads) {
      const uint32_t m = at / kTileN, n = n0 + at % kTileN;
      if (m < count && n < p.rows) y[(size_t)(first + m) * p.rows + n] = from_f32<H>(stage[(at / kTileN) * kLdOut + at % kTileN]);
    }
  }
};

template <typename X, int TM>
struct AccumFor {
  using type = TensorAccum<X, TM>;
};
template <int TM>
struct AccumFor<float, TM> {
  using type = ScalarAccum<TM>;
};

template <typename X, typename S, int TM>
__device__ void grouped_tiles(const uint32_t* __restrict__ packed, const S* __restrict__ scales,
                               const S* __restrict__ biases, const X* __restrict__ x,
                               const uint32_t* __restrict__ tiles, X* __restrict__ y, const AffineGroupedParams p,
                               const int tid, const unsigned tile, const unsigned row_block, unsigned char* smem) {
  if (tile >= p.tiles) return;
  const uint32_t e = tiles[kTileEntry * tile], first = tiles[kTileEntry * tile + 1],
                 count = tiles[kTileEntry * tile + 2];
  // The host builds the schedule; an entry outside the bounds is skipped, never followed.
  if (e >= p.experts || count == 0 || count > (uint32_t)TM || first > p.pairs || count > p.pairs - first) return;
  X* xs = reinterpret_cast<X*>(smem);
  X* ws = xs + kTileM * kLdK;
  const uint32_t n0 = row_block * kTileN;
  const uint32_t words_per_row = p.cols * p.bits / 32, groups_per_row = p.cols / p.group_size;
  const uint32_t step_words = kTileK * p.bits / 32;  // words of one weight row per step
  const uint32_t per_word = 32 / p.bits;

  typename AccumFor<X, TM>::type acc;
  acc.zero();
  for (uint32_t k0 = 0; k0 < p.cols; k0 += kTileK) {
    for (int at = tid; at < TM * kTileK; at += kThreads) {
      const uint32_t m = at / kTileK, k = at % kTileK;
      xs[m * kLdK + k] = m < count ? x[(size_t)(first + m) * p.cols + k0 + k] : from_f32<X>(0.0f);
    }
    const uint32_t group = k0 / p.group_size, word0 = k0 * p.bits / 32;
    for (uint32_t at = tid; at < kTileN * step_words; at += kThreads) {
      const uint32_t n = at / step_words, w = at % step_words, r = n0 + n;
      X* out = ws + n * kLdK + w * per_word;
      if (r < p.rows) {
        const size_t row = (size_t)e * p.rows + r;
        const uint32_t word = packed[row * words_per_row + word0 + w];
        const float s = to_f32(scales[row * groups_per_row + group]);
        const float b = to_f32(biases[row * groups_per_row + group]);
        switch (p.bits) {
          case 4: dequantize_word<4>(word, s, b, out); break;
          case 8: dequantize_word<8>(word, s, b, out); break;
          default: dequantize_word<2>(word, s, b, out); break;
        }
      } else {
        for (uint32_t j = 0; j < per_word; ++j) out[j] = from_f32<X>(0.0f);
      }
    }
    __syncthreads();
    acc.step(xs, ws, tid);
    __syncthreads();
  }
  acc.store(y, p, first, count, n0, tid, smem);
}

// The body of every entry point: the tile height the host picked.
template <typename X, typename S>
__device__ void grouped_kernel(const uint32_t* __restrict__ packed, const S* __restrict__ scales,
                               const S* __restrict__ biases, const X* __restrict__ x,
                               const uint32_t* __restrict__ tiles, X* __restrict__ y, const AffineGroupedParams p,
                               const int tid, const unsigned tile, const unsigned row_block, unsigned char* smem) {
  switch (p.tile_pairs) {
    case 16: grouped_tiles<X, S, 16>(packed, scales, biases, x, tiles, y, p, tid, tile, row_block, smem); break;
    case 32: grouped_tiles<X, S, 32>(packed, scales, biases, x, tiles, y, p, tid, tile, row_block, smem); break;
    default: grouped_tiles<X, S, kTileM>(packed, scales, biases, x, tiles, y, p, tid, tile, row_block, smem); break;
  }
}

}  // namespace affine_grouped

#define AFFINE_GROUPED_ENTRY(XN, XT, SN, ST)                                                                  \
  extern "C" __global__ void __launch_bounds__(affine_grouped::kThreads) affine_grouped_##XN##_##SN(          \
      const uint32_t* packed, const ST* scales, const ST* biases, const XT* x, const uint32_t* tiles, XT* y, \
      const AffineGroupedParams p) {                                                                          \
    __shared__ __align__(128) unsigned char smem[affine_grouped::kSmemBytes];                                 \
    affine_grouped::grouped_kernel<XT, ST>(packed, scales, biases, x, tiles, y, p, threadIdx.x, blockIdx.x,    \
                                           blockIdx.y, smem);                                                 \
  }

#define AFFINE_GROUPED_FOR_SCALES(XN, XT)         \
  AFFINE_GROUPED_ENTRY(XN, XT, f32, float)        \
  AFFINE_GROUPED_ENTRY(XN, XT, f16, __half)       \
  AFFINE_GROUPED_ENTRY(XN, XT, bf16, __nv_bfloat16)

AFFINE_GROUPED_FOR_SCALES(f32, float)
AFFINE_GROUPED_FOR_SCALES(f16, __half)
AFFINE_GROUPED_FOR_SCALES(bf16, __nv_bfloat16)
