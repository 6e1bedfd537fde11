// Decode products of 4-bit MLX affine matrices on the tensor cores (CUDA, sm_80+): a bf16 x
// row against a matrix, its gathered experts or its SwiGLU pairs, one `mma.sync` m16n8k16 per
// 16 rows × 16 columns.
//
// Why. The streamed kernels (kernels/affine_stream.cu) spend three instructions a 4-bit value
// (LOP3, FADD, FFMA) and reach 17–34% of the H200's copy bandwidth at the decode shapes: issue
// and memory do not overlap in a wave (docs/perf-notes-gpu.md). Here a value costs ~0.9 of an
// instruction: a word's 8 values become four bf16 pairs with one shift and one LOP3 a pair
// ((w >> 4j) & 0x000F000F) | 0x43004300 is the pair 128 + q, exactly), and the tensor core does
// the products and their sum.
//
// The layout. A warp takes 16 weight rows (lane 4g + t: rows g and g + 8, the mma's A rows) and
// a range of columns in super-steps of 128: lane t loads 16 bytes of each of its two rows,
// columns 128 s + 32 t .. + 32 (a row's four lanes read 64 contiguous bytes). Its 4 words are
// 8 k-steps; since a sum does not care about the order of its terms, the k-step's logical
// columns (2t, 2t + 1, 2t + 8, 2t + 9 of the fragment) are the nibbles (0, 4, 1, 5) or (2, 6, 3,
// 7) of one word, and x is staged in shared memory in that order ([x0 x4 x1 x5 x2 x6 x3 x7] a
// word), so that a lane's B registers for two k-steps are one 16-byte read.
// The scales. A k-step's columns lie in 4 different scale groups (one a lane t), so the B
// operand's 8 columns are used for them: lane (g', t') puts its x values in column g' only when
// g' is the group (mod 8) of its columns, zeros elsewhere; the accumulator's column n then holds
// sum((128 + q) x) over group n alone. Every 8 groups (a "macro" step) each lane applies the
// scales of its two columns (2t, 2t + 1) to its two rows:
//   acc += s (C - 128 sum(x)) + b sum(x),
// the MLX affine sum s sum(q x) + b sum(x) with the pair's offset taken out after the products
// (exact: 128 sum(x) is a power-of-two multiple; C - 128 sum(x) rounds once in f32).
// A block's warps split the columns (each a contiguous range of macro steps, at most
// kMaxWarps), and their sums are added in warp order in shared memory: the same bits run to
// run. The sums are not the streamed kernels' bits (another order, f32 on the tensor core):
// the tests hold them to the f64 reference and the CPU twin within a tolerance.
//
// ENTRY POINTS (extern "C"; x bf16 only, <s> in {f32, f16, bf16}):
//   affine_mma_<kind>_b4_bf16_<s>(packed, scales, biases, x, ids, y, p, experts)
//     <kind> products: y[i, r] for r < p.rows; swiglu: y[i, o] = silu(gate o) * up o, o <
//     p.rows / 2 (gate rows first, then up rows, as the other decode products).
//     The arguments of affine_wide_<kind>_* without lanes-per-row. block = 32 * W threads (W in
//     1..kMaxWarps: the warps splitting the columns); grid = (tiles, p.out_rows): 16 rows a tile
//     (products), 8 outputs (SwiGLU), block x taking tiles x, x + gridDim.x, ...; dynamic shared
//     memory 2 cols + 4 groups + 128 W bytes.
//     The host checks: 4 bits, cols a multiple of 128, group 64 or 128 dividing cols, the
//     packed rows and x 16-byte aligned (crates/gdn-ops/src/ops/affine/mma.rs).
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/affine_mma.cu

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>
#include <stdint.h>

#include "params/affine.h"
#include "cuda_convert.h"

