// Grouped quantized GEMM: every expert's product of a MoE projection in ONE launch, as mlx's
// gather_qmm and vLLM's fused MoE do, where the per-expert path costs a dequantization, a
// matmul and a copy per expert in use. The CPU twin (crates/gdn-ops/src/ops/affine_grouped/mod.rs,
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
// LAUNCH: grid (tiles, ceil(rows / kTileN), 1), block (kThreads, 1, 1), dynamic shared memory
//   kSmemBytes (over the 48 KB default: the host raises the function's
//   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it).
// HOST MUST CHECK: bits in {2, 4, 8}; cols % 32 == 0; group_size % 32 == 0 and divides cols;
//   tile_pairs in {16, 32, 64}; x 16-byte aligned (it is copied with 16-byte cp.async); the
//   schedule's entries inside [0, P) and experts < E. An entry that is not (the kernel cannot
//   report it) leaves its rows of y unwritten.
//
// DESIGN: a block owns TM (= tile_pairs) pairs of one expert and kTileN = 128 output rows, and
// walks the columns kTileK = 64 at a time through two shared-memory stages: while the tensor
// cores multiply stage i, the x tile of step i + 1 is in flight with cp.async and the packed
// weight words of step i + 1 are in flight into registers; after the product each thread
// dequantizes its 32 values (one packed load, one scale and bias: 32 columns never cross a
// group) into the other stage as X, so one barrier per step orders everything. A dequantized
// weight tile serves TM x 128 outputs (8 warps: 2 x 4 warps of 2 x 2 fragments at TM 64, of
// 1 x 2 at 32, 1 x 8 warps of one fragment at 16); fragments of pair rows past the tile's
// count are skipped, not multiplied. The grid's (tile, row block) is re-linearized row blocks
// fastest, so the blocks that share a tile's x run together and read it from L2.
// f32 activations run the same walk with one stage and FMAs ((TM / 8) x 4 outputs a thread).
// Pair rows past count are zero in shared memory and never written; weight rows past rows are
// zero and never written.
//
// SPLIT-K (the dense products of 9..64 rows, issue 29: one group, one tile): with
// p.slice_steps > 0 the columns are cut into slices of slice_steps steps of kTileK, blockIdx.z
// the slice; entry points affine_grouped_split_<x>_<s> write each block's f32 partial tile into
// partial [slices, P, rows] (slice z at z * P * rows) instead of y, and affine_split_sum_<x>
// adds the slices in order 0, 1, .. (the same bits every run: no float atomics) into y in X.
// A matrix of 2 048 outputs has 16 row blocks: cut into 16 slices it fills the GPU's SMs.
// LAUNCH (split): grid (tiles, ceil(rows / kTileN), slices); the sum: grid (ceil(P * rows /
//   kSumThreads), 1, 1), block (kSumThreads, 1, 1); slices = ceil(steps / slice_steps), every
//   slice holding at least one step (the host's choice).
//
// Compile for candle: nvcc -ptx -arch=sm_90 -O3 kernels/affine_grouped.cu (sm_80+: bf16 wmma,
// cp.async).
// The body (affine_grouped::grouped_kernel) takes its thread and block indices and its shared
// memory as arguments, so that kernels/emu/affine_grouped_cuda_harness.cpp runs it on the CPU
// (crates/gdn-ops/tests/affine_grouped_cuda_emulation.rs).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>
#include <mma.h>
#include <stdint.h>
#include <string.h>

#include "params/affine_grouped.h"
#include "cuda_convert.h"

