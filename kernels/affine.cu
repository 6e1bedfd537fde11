// MLX affine-quantized matrices on CUDA: the twin of kernels/affine.metal's two operations,
// with crates/gdn-ops/src/affine_tensor.rs's CPU twin as the reference both must match.
//
// A stacked matrix is [E * rows, cols] of `bits`-bit unsigned integers q (2, 3, 4, 5, 6 or
// 8 bits), packed LSB-first as one bitstream per row into u32 words (cols * bits / 32 of
// them), with a scale s and bias b per group of `group_size` consecutive columns:
// w = s * q + b (a multiply, then an add: the CPU reference's rounding).
//
// ENTRY POINTS (extern "C"; <x>, <s>, <o> in {f32, f16, bf16}):
//   affine_products_<x>_<s>(packed, scales, biases, x, ids, y, AffineParams p, u32 experts)
//     y[i, r] = sum_j w[e * rows + r, j] * x[i / x_div, j], e = has_ids ? ids[i] : 0;
//     x [*, cols] and y [out_rows, rows] in <x>, scales and biases in <s>, f32 arithmetic
//     (for 2/4/8 bits per packed word as s * sum(q x) + b * sum(x), MLX's qmv order).
//     block = (32, W) threads (one warp per output), grid = (ceil(rows / W), out_rows).
//     An out-of-range expert id writes NaN (the kernel cannot report it; the host checks
//     ids it produced itself).
//   affine_products_swiglu_<x>_<s>(packed, scales, biases, x, ids, y, AffineParams p,
//                                  u32 experts)
//     The SwiGLU of a stacked gate-and-up matrix (rows = 2 * Im per expert: gate rows 0..Im,
//     up rows Im..2Im): y[i, a] = <x>(silu(g) * u) with g = <x>(row a . x) and
//     u = <x>(row Im + a . x) of expert e, silu(g) = g / (1 + exp(-g)) in f32; y [out_rows, Im].
//     block = (32, W), grid = (ceil(Im / W), out_rows); NaN for an out-of-range expert id.
//   affine_dequantize_<o>_<s>(packed, scales, biases, ids, out, AffineParams p, u32 count,
//                             u32 total_rows)
//     out[i, j] = w[has_ids ? ids[i] : i, j] for i < count, rounded once into <o>; a row id
//     >= total_rows (= E * rows) writes NaN.
//     block = 256 threads, grid = ceil(count * cols / 256).
//
// One warp per output value. For 2, 4 and 8 bits each lane reads whole packed words (every
// 32nd word of the row: the warp's loads are coalesced) with one scale and bias per word, and
// computes s * sum(q x) + b * sum(x) per word; 3, 5 and 6 bits take one element per lane and
// step (values straddle words). It reads the packed words once per output row of x, not once
// per weight row: meant for the decode shapes it is used for (a few activation rows).
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 kernels/affine.cu -o affine.ptx

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/affine.h"
#include "cuda_convert.h"
#include "affine_row_group.h"
#include "affine_word_dot.h"