namespace affine_mma {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

constexpr uint32_t kMaxWarps = 16;
constexpr uint32_t kSuperCols = 128;  // columns of a super-step: a row's 4 lanes × 32 values
#ifndef AFFINE_MMA_BATCH
#define AFFINE_MMA_BATCH 2
#endif
#ifndef AFFINE_MMA_STAGES
#define AFFINE_MMA_STAGES 2
#endif
constexpr uint32_t kBatch = AFFINE_MMA_BATCH;    // super-steps a ring stage holds
constexpr uint32_t kStages = AFFINE_MMA_STAGES;  // ring stages a warp: items in flight while one is summed
static_assert(kBatch == 1 || kBatch == 2 || kBatch == 4, "the super-steps' sums are added in pairs");

// (a & mask) | magic in one LOP3.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t mask, uint32_t magic) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(magic));
  return d;
#else
  return (a & mask) | magic;
#endif
}

// Nibbles k and k + 4 of a word as the bf16 pair (128 + q_k, 128 + q_{k+4}).
__device__ __forceinline__ uint32_t pair(uint32_t word, uint32_t k) {
  return and_or(word >> (4 * k), 0x000F000Fu, 0x43004300u);
}

// The bf16 pair of a register as two floats (exact).
__device__ __forceinline__ float lo_f32(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float hi_f32(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }

// c += A B for one m16n8k16 step (bf16 operands, f32 accumulators). Lane 4g + t holds
// A[g][2t..2t+1] (a0), A[g+8][2t..] (a1), A[g][2t+8..] (a2), A[g+8][2t+8..] (a3),
// B[2t..2t+1][g] (b0), B[2t+8..][g] (b1), C[g][2t..2t+1] (c0, c1), C[g+8][2t..] (c2, c3).
__device__ __forceinline__ void mma(float (&c)[4], uint32_t lane, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                    uint32_t b0, uint32_t b1) {
#ifdef __CUDA_ARCH__
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else  // the CPU emulation (kernels/emu; lane: this thread's lane, unused on the GPU): the fragments gathered with shuffles, summed in k order
  const uint32_t g = lane / 4, t = lane % 4;
  float sum[4] = {0.f, 0.f, 0.f, 0.f};
  for (uint32_t u = 0; u < 4; ++u) {  // the lanes 4g' + u hold k = 2u, 2u + 1, 2u + 8, 2u + 9
    const uint32_t ga0 = __shfl_sync(0xffffffffu, a0, 4 * g + u), ga1 = __shfl_sync(0xffffffffu, a1, 4 * g + u);
    const uint32_t ga2 = __shfl_sync(0xffffffffu, a2, 4 * g + u), ga3 = __shfl_sync(0xffffffffu, a3, 4 * g + u);
    const uint32_t b00 = __shfl_sync(0xffffffffu, b0, 4 * (2 * t) + u), b10 = __shfl_sync(0xffffffffu, b1, 4 * (2 * t) + u);
    const uint32_t b01 = __shfl_sync(0xffffffffu, b0, 4 * (2 * t + 1) + u), b11 = __shfl_sync(0xffffffffu, b1, 4 * (2 * t + 1) + u);
    auto dot = [](uint32_t a, uint32_t b, uint32_t a8, uint32_t b8, float acc) {
      acc += lo_f32(a) * lo_f32(b);
      acc += hi_f32(a) * hi_f32(b);
      acc += lo_f32(a8) * lo_f32(b8);
      return acc + hi_f32(a8) * hi_f32(b8);
    };
    sum[0] = dot(ga0, b00, ga2, b10, sum[0]);
    sum[1] = dot(ga0, b01, ga2, b11, sum[1]);
    sum[2] = dot(ga1, b00, ga3, b10, sum[2]);
    sum[3] = dot(ga1, b01, ga3, b11, sum[3]);
  }
  for (uint32_t r = 0; r < 4; ++r) c[r] += sum[r];
#endif
}

// Columns of one warp: super-steps [begin, end).
struct Range {
  uint32_t begin, end;
};

// The super-steps of warp w of W: whole macro steps (8 groups: per_macro super-steps), as
// evenly as they split, so that no group is split between warps.
__device__ __forceinline__ Range warp_range(uint32_t supers, uint32_t per_macro, uint32_t w, uint32_t W) {
  const uint32_t macros = (supers + per_macro - 1) / per_macro;
  return {min(w * macros / W * per_macro, supers), min((w + 1) * macros / W * per_macro, supers)};
}

// A warp's ring of batches in shared memory: the weights as [kBatch][2 rows][32 lanes] uint4s
// (lane-consecutive: a warp's 16-byte reads are conflict-free), and the scale and bias pairs of
// a macro step ending in the batch as [4: s lo, b lo, s hi, b hi][32 lanes] pairs of SC.
template <typename SC>
struct Stage {
  uint4 w[kBatch * 2][32];
  uint2 sb[4][32];  // a pair of SC in its low 2 * sizeof(SC) bytes
};

template <typename SC>
__device__ __forceinline__ float pair_at(const uint2 v, uint32_t u) {
  const SC* two = reinterpret_cast<const SC*>(&v);
  return to_f32(two[u]);
}

// Dynamic shared memory of a block (the host's formula: crates/gdn-ops/src/ops/affine/mma.rs).
template <typename SC>
__host__ __device__ constexpr uint32_t stage_bytes() {
  return sizeof(Stage<SC>);
}

template <bool SWIGLU, typename SC>
__device__ __forceinline__ void body(const uint32_t* __restrict__ packed, const SC* __restrict__ scales,
                                     const SC* __restrict__ biases, const __nv_bfloat16* __restrict__ x,
                                     const uint32_t* __restrict__ ids, __nv_bfloat16* __restrict__ y,
                                     const AffineParams& p, uint32_t experts, uint32_t tid, uint32_t W,
                                     uint32_t block_x, uint32_t blocks_x, uint32_t i, uint32_t* shared) {
  const uint32_t lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const uint32_t outputs = SWIGLU ? p.rows / 2 : p.rows;
  constexpr uint32_t kTileOutputs = SWIGLU ? 8 : 16;
  const uint32_t tiles = (outputs + kTileOutputs - 1) / kTileOutputs;
  const uint32_t e = p.has_ids ? ids[i] : 0;
  __nv_bfloat16* y_row = y + (size_t)i * outputs;
  if (e >= experts) {  // uniform over the block
    for (uint32_t tl = block_x; tl < tiles; tl += blocks_x) {
      if (tid < kTileOutputs && tl * kTileOutputs + tid < outputs)
        y_row[tl * kTileOutputs + tid] = from_f32<__nv_bfloat16>(__uint_as_float(0x7fc00000u));
    }
    return;
  }
  const uint32_t cols = p.cols, groups = cols / p.group_size, supers = cols / kSuperCols;
  const uint32_t group_shift = 31 - __clz(p.group_size);  // 64 or 128 (the host checks)
  const uint32_t per_macro = p.group_size / 16;           // super-steps of 8 groups: 4 or 8
  const uint32_t words_per_row = cols / 8;
  const Range range = warp_range(supers, per_macro, warp, W);
  const uint32_t batches = (range.end - range.begin + kBatch - 1) / kBatch;
  const uint32_t my_tiles = block_x < tiles ? (tiles - block_x + blocks_x - 1) / blocks_x : 0;
  const uint32_t total = my_tiles * batches;  // this warp's (tile, batch) sequence

  // Shared memory: the warps' rings, x permuted (a uint4 per 8 values), each group's sum of x,
  // the warps' sums of two tiles.
  Stage<SC>* ring = reinterpret_cast<Stage<SC>*>(shared) + warp * kStages;  // [W][kStages]
  uint4* xs = reinterpret_cast<uint4*>(reinterpret_cast<Stage<SC>*>(shared) + W * kStages);  // [cols / 8]
  float* sxg = reinterpret_cast<float*>(xs + cols / 8);  // [groups]
  float* part = sxg + groups;                             // [2][W][16]

  // This lane's two weight rows in a tile (rows past the matrix read its last row and are
  // never written).
  auto rows_of = [&](uint32_t tile, size_t& lo, size_t& hi) {
    if (SWIGLU) {
      const uint32_t o = min(tile * 8 + g, outputs - 1);
      lo = (size_t)e * p.rows + o, hi = (size_t)e * p.rows + outputs + o;
    } else {
      lo = (size_t)e * p.rows + min(tile * 16 + g, p.rows - 1);
      hi = (size_t)e * p.rows + min(tile * 16 + g + 8, p.rows - 1);
    }
  };
  // The macro step whose end falls in batch b, if one does (its index + 1, else 0): batches
  // start on macro steps, a macro is one batch (group 64) or two (128).
  auto macro_end_in = [&](uint32_t b) -> uint32_t {
    const uint32_t last = min(range.begin + (b + 1) * kBatch, range.end) - 1;
    return ((last + 1) % per_macro == 0 || last + 1 == range.end) ? last / per_macro + 1 : 0;
  };
  // The copies of item n of the sequence into its stage, committed as one group (an empty one
  // past the end, so that a wait always counts kStages groups). A super-step's 128 columns are 4
  // uint4 of a row: lane t reads uint4 4 s + t.
  auto issue = [&](uint32_t n) {
    if (n < total) {
      const uint32_t tile = block_x + (n / batches) * blocks_x, b = n % batches;
      Stage<SC>& st = ring[n % kStages];
      size_t lo, hi;
      rows_of(tile, lo, hi);
      const uint4* w_lo = reinterpret_cast<const uint4*>(packed + lo * words_per_row);
      const uint4* w_hi = reinterpret_cast<const uint4*>(packed + hi * words_per_row);
#pragma unroll
      for (uint32_t k = 0; k < kBatch; ++k) {
        const uint32_t s = range.begin + b * kBatch + k;
        if (s < range.end) {
          __pipeline_memcpy_async(&st.w[2 * k][lane], w_lo + 4 * s + t, 16);
          __pipeline_memcpy_async(&st.w[2 * k + 1][lane], w_hi + 4 * s + t, 16);
        }
      }
      const uint32_t m = macro_end_in(b);
      if (m > 0) {
        // Groups 2t, 2t + 1 (an even pair: the host checks an even group count); past the row's
        // groups the pair is never used, the row's first read instead.
        const uint32_t G = (m - 1) * 8 + 2 * t < groups ? (m - 1) * 8 + 2 * t : 0;
        __pipeline_memcpy_async(&st.sb[0][lane], scales + lo * groups + G, 2 * sizeof(SC));
        __pipeline_memcpy_async(&st.sb[1][lane], biases + lo * groups + G, 2 * sizeof(SC));
        __pipeline_memcpy_async(&st.sb[2][lane], scales + hi * groups + G, 2 * sizeof(SC));
        __pipeline_memcpy_async(&st.sb[3][lane], biases + hi * groups + G, 2 * sizeof(SC));
      }
    }
    __pipeline_commit();
  };

  // The first kStages items are asked for before x is staged: they overlap it.
#pragma unroll
  for (uint32_t n = 0; n < kStages; ++n) issue(n);

  const __nv_bfloat16* xr = x + (size_t)(i / p.x_div) * cols;
  for (uint32_t wd = tid; wd < cols / 8; wd += 32 * W) {
    const uint4 r = *reinterpret_cast<const uint4*>(xr + wd * 8);
    // r: (x0 x1) (x2 x3) (x4 x5) (x6 x7) -> (x0 x4) (x1 x5) (x2 x6) (x3 x7)
    xs[wd] = make_uint4(__byte_perm(r.x, r.z, 0x5410), __byte_perm(r.x, r.z, 0x7632),
                        __byte_perm(r.y, r.w, 0x5410), __byte_perm(r.y, r.w, 0x7632));
  }
  for (uint32_t G = tid; G < groups; G += 32 * W) {
    const uint4* gx = reinterpret_cast<const uint4*>(xr + (size_t)G * p.group_size);
    float sum = 0.f;
    for (uint32_t v = 0; v < p.group_size / 8; ++v) {
      const uint4 r = gx[v];
      const uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (uint32_t k = 0; k < 4; ++k) {
        sum += __uint_as_float(words[k] << 16);
        sum += __uint_as_float(words[k] & 0xFFFF0000u);
      }
    }
    sxg[G] = sum;
  }
  __syncthreads();

  uint32_t n = 0, parity = 0;
  for (uint32_t tile = block_x; tile < tiles; tile += blocks_x) {  // uniform over the block
    float acc_lo = 0.f, acc_hi = 0.f;
    float c[kBatch][4] = {};
    for (uint32_t b = 0; b < batches; ++b, ++n) {  // uniform over the warp
      // Item n's copies (this thread's own) have landed; its stage goes to item n + kStages
      // once read into registers.
      __pipeline_wait_prior(kStages - 1);
      const Stage<SC>& st = ring[n % kStages];
      uint4 lo[kBatch], hi[kBatch];
#pragma unroll
      for (uint32_t k = 0; k < kBatch; ++k) lo[k] = st.w[2 * k][lane], hi[k] = st.w[2 * k + 1][lane];
      const uint2 sb[4] = {st.sb[0][lane], st.sb[1][lane], st.sb[2][lane], st.sb[3][lane]};
      issue(n + kStages);
      // One accumulator a super-step, the super-steps interleaved word by word: four
      // independent chains of 8 mma, not one of 32, and no branch between them (a super-step
      // past the warp's columns adds zeros: its x is zero, its stale weights finite by
      // construction).
      bool mine[kBatch];
      const uint4* xw[kBatch];
#pragma unroll
      for (uint32_t k = 0; k < kBatch; ++k) {
        const uint32_t s = range.begin + b * kBatch + k;
        // B: this lane's x words, in column g only when g is its columns' group (mod 8).
        mine[k] = s < range.end && g == (((s * kSuperCols + 32 * t) >> group_shift) & 7u);
        xw[k] = xs + min(s, supers - 1) * 16 + 4 * t;
      }
#pragma unroll
      for (uint32_t wd = 0; wd < 4; ++wd) {
#pragma unroll
        for (uint32_t k = 0; k < kBatch; ++k) {
          const uint4 bx = mine[k] ? xw[k][wd] : make_uint4(0u, 0u, 0u, 0u);
          const uint32_t a = wd == 0 ? lo[k].x : wd == 1 ? lo[k].y : wd == 2 ? lo[k].z : lo[k].w;
          const uint32_t h = wd == 0 ? hi[k].x : wd == 1 ? hi[k].y : wd == 2 ? hi[k].z : hi[k].w;
          mma(c[k], lane, pair(a, 0), pair(h, 0), pair(a, 1), pair(h, 1), bx.x, bx.y);
          mma(c[k], lane, pair(a, 2), pair(h, 2), pair(a, 3), pair(h, 3), bx.z, bx.w);
        }
      }
      // A macro step (8 groups) ends in this batch: lane t applies the scales of groups 2t,
      // 2t + 1 of it to its two rows.
      const uint32_t m = macro_end_in(b);
      if (m > 0) {
        // The super-steps' accumulators in order (a group's columns lie in one or two of them),
        // summed in pairs: (c0 + c1) + (c2 + c3) at kBatch 4, c0 + c1 at 2. Only kBatch of
        // them exist: c[2], c[3] at kBatch 2 would be out of bounds, undefined (nvcc 13 then
        // compiled the body with no mma at all; clang refuses it).
        float cm[4];
#pragma unroll
        for (uint32_t r = 0; r < 4; ++r) {
          float sums[kBatch];
#pragma unroll
          for (uint32_t k = 0; k < kBatch; ++k) sums[k] = c[k][r], c[k][r] = 0.f;
#pragma unroll
          for (uint32_t width = kBatch; width > 1; width /= 2) {
#pragma unroll
            for (uint32_t k = 0; k < width / 2; ++k) sums[k] = sums[2 * k] + sums[2 * k + 1];
          }
          cm[r] = sums[0];
        }
#pragma unroll
        for (uint32_t u = 0; u < 2; ++u) {
          const uint32_t G = (m - 1) * 8 + 2 * t + u;
          if (G < groups) {
            const float sum_x = sxg[G];
            acc_lo = fmaf(pair_at<SC>(sb[0], u), fmaf(-128.f, sum_x, cm[u]), fmaf(pair_at<SC>(sb[1], u), sum_x, acc_lo));
            acc_hi = fmaf(pair_at<SC>(sb[2], u), fmaf(-128.f, sum_x, cm[2 + u]), fmaf(pair_at<SC>(sb[3], u), sum_x, acc_hi));
          }
        }
      }
    }
    // The row's four lanes, then the warps in order.
    acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 1);
    acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 2);
    acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 1);
    acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 2);
    float* pt = part + parity * W * 16;
    if (t == 0) {
      pt[warp * 16 + g] = acc_lo;
      pt[warp * 16 + g + 8] = acc_hi;
    }
    // One barrier a tile: the next tile's sums go to the other half, which no thread still
    // reads (its readers passed this barrier after reading it).
    __syncthreads();
    if (tid < kTileOutputs) {
      float lo_sum = 0.f, hi_sum = 0.f;
      for (uint32_t w = 0; w < W; ++w) {
        lo_sum += pt[w * 16 + tid];
        if (SWIGLU) hi_sum += pt[w * 16 + tid + 8];
      }
      const uint32_t o = tile * kTileOutputs + tid;
      if (o < outputs) {
        float v = lo_sum;
        if (SWIGLU) {
          const float gate = to_f32(from_f32<__nv_bfloat16>(lo_sum));
          const float up = to_f32(from_f32<__nv_bfloat16>(hi_sum));
          v = gate / (1.f + expf(-gate)) * up;
        }
        y_row[o] = from_f32<__nv_bfloat16>(v);
      }
    }
    parity ^= 1;
  }
  __pipeline_wait_prior(0);  // no copy outlives the block
}

}  // namespace affine_mma