namespace affine_grouped {

using namespace nvcuda;

constexpr int kTileM = 64;          // pairs per tile, at most (TM <= kTileM)
constexpr int kTileN = 128;         // output rows per block
constexpr int kTileK = 64;          // columns per step (the last step of a matrix may hold 32)
constexpr int kSpan = 32;           // columns one thread dequantizes per step: inside one group
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kLdK = kTileK + 8;    // padded rows of the x and weight tiles: 32-byte wmma
                                    // alignment kept, banks spread
constexpr int kLdOut = kTileN + 4;  // padded rows of the f32 accumulator staging
constexpr int kTileEntry = 3;       // u32 per schedule entry: expert, first pair, count
constexpr int kMaxWords = 8;        // packed words of one thread's span at 8 bits
static_assert(kThreads == 2 * kTileN, "two threads per weight row, one span each");
static_assert(kTileK == 2 * kSpan, "a step is two spans");

// A stage: the x tile [kTileM][kLdK], then the weight tile [kTileN][kLdK], in X.
constexpr int kStageElems = (kTileM + kTileN) * kLdK;
template <typename X>
__host__ __device__ constexpr int stages() {
  return sizeof(X) == 2 ? 2 : 1;  // f32 operands: one stage fills the same memory
}
constexpr int kSmemBytes = 2 * kStageElems * 2;
static_assert(kStageElems * 4 <= kSmemBytes, "one f32 stage fits");
static_assert(kTileM * kLdOut * 4 <= kSmemBytes, "the f32 output staging fits in the stages");

using cuda_convert::from_f32;
using cuda_convert::to_f32;

// s * q + b in f32, rounded as the reference rounds (a multiply, then an add). With 16-bit
// scales s * q (at most 11 x 8 significant bits) is exact in f32, so one FMA rounds the same.
template <typename S>
__device__ __forceinline__ float dequantize_value(uint32_t q, float s, float b) {
  // q as a float without a conversion instruction: 2^23 + q has q in its low mantissa bits.
  const float qf = __uint_as_float(0x4B000000u | q) - 8388608.0f;
  if (sizeof(S) == 2) return fmaf(s, qf, b);
  return __fadd_rn(__fmul_rn(s, qf), b);
}

// One thread's share of a step's weights in flight: the packed words of its kSpan columns of one
// weight row, and their group's scale and bias.
struct WeightSpan {
  uint32_t words[kMaxWords];
  float s, b;
};

// The packed words of a span: 32 * BITS / 32 = BITS words, vector loads where aligned.
template <uint32_t BITS>
__device__ __forceinline__ void load_words(const uint32_t* __restrict__ src, bool aligned, uint32_t* words) {
  if (BITS == 2 && aligned) {
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    words[0] = v.x, words[1] = v.y;
  } else if (BITS >= 4 && aligned) {
#pragma unroll
    for (uint32_t i = 0; i < BITS; i += 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(src + i);
      words[i] = v.x, words[i + 1] = v.y, words[i + 2] = v.z, words[i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (uint32_t i = 0; i < BITS; ++i) words[i] = src[i];
  }
}

// Two values as X, packed in one word (the lower one first, as memory holds them).
template <typename X>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// 16 bytes of X into shared memory: 8 values (16-bit X) or 4 (f32).
template <typename X>
__device__ __forceinline__ void store16(X* dst, const float* v) {
  if constexpr (sizeof(X) == 4) {
    *reinterpret_cast<uint4*>(dst) =
        make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
  } else {
    *reinterpret_cast<uint4*>(dst) =
        make_uint4(pack2<X>(v[0], v[1]), pack2<X>(v[2], v[3]), pack2<X>(v[4], v[5]), pack2<X>(v[6], v[7]));
  }
}

// A span's values dequantized into shared memory as X, 16 bytes at a time (so that few values
// are live at once); zeros for a weight row past the matrix.
template <uint32_t BITS, typename X, typename S>
__device__ __forceinline__ void dequantize_span(const WeightSpan& in, bool zero, X* dst) {
  constexpr uint32_t kPerWord = 32 / BITS, kMask = (1u << BITS) - 1u, kPerStore = 16 / sizeof(X);
#pragma unroll
  for (uint32_t c = 0; c < (uint32_t)kSpan; c += kPerStore) {
    float v[kPerStore];
#pragma unroll
    for (uint32_t j = 0; j < kPerStore; ++j) {
      const uint32_t i = c + j;
      const uint32_t q = (in.words[i / kPerWord] >> (i % kPerWord * BITS)) & kMask;
      v[j] = zero ? 0.0f : dequantize_value<S>(q, in.s, in.b);
    }
    store16<X>(dst + c, v);
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

  __device__ void step(const float* xs, const float* ws, int tid, uint32_t, int width) {
    const int tm = tid / 32, tn = tid % 32;
#pragma unroll 4
    for (int k = 0; k < width; ++k) {
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
    const int tm = tid / 32, tn = tid % 32;
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

  // Fragment rows at or past count hold no pair: neither loaded nor multiplied (warp-uniform).
  __device__ void step(const H* xs, const H* ws, int tid, uint32_t count, int width) {
    const int m0 = row0(tid), n0 = col0(tid);
    if (uint32_t(m0) >= count) return;
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      if (kk >= width) break;
      FragB b[kFragsN];
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) wmma::load_matrix_sync(b[j], ws + (n0 + j * 16) * kLdK + kk, kLdK);
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
        if (uint32_t(m0 + i * 16) < count) {
          FragA a;
          wmma::load_matrix_sync(a, xs + (m0 + i * 16) * kLdK + kk, kLdK);
#pragma unroll
          for (int j = 0; j < kFragsN; ++j) wmma::mma_sync(c[i][j], a, b[j], c[i][j]);
        }
      }
    }
  }

  // y in H (one slice: the products) or f32 (a split-K slice's partial sums).
  template <typename Y>
  __device__ void store(Y* y, const AffineGroupedParams& p, uint32_t first, uint32_t count, uint32_t n0,
                        int tid, unsigned char* smem) {
    float* stage = reinterpret_cast<float*>(smem);
    const int m0 = row0(tid), c0 = col0(tid);
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
      if (uint32_t(m0 + i * 16) < count)
#pragma unroll
        for (int j = 0; j < kFragsN; ++j)
          wmma::store_matrix_sync(stage + (m0 + i * 16) * kLdOut + c0 + j * 16, c[i][j], kLdOut, wmma::mem_row_major);
    __syncthreads();
    // 8 outputs (16 bytes) a thread and turn, as whole vectors where the row allows.
    constexpr int kVec = 8, kPerRow = kTileN / kVec;
    const bool aligned = p.rows % kVec == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
    for (int at = tid; at < TM * kPerRow; at += kThreads) {
      const uint32_t m = at / kPerRow, n = n0 + at % kPerRow * kVec;
      if (m >= count || n >= p.rows) continue;
      const float* src = stage + m * kLdOut + at % kPerRow * kVec;
      Y* dst = y + (size_t)(first + m) * p.rows + n;
      if constexpr (sizeof(Y) == 4) {
        for (uint32_t i = 0; i < (uint32_t)kVec && n + i < p.rows; ++i) dst[i] = src[i];
      } else if (aligned) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(pack2<H>(src[0], src[1]), pack2<H>(src[2], src[3]),
                                                    pack2<H>(src[4], src[5]), pack2<H>(src[6], src[7]));
      } else {
        for (uint32_t i = 0; i < (uint32_t)kVec && n + i < p.rows; ++i) dst[i] = from_f32<Y>(src[i]);
      }
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

// The pair tile and output rows of one block, and where its step's operands live.
template <typename X, typename S, int TM>
struct Block {
  const uint32_t* __restrict__ packed;
  const S* __restrict__ scales;
  const S* __restrict__ biases;
  const X* __restrict__ x;
  AffineGroupedParams p;
  uint32_t e, first, count, n0;
  uint32_t step0, step_end;  // the steps of kTileK columns this block walks (its slice)
  int tid;
  bool words_aligned;

  // The x tile of the step at column k0 into xs with cp.async (zeros for pair rows past count
  // and columns past cols); the caller commits.
  __device__ void copy_x(X* xs, uint32_t k0) const {
    constexpr int kPerChunk = 16 / int(sizeof(X)), kChunks = kTileK / kPerChunk;
    for (int at = tid; at < TM * kChunks; at += kThreads) {
      const uint32_t m = at / kChunks, k = at % kChunks * kPerChunk;
      const bool live = m < count && k0 + k < p.cols;
      const X* src = live ? x + (size_t)(first + m) * p.cols + k0 + k : x;
      __pipeline_memcpy_async(xs + m * kLdK + k, src, 16, live ? 0 : 16);
    }
  }

  // This thread's weight span of the step at column k0 (row n0 + tid / 2, columns k0 +
  // (tid % 2) * kSpan ..): its packed words, scale and bias, into registers.
  template <uint32_t BITS>
  __device__ void load_span(uint32_t k0, WeightSpan& out) const {
    const uint32_t r = n0 + tid / 2, k = k0 + tid % 2 * kSpan;
    if (r >= p.rows || k >= p.cols) return;
    const size_t row = (size_t)e * p.rows + r;
    const size_t words_per_row = p.cols * BITS / 32;
    load_words<BITS>(packed + row * words_per_row + k * BITS / 32, words_aligned, out.words);
    const size_t g = row * (p.cols / p.group_size) + k / p.group_size;
    out.s = to_f32(scales[g]);
    out.b = to_f32(biases[g]);
  }

  // The span into the weight tile ws as X (zeros for rows past rows; nothing for columns past
  // cols, which no step reads).
  template <uint32_t BITS>
  __device__ void store_span_at(X* ws, uint32_t k0, const WeightSpan& in) const {
    const uint32_t n = tid / 2, k = tid % 2 * kSpan;
    if (k0 + k >= p.cols) return;
    dequantize_span<BITS, X, S>(in, n0 + n >= p.rows, ws + n * kLdK + k);
  }

  template <typename Y>
  __device__ void run(Y* y, unsigned char* smem) const {
    if (count > (uint32_t)TM) return;
    switch (p.bits) {
      case 4: walk<4, Y>(y, smem); break;
      case 8: walk<8, Y>(y, smem); break;
      default: walk<2, Y>(y, smem); break;
    }
  }

  template <uint32_t BITS, typename Y>
  __device__ void walk(Y* y, unsigned char* smem) const {
    constexpr int kStages = stages<X>();
    X* base = reinterpret_cast<X*>(smem);
    auto xs = [&](int s) { return base + s * kStageElems; };
    auto ws = [&](int s) { return base + s * kStageElems + kTileM * kLdK; };
    typename AccumFor<X, TM>::type acc;
    acc.zero();
    WeightSpan span;
    copy_x(xs(0), step0 * kTileK);
    __pipeline_commit();
    load_span<BITS>(step0 * kTileK, span);
    store_span_at<BITS>(ws(0), step0 * kTileK, span);
    for (uint32_t i = step0; i < step_end; ++i) {
      const int cur = kStages == 2 ? int((i - step0) % 2) : 0, next = kStages == 2 ? 1 - cur : 0;
      const uint32_t k0 = i * kTileK;
      const bool more = i + 1 < step_end;
      if (more) load_span<BITS>(k0 + kTileK, span);  // in flight during the product
      __pipeline_wait_prior(0);
      __syncthreads();  // stage cur complete; every thread done with stage next's last product
      if (kStages == 2 && more) {
        copy_x(xs(next), k0 + kTileK);
        __pipeline_commit();
      }
      const int width = p.cols - k0 < (uint32_t)kTileK ? int(p.cols - k0) : kTileK;
      acc.step(xs(cur), ws(cur), tid, count, width);
      if (more) {
        if (kStages == 1) {
          __syncthreads();  // one stage: every product done before it is overwritten
          copy_x(xs(next), k0 + kTileK);
          __pipeline_commit();
        }
        store_span_at<BITS>(ws(next), k0 + kTileK, span);
      }
    }
    __syncthreads();  // every product done: the stages become the output staging
    acc.store(y, p, first, count, n0, tid, smem);
  }
};

// The body of every entry point: block (tile, row_block) of the grid, re-linearized so that
// consecutive blocks take the row blocks of one tile (they share its x tile in L2).
// Y is X (y, the products) or float (split-K: grid_slice's partial sums, p.slice_steps > 0).
template <typename X, typename S, typename Y = X>
__device__ void grouped_kernel(const uint32_t* __restrict__ packed, const S* __restrict__ scales,
                               const S* __restrict__ biases, const X* __restrict__ x,
                               const uint32_t* __restrict__ tiles, Y* __restrict__ y, const AffineGroupedParams p,
                               const int tid, const unsigned grid_tile, const unsigned grid_row_block,
                               unsigned char* smem, const unsigned grid_slice = 0) {
  const uint32_t row_blocks = (p.rows + kTileN - 1) / kTileN;
  const uint64_t linear = (uint64_t)grid_row_block * p.tiles + grid_tile;
  const uint32_t tile = uint32_t(linear / row_blocks), row_block = uint32_t(linear % row_blocks);
  if (tile >= p.tiles) return;
  const uint32_t e = tiles[kTileEntry * tile], first = tiles[kTileEntry * tile + 1],
                 count = tiles[kTileEntry * tile + 2];
  // The host builds the schedule; an entry outside the bounds is skipped, never followed.
  if (e >= p.experts || count == 0 || first > p.pairs || count > p.pairs - first) return;
  const bool words_aligned = reinterpret_cast<uintptr_t>(packed) % 16 == 0;
  const uint32_t n0 = row_block * kTileN;
  const uint32_t steps = (p.cols + kTileK - 1) / kTileK;
  uint32_t step0 = 0, step_end = steps;
  if (p.slice_steps > 0) {
    // Slice grid_slice's steps, and its partial sums' plane of the workspace.
    step0 = grid_slice * p.slice_steps;
    if (step0 >= steps) return;  // no such slice (the host launches none)
    step_end = step0 + p.slice_steps < steps ? step0 + p.slice_steps : steps;
    y += (size_t)grid_slice * p.pairs * p.rows;
  }
  switch (p.tile_pairs) {
    case 16: Block<X, S, 16>{packed, scales, biases, x, p, e, first, count, n0, step0, step_end, tid, words_aligned}.run(y, smem); break;
    case 32: Block<X, S, 32>{packed, scales, biases, x, p, e, first, count, n0, step0, step_end, tid, words_aligned}.run(y, smem); break;
    default: Block<X, S, kTileM>{packed, scales, biases, x, p, e, first, count, n0, step0, step_end, tid, words_aligned}.run(y, smem); break;
  }
}

constexpr int kSumThreads = 256;

// Split-K's second launch: y[i] = X(partial[0][i] + partial[1][i] + ...), the slices in order,
// so that the sum's bits do not depend on which block finished first.
template <typename X>
__device__ void split_sum_kernel(const float* __restrict__ partial, X* __restrict__ y, const uint32_t n,
                                 const uint32_t slices, const uint64_t i) {
  if (i >= n) return;
  float sum = partial[i];
  for (uint32_t s = 1; s < slices; ++s) sum += partial[(size_t)s * n + i];
  y[i] = from_f32<X>(sum);
}

}  // namespace affine_grouped

// Blocks per SM the registers must allow (__launch_bounds__' second argument); a build may
// override it to compare occupancies (scripts/gpu/bench-grouped-gemm.sh).
#ifndef AFFINE_GROUPED_MIN_BLOCKS
#define AFFINE_GROUPED_MIN_BLOCKS 1
#endif

#define AFFINE_GROUPED_ENTRY(XN, XT, SN, ST)                                                                  \
  extern "C" __global__ void __launch_bounds__(affine_grouped::kThreads, AFFINE_GROUPED_MIN_BLOCKS)        \
      affine_grouped_##XN##_##SN(                                                                            \
      const uint32_t* packed, const ST* scales, const ST* biases, const XT* x, const uint32_t* tiles, XT* y, \
      const AffineGroupedParams p) {                                                                          \
    extern __shared__ __align__(128) unsigned char affine_grouped_smem[];                                     \
    affine_grouped::grouped_kernel<XT, ST>(packed, scales, biases, x, tiles, y, p, threadIdx.x, blockIdx.x,    \
                                           blockIdx.y, affine_grouped_smem);                                  \
  }

// Split-K's launch aims at two blocks per SM (ops/affine_grouped/split_k.rs, TARGET_BLOCKS):
// the registers must allow them (128 a thread; the bf16 body uses 128 unbounded).
#ifndef AFFINE_GROUPED_SPLIT_MIN_BLOCKS
#define AFFINE_GROUPED_SPLIT_MIN_BLOCKS 2
#endif

// Split-K: the same body, each block's f32 partial sums into partial (grid z: the slice).
#define AFFINE_GROUPED_SPLIT_ENTRY(XN, XT, SN, ST)                                                            \
  extern "C" __global__ void __launch_bounds__(affine_grouped::kThreads, AFFINE_GROUPED_SPLIT_MIN_BLOCKS)  \
      affine_grouped_split_##XN##_##SN(                                                                      \
      const uint32_t* packed, const ST* scales, const ST* biases, const XT* x, const uint32_t* tiles,       \
      float* partial, const AffineGroupedParams p) {                                                          \
    extern __shared__ __align__(128) unsigned char affine_grouped_smem[];                                     \
    affine_grouped::grouped_kernel<XT, ST, float>(packed, scales, biases, x, tiles, partial, p, threadIdx.x,  \
                                                  blockIdx.x, blockIdx.y, affine_grouped_smem, blockIdx.z);   \
  }

#define AFFINE_GROUPED_FOR_SCALES(XN, XT)               \
  AFFINE_GROUPED_ENTRY(XN, XT, f32, float)              \
  AFFINE_GROUPED_ENTRY(XN, XT, f16, __half)             \
  AFFINE_GROUPED_ENTRY(XN, XT, bf16, __nv_bfloat16)     \
  AFFINE_GROUPED_SPLIT_ENTRY(XN, XT, f32, float)        \
  AFFINE_GROUPED_SPLIT_ENTRY(XN, XT, f16, __half)       \
  AFFINE_GROUPED_SPLIT_ENTRY(XN, XT, bf16, __nv_bfloat16)

#define AFFINE_SPLIT_SUM_ENTRY(XN, XT)                                                                       \
  extern "C" __global__ void __launch_bounds__(affine_grouped::kSumThreads)                                 \
      affine_split_sum_##XN(const float* partial, XT* y, const uint32_t n, const uint32_t slices) {          \
    affine_grouped::split_sum_kernel<XT>(partial, y, n, slices,                                               \
                                         (uint64_t)blockIdx.x * affine_grouped::kSumThreads + threadIdx.x);  \
  }

AFFINE_SPLIT_SUM_ENTRY(f32, float)
AFFINE_SPLIT_SUM_ENTRY(f16, __half)
AFFINE_SPLIT_SUM_ENTRY(bf16, __nv_bfloat16)

AFFINE_GROUPED_FOR_SCALES(f32, float)
AFFINE_GROUPED_FOR_SCALES(f16, __half)
AFFINE_GROUPED_FOR_SCALES(bf16, __nv_bfloat16)