namespace affine {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

// Element j of a packed row: bits j*bits .. j*bits + bits - 1 of the row's bitstream.
__device__ __forceinline__ uint32_t element(const uint32_t* row, uint32_t j, uint32_t bits) {
  const uint32_t bit = j * bits, word = bit >> 5, shift = bit & 31;
  uint64_t pair = row[word];
  if (shift + bits > 32) pair |= (uint64_t)row[word + 1] << 32;
  return (uint32_t)(pair >> shift) & ((1u << bits) - 1u);
}

template <typename S>
__device__ __forceinline__ float weight(const uint32_t* packed, const S* scales, const S* biases,
                                        const AffineParams& p, uint32_t row, uint32_t j) {
  const uint32_t words_per_row = p.cols * p.bits / 32, groups = p.cols / p.group_size;
  const float q = (float)element(packed + (size_t)row * words_per_row, j, p.bits);
  const size_t g = (size_t)row * groups + j / p.group_size;
  return __fadd_rn(__fmul_rn(to_f32(scales[g]), q), to_f32(biases[g]));
}

// One lane's share of a row's dot product for widths that put whole values in a word (2, 4,
// 8 bits): kernels/affine_word_dot.h.
template <uint32_t BITS, typename X, typename S>
__device__ __forceinline__ float lane_dot_words(const uint32_t* row, const S* row_scales,
                                                const S* row_biases, const X* xr,
                                                const AffineParams& p, uint32_t lane) {
  return affine_word_dot::lane_dot<BITS>(row, row_scales, row_biases, xr, p.cols, p.group_size,
                                         lane);
}

// Any width (3, 5 and 6 bits straddle words): one element per lane and step.
template <typename X, typename S>
__device__ __forceinline__ float lane_dot_elements(const uint32_t* packed, const S* scales,
                                                   const S* biases, const X* xr,
                                                   const AffineParams& p, uint32_t row,
                                                   uint32_t lane) {
  float acc = 0.f;
  for (uint32_t j = lane; j < p.cols; j += 32) {
    acc = fmaf(weight(packed, scales, biases, p, row, j), to_f32(xr[j]), acc);
  }
  return acc;
}

// Stacked row `row` . xr over the whole warp: every lane returns the full sum.
template <typename X, typename S>
__device__ __forceinline__ float warp_dot(const uint32_t* packed, const S* scales, const S* biases,
                                          const X* xr, const AffineParams& p, uint32_t row,
                                          uint32_t lane) {
  const uint32_t* row_words = packed + (size_t)row * (p.cols * p.bits / 32);
  const size_t groups = p.cols / p.group_size;
  const S* row_scales = scales + (size_t)row * groups;
  const S* row_biases = biases + (size_t)row * groups;
  float acc;
  switch (p.bits) {
    case 4: acc = lane_dot_words<4>(row_words, row_scales, row_biases, xr, p, lane); break;
    case 8: acc = lane_dot_words<8>(row_words, row_scales, row_biases, xr, p, lane); break;
    case 2: acc = lane_dot_words<2>(row_words, row_scales, row_biases, xr, p, lane); break;
    default: acc = lane_dot_elements(packed, scales, biases, xr, p, row, lane);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

template <typename X, typename S>
__device__ void products(const uint32_t* packed, const S* scales, const S* biases, const X* x,
                         const uint32_t* ids, X* y, const AffineParams p, uint32_t experts) {
  const uint32_t i = blockIdx.y, r = blockIdx.x * blockDim.y + threadIdx.y;
  const uint32_t lane = threadIdx.x;
  if (i >= p.out_rows || r >= p.rows) return;
  const uint32_t e = p.has_ids ? ids[i] : 0;
  if (e >= experts) {
    if (lane == 0) y[(size_t)i * p.rows + r] = from_f32<X>(__int_as_float(0x7fc00000));
    return;
  }
  const X* xr = x + (size_t)(i / p.x_div) * p.cols;
  const float acc = warp_dot(packed, scales, biases, xr, p, e * p.rows + r, lane);
  if (lane == 0) y[(size_t)i * p.rows + r] = from_f32<X>(acc);
}

// SwiGLU over a stacked gate-and-up matrix (p.rows = 2 * Im per expert: gate rows, then up
// rows): y[i, a] = X(silu(g) * u), g = X(row a . x), u = X(row Im + a . x), f32 in between.
template <typename X, typename S>
__device__ void swiglu(const uint32_t* packed, const S* scales, const S* biases, const X* x,
                       const uint32_t* ids, X* y, const AffineParams p, uint32_t experts) {
  const uint32_t im = p.rows / 2;
  const uint32_t i = blockIdx.y, a = blockIdx.x * blockDim.y + threadIdx.y;
  const uint32_t lane = threadIdx.x;
  if (i >= p.out_rows || a >= im) return;
  const uint32_t e = p.has_ids ? ids[i] : 0;
  if (e >= experts) {
    if (lane == 0) y[(size_t)i * im + a] = from_f32<X>(__int_as_float(0x7fc00000));
    return;
  }
  const X* xr = x + (size_t)(i / p.x_div) * p.cols;
  const float g = to_f32(from_f32<X>(warp_dot(packed, scales, biases, xr, p, e * p.rows + a, lane)));
  const float u =
      to_f32(from_f32<X>(warp_dot(packed, scales, biases, xr, p, e * p.rows + im + a, lane)));
  if (lane == 0) y[(size_t)i * im + a] = from_f32<X>(g / (1.f + expf(-g)) * u);
}

template <typename O, typename S>
__device__ void dequantize(const uint32_t* packed, const S* scales, const S* biases,
                           const uint32_t* ids, O* out, const AffineParams p, uint32_t count,
                           uint32_t total_rows) {
  const size_t at = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (at >= (size_t)count * p.cols) return;
  const uint32_t i = at / p.cols, j = at % p.cols;
  const uint32_t row = p.has_ids ? ids[i] : i;
  out[at] = row < total_rows ? from_f32<O>(weight(packed, scales, biases, p, row, j))
                             : from_f32<O>(__int_as_float(0x7fc00000));
}

}  // namespace affine

// ---------------------------------------------------------------------------------------------
// Wide products for 4- and 8-bit matrices (the decode step's projections and expert products).
//
// The one-warp-per-row kernel above moves a 4-byte word and re-reads x element by element per
// step: at the decode shapes it keeps too few bytes in flight to approach the copy bandwidth.
// Here a lane reads a 16-byte chunk of a row per step (32 four-bit or 16 eight-bit values, one
// group's scale and bias: MLX groups of 32, 64 and 128 hold whole chunks), with the chunk of x
// loaded once in 16-byte loads and reused for ROWS rows; LPR lanes (8, 16 or 32, whatever
// fills a row of `chunks` chunks best) share a row and reduce with shuffles within their
// LPR-lane group, so a warp holds 32 / LPR row groups. A block is kWideWarps warps.
//   affine_wide_<kind>_b<BITS>_r<ROWS>_<x>_<s>(packed, scales, biases, x, ids, y, p, experts,
//                                              lpr)
//     kind = products: y[i, r] as affine_products (ROWS output rows per row group);
//     kind = swiglu: y[i, a] as affine_products_swiglu (ROWS activations per row group, each
//     reading its gate row and its up row).
//     block = kWideWarps * 32 threads; grid = (ceil(outputs / (kWideWarps * 32 / lpr * ROWS)),
//     out_rows), outputs = rows (products) or rows / 2 (swiglu).
//     The host checks: bits 4 or 8, cols a multiple of the chunk's values with at least lpr
//     chunks per row, group_size a multiple of them, the packed words and x 16-byte aligned.
// Per chunk a row adds s * sum(q x) + b * sum(x): the CPU twin's per-group order, within
// rounding (the tests' tolerance), not bit for bit.
namespace affine_wide {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

constexpr uint32_t kWideWarps = 4;

// q < 2^8 as a float without an integer conversion: 2^23 + q has q in its low mantissa bits.
__device__ __forceinline__ float small_to_f32(uint32_t q) {
  return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}

// sum(q x) over a chunk's four words, two chains to halve the dependent FMAs.
template <uint32_t BITS>
__device__ __forceinline__ float chunk_qx(const uint4 w, const float* xs) {
  constexpr uint32_t PER = 32 / BITS, MASK = (1u << BITS) - 1u;
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  float a = 0.f, b = 0.f;
#pragma unroll
  for (uint32_t i = 0; i < 4; ++i) {
#pragma unroll
    for (uint32_t k = 0; k < PER; k += 2) {
      a = fmaf(small_to_f32((words[i] >> (k * BITS)) & MASK), xs[i * PER + k], a);
      b = fmaf(small_to_f32((words[i] >> ((k + 1) * BITS)) & MASK), xs[i * PER + k + 1], b);
    }
  }
  return a + b;
}

// V values of x from column j0 (16-byte loads) as floats; returns their sum.
template <typename X, uint32_t V>
__device__ __forceinline__ float load_x(const X* xr, uint32_t j0, float (&xs)[V]) {
  constexpr uint32_t PER16 = 16 / sizeof(X);
  float sum = 0.f;
#pragma unroll
  for (uint32_t v = 0; v < V / PER16; ++v) {
    const uint4 raw = *reinterpret_cast<const uint4*>(xr + j0 + v * PER16);
    const X* vals = reinterpret_cast<const X*>(&raw);
#pragma unroll
    for (uint32_t t = 0; t < PER16; ++t) {
      xs[v * PER16 + t] = to_f32(vals[t]);
      sum += xs[v * PER16 + t];
    }
  }
  return sum;
}

// Chunk c of each of the NR rows `row` against x: acc[r] += s * sum(q x) + b * sum(x), the
// chunk's words, then its scales and biases, then x asked for before any is summed. The wide
// kernels' and the split kernels' per-chunk step.
template <uint32_t BITS, uint32_t NR, typename X, typename S>
__device__ __forceinline__ void add_chunk(const uint32_t* packed, const S* scales, const S* biases,
                                          const X* xr, const size_t (&row)[NR],
                                          uint32_t words_per_row, uint32_t groups,
                                          uint32_t group_size, uint32_t c, float (&acc)[NR]) {
  constexpr uint32_t V = 128 / BITS;  // values per 16-byte chunk
  uint4 w[NR];
#pragma unroll
  for (uint32_t r = 0; r < NR; ++r) {
    w[r] = *reinterpret_cast<const uint4*>(packed + row[r] * words_per_row + 4 * c);
  }
  const uint32_t g = c * V / group_size;
  float s[NR], b[NR];
#pragma unroll
  for (uint32_t r = 0; r < NR; ++r) {
    s[r] = to_f32(scales[row[r] * groups + g]);
    b[r] = to_f32(biases[row[r] * groups + g]);
  }
  float xs[V];
  const float sx = load_x<X, V>(xr, c * V, xs);
#pragma unroll
  for (uint32_t r = 0; r < NR; ++r) {
    acc[r] = fmaf(s[r], chunk_qx<BITS>(w[r], xs), fmaf(b[r], sx, acc[r]));
  }
}

// The body of both kinds, with the thread's lane and warp and the block's indices as
// arguments (kernels/emu runs it on the CPU). SWIGLU: outputs are activations, and a row group
// reads ROWS gate rows and the ROWS matching up rows.
template <uint32_t BITS, uint32_t ROWS, bool SWIGLU, typename X, typename S>
__device__ __forceinline__ void wide_body(const uint32_t* packed, const S* scales,
                                          const S* biases, const X* x, const uint32_t* ids, X* y,
                                          const AffineParams& p, uint32_t experts, uint32_t lpr,
                                          uint32_t lane, uint32_t warp, uint32_t block_x,
                                          uint32_t i) {
  constexpr uint32_t V = 128 / BITS;            // values per 16-byte chunk
  constexpr uint32_t NR = SWIGLU ? 2 * ROWS : ROWS;  // rows read per row group
  if (i >= p.out_rows) return;                  // uniform over the block
  const uint32_t outputs = SWIGLU ? p.rows / 2 : p.rows;
  const uint32_t subs = 32 / lpr, sub = lane / lpr, l = lane % lpr;
  const uint32_t o0 = ((block_x * kWideWarps + warp) * subs + sub) * ROWS;
  const uint32_t e = p.has_ids ? ids[i] : 0;
  if (e >= experts) {  // uniform over the block: no shuffle follows
    for (uint32_t r = 0; r < ROWS; ++r) {
      if (l == 0 && o0 + r < outputs) y[(size_t)i * outputs + o0 + r] = from_f32<X>(__uint_as_float(0x7fc00000u));
    }
    return;
  }
  const uint32_t words_per_row = p.cols * BITS / 32, groups = p.cols / p.group_size;
  const uint32_t chunks = p.cols / V;
  // Rows past the matrix read its last row (a valid address) and are never written.
  size_t row[NR];
#pragma unroll
  for (uint32_t r = 0; r < NR; ++r) {
    const uint32_t o = min(o0 + (r % ROWS), outputs - 1);
    row[r] = (size_t)e * p.rows + (SWIGLU && r >= ROWS ? outputs + o : o);
  }
  const X* xr = x + (size_t)(i / p.x_div) * p.cols;
  float acc[NR];
#pragma unroll
  for (uint32_t r = 0; r < NR; ++r) acc[r] = 0.f;
#pragma unroll 2
  for (uint32_t c = l; c < chunks; c += lpr) {
    add_chunk<BITS, NR>(packed, scales, biases, xr, row, words_per_row, groups, p.group_size, c, acc);
  }
  affine_row_group::reduce_and_write<ROWS, SWIGLU>(acc, lpr, l, y + (size_t)i * outputs, o0, outputs);
}

}  // namespace affine_wide

#define AFFINE_ENTRIES(XN, XT, SN, ST)                                                       \
  extern "C" __global__ void affine_products_##XN##_##SN(                                    \
      const uint32_t* packed, const ST* scales, const ST* biases, const XT* x,               \
      const uint32_t* ids, XT* y, const AffineParams p, const uint32_t experts) {            \
    affine::products<XT, ST>(packed, scales, biases, x, ids, y, p, experts);                 \
  }                                                                                          \
  extern "C" __global__ void affine_products_swiglu_##XN##_##SN(                             \
      const uint32_t* packed, const ST* scales, const ST* biases, const XT* x,               \
      const uint32_t* ids, XT* y, const AffineParams p, const uint32_t experts) {            \
    affine::swiglu<XT, ST>(packed, scales, biases, x, ids, y, p, experts);                   \
  }                                                                                          \
  extern "C" __global__ void affine_dequantize_##XN##_##SN(                                  \
      const uint32_t* packed, const ST* scales, const ST* biases, const uint32_t* ids,       \
      XT* out, const AffineParams p, const uint32_t count, const uint32_t total_rows) {      \
    affine::dequantize<XT, ST>(packed, scales, biases, ids, out, p, count, total_rows);      \
  }

