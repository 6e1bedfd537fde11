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
// 8 bits): the lane takes every 32nd word, and since a group spans whole words, each word
// needs one scale and one bias: s * sum(q x) + b * sum(x), as MLX's qmv computes it.
template <uint32_t BITS, typename X, typename S>
__device__ __forceinline__ float lane_dot_words(const uint32_t* row, const S* row_scales,
                                                const S* row_biases, const X* xr,
                                                const AffineParams& p, uint32_t lane) {
  constexpr uint32_t PER_WORD = 32 / BITS, MASK = (1u << BITS) - 1u;
  const uint32_t words = p.cols / PER_WORD;
  float acc = 0.f;
  for (uint32_t w = lane; w < words; w += 32) {
    const uint32_t word = row[w], j0 = w * PER_WORD, g = j0 / p.group_size;
    float qx = 0.f, sx = 0.f;
#pragma unroll
    for (uint32_t k = 0; k < PER_WORD; ++k) {
      const float xv = to_f32(xr[j0 + k]);
      qx = fmaf((float)((word >> (k * BITS)) & MASK), xv, qx);
      sx += xv;
    }
    acc = fmaf(to_f32(row_scales[g]), qx, fmaf(to_f32(row_biases[g]), sx, acc));
  }
  return acc;
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

#define AFFINE_FOR_SCALES(XN, XT)         \
  AFFINE_ENTRIES(XN, XT, f32, float)      \
  AFFINE_ENTRIES(XN, XT, f16, __half)     \
  AFFINE_ENTRIES(XN, XT, bf16, __nv_bfloat16)

AFFINE_FOR_SCALES(f32, float)
AFFINE_FOR_SCALES(f16, __half)
AFFINE_FOR_SCALES(bf16, __nv_bfloat16)