#define AFFINE_MMA_ENTRY(KIND, SWIGLU, SN, ST)                                                      \
  extern "C" __global__ void __launch_bounds__(affine_mma::kMaxWarps * 32, 1)                          \
      affine_mma_##KIND##_b4_bf16_##SN(const uint32_t* packed, const ST* scales, const ST* biases, \
                                       const __nv_bfloat16* x, const uint32_t* ids,                 \
                                       __nv_bfloat16* y, const AffineParams p,                      \
                                       const uint32_t experts) {                                    \
    extern __shared__ uint4 mma_shared[];                                                           \
    affine_mma::body<SWIGLU, ST>(packed, scales, biases, x, ids, y, p, experts, threadIdx.x,        \
                                 blockDim.x / 32, blockIdx.x, gridDim.x, blockIdx.y,                \
                                 reinterpret_cast<uint32_t*>(mma_shared));                          \
  }

#define AFFINE_MMA_FOR_SCALES(SN, ST)        \
  AFFINE_MMA_ENTRY(products, false, SN, ST) \
  AFFINE_MMA_ENTRY(swiglu, true, SN, ST)

AFFINE_MMA_FOR_SCALES(f32, float)
AFFINE_MMA_FOR_SCALES(f16, __half)
AFFINE_MMA_FOR_SCALES(bf16, __nv_bfloat16)