CUDA_FOR_FLOAT_TYPE_PAIRS(AFFINE_ENTRIES)

#define AFFINE_WIDE_ENTRY(KIND, SWIGLU, BITS, ROWS, XN, XT, SN, ST)                             \
  extern "C" __global__ void __launch_bounds__(affine_wide::kWideWarps * 32)                   \
      affine_wide_##KIND##_b##BITS##_r##ROWS##_##XN##_##SN(                                     \
          const uint32_t* packed, const ST* scales, const ST* biases, const XT* x,             \
          const uint32_t* ids, XT* y, const AffineParams p, const uint32_t experts,            \
          const uint32_t lpr) {                                                                 \
    affine_wide::wide_body<BITS, ROWS, SWIGLU, XT, ST>(packed, scales, biases, x, ids, y, p,   \
                                                       experts, lpr, threadIdx.x % 32,          \
                                                       threadIdx.x / 32, blockIdx.x,            \
                                                       blockIdx.y);                             \
  }

#define AFFINE_WIDE_FOR_TYPES(XN, XT, SN, ST)              \
  AFFINE_WIDE_ENTRY(products, false, 4, 1, XN, XT, SN, ST) \
  AFFINE_WIDE_ENTRY(products, false, 4, 2, XN, XT, SN, ST) \
  AFFINE_WIDE_ENTRY(products, false, 4, 4, XN, XT, SN, ST) \
  AFFINE_WIDE_ENTRY(products, false, 8, 1, XN, XT, SN, ST) \
  AFFINE_WIDE_ENTRY(products, false, 8, 2, XN, XT, SN, ST) \
  AFFINE_WIDE_ENTRY(products, false, 8, 4, XN, XT, SN, ST) \
  AFFINE_WIDE_ENTRY(swiglu, true, 4, 1, XN, XT, SN, ST)    \
  AFFINE_WIDE_ENTRY(swiglu, true, 4, 2, XN, XT, SN, ST)    \
  AFFINE_WIDE_ENTRY(swiglu, true, 8, 1, XN, XT, SN, ST)    \
  AFFINE_WIDE_ENTRY(swiglu, true, 8, 2, XN, XT, SN, ST)

CUDA_FOR_FLOAT_TYPE_PAIRS(AFFINE_WIDE_FOR_TYPES)

// ---------------------------------------------------------------------------------------------
// Block-split products for 4- and 8-bit matrices of few rows and long rows: the wide kernels'
// per-chunk sums (affine_wide::chunk_qx, load_x) with a whole block on each row instead of
// one warp.
//
// Why. A matrix of a few hundred rows of many thousand columns (qwen4_exp's merged
// hyper-connection down+inject product: 324 rows of 10 240 four-bit columns) is too long a row
// for the streamed kernel (more than 4 chunks a lane) and gives the wide kernel one warp a row:
// 324 warps on 132 SMs, each lane walking 10 chunks two at a time, a few dependent DRAM round
// trips with almost nothing else in flight (15 us for 1.9 MB on the H200). Here the
// kSplitWarps warps of a block share the row (lane tid takes chunks tid, tid + 256, ...: 1-2
// chunks of a row at that shape), so the whole matrix's loads are in flight at once; each
// warp's partial is reduced by shuffles and the warps' partials are summed in shared memory in
// warp order: deterministic, no atomics, no second launch. The order over chunks differs from
// the wide kernel's (a lane's chunks, then lanes by shuffle, then warps): the CPU twin's
// result within rounding, not the wide kernel's bits.
//   affine_split_products_b<BITS>_r<ROWS>_<x>_<s>(packed, scales, biases, x, ids, y, p,
//                                                 experts)
//     y[i, r] as affine_products, ROWS output rows a block; NaN for an out-of-range expert id.
//     block = kSplitWarps * 32 threads; grid = (ceil(rows / ROWS), out_rows).
//     The host checks what it checks for the wide kernel (crates/gdn-ops/src/ops/affine/
//     split.rs chooses the shapes).
namespace affine_split {

using cuda_convert::from_f32;

constexpr uint32_t kSplitWarps = 8;

// Output rows block_x * ROWS .. + ROWS of output row i, with the thread's index in its block
// and the block's shared scratch (kSplitWarps * ROWS floats) as arguments (kernels/emu runs it
// on the CPU). Every thread of the block calls it.
template <uint32_t BITS, uint32_t ROWS, typename X, typename S>
__device__ __forceinline__ void split_body(const uint32_t* __restrict__ packed,
                                           const S* __restrict__ scales,
                                           const S* __restrict__ biases, const X* __restrict__ x,
                                           const uint32_t* __restrict__ ids, X* __restrict__ y,
                                           const AffineParams& p, uint32_t experts, uint32_t tid,
                                           uint32_t block_x, uint32_t i, float* partials) {
  constexpr uint32_t V = 128 / BITS;  // values per 16-byte chunk
  constexpr uint32_t LANES = kSplitWarps * 32;
  if (i >= p.out_rows) return;  // uniform over the block
  const uint32_t lane = tid % 32, warp = tid / 32;
  const uint32_t o0 = block_x * ROWS;
  const uint32_t e = p.has_ids ? ids[i] : 0;
  if (e >= experts) {  // uniform over the block: no barrier follows
    if (tid < ROWS && o0 + tid < p.rows) y[(size_t)i * p.rows + o0 + tid] = from_f32<X>(__uint_as_float(0x7fc00000u));
    return;
  }
  const uint32_t words_per_row = p.cols * BITS / 32, groups = p.cols / p.group_size;
  const uint32_t chunks = p.cols / V;
  // Rows past the matrix read its last row (a valid address) and are never written.
  size_t row[ROWS];
#pragma unroll
  for (uint32_t r = 0; r < ROWS; ++r) row[r] = (size_t)e * p.rows + min(o0 + r, p.rows - 1);
  const X* xr = x + (size_t)(i / p.x_div) * p.cols;
  float acc[ROWS];
#pragma unroll
  for (uint32_t r = 0; r < ROWS; ++r) acc[r] = 0.f;
  // One or two chunks a lane at the shapes this is chosen for: unrolled, their loads are
  // all asked for before the first is summed.
#pragma unroll 2
  for (uint32_t c = tid; c < chunks; c += LANES) {
    affine_wide::add_chunk<BITS, ROWS>(packed, scales, biases, xr, row, words_per_row, groups,
                                       p.group_size, c, acc);
  }
#pragma unroll
  for (uint32_t r = 0; r < ROWS; ++r) {
    for (uint32_t o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (lane == 0) partials[r * kSplitWarps + warp] = acc[r];
  }
  __syncthreads();
  if (tid < ROWS && o0 + tid < p.rows) {
    float sum = 0.f;
    for (uint32_t w = 0; w < kSplitWarps; ++w) sum += partials[tid * kSplitWarps + w];
    y[(size_t)i * p.rows + o0 + tid] = from_f32<X>(sum);
  }
}

}  // namespace affine_split

#define AFFINE_SPLIT_ENTRY(BITS, ROWS, XN, XT, SN, ST)                                           \
  extern "C" __global__ void __launch_bounds__(affine_split::kSplitWarps * 32)                  \
      affine_split_products_b##BITS##_r##ROWS##_##XN##_##SN(                                    \
          const uint32_t* packed, const ST* scales, const ST* biases, const XT* x,             \
          const uint32_t* ids, XT* y, const AffineParams p, const uint32_t experts) {          \
    __shared__ float partials[affine_split::kSplitWarps * ROWS];                                \
    affine_split::split_body<BITS, ROWS, XT, ST>(packed, scales, biases, x, ids, y, p, experts, \
                                                 threadIdx.x, blockIdx.x, blockIdx.y, partials); \
  }

#define AFFINE_SPLIT_FOR_TYPES(XN, XT, SN, ST) \
  AFFINE_SPLIT_ENTRY(4, 1, XN, XT, SN, ST)     \
  AFFINE_SPLIT_ENTRY(4, 2, XN, XT, SN, ST)     \
  AFFINE_SPLIT_ENTRY(8, 1, XN, XT, SN, ST)     \
  AFFINE_SPLIT_ENTRY(8, 2, XN, XT, SN, ST)

CUDA_FOR_FLOAT_TYPE_PAIRS(AFFINE_SPLIT_FOR_TYPES)
