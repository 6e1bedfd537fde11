// The gated RMSNorm of Gated DeltaNet layers on CUDA: the twin of kernels/gated_rms_norm.metal
// (which documents the maths), with crates/gdn-ops/src/ops/gated_rms_norm/cpu.rs as the
// reference both must match.
//
// ENTRY POINTS (extern "C"; <t> in {f32, f16, bf16}, InT its type):
//   gated_rms_norm_<t>(y, z, weight, out, GatedRmsNormParams p)
//     per row (b, t, hv) of Dv values: n = InT(y * rsqrt(mean(y^2) + eps) * weight),
//     out = InT(silu(z) * n). y [B, T, Hv, Dv] and weight [Dv] contiguous; z[b, t, hv, d] at
//     b * z_batch_stride + t * z_token_stride + hv * Dv + d (a view of the projection is fine).
//     block = (32, 4): one warp per row, lane l takes values l, l + 32, ...;
//     grid = ceil(rows / 4), rows = B * T * Hv. Any Dv.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/gated_rms_norm.cu

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/gated_rms_norm.h"
#include "cuda_convert.h"

namespace gated_rms_norm {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

template <typename InT>
__device__ void norm(const InT* __restrict__ y, const InT* __restrict__ z,
                     const InT* __restrict__ weight, InT* __restrict__ out,
                     const GatedRmsNormParams p) {
  // All 32 lanes of a warp share threadIdx.y: padding warps leave whole.
  const unsigned int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= p.rows) return;
  const unsigned int lane = threadIdx.x;
  const unsigned int dim = p.value_dim;
  const unsigned int hv = row % p.value_heads;
  const unsigned int bt = row / p.value_heads;
  const unsigned int t = bt % p.tokens;
  const unsigned int b = bt / p.tokens;
  const InT* y_row = y + (size_t)row * dim;
  const InT* z_row = z + (size_t)b * p.z_batch_stride + (size_t)t * p.z_token_stride +
                     (size_t)hv * dim;
  InT* out_row = out + (size_t)row * dim;

  float square_sum = 0.0f;
  for (unsigned int d = lane; d < dim; d += 32) {
    const float x = to_f32(y_row[d]);
    square_sum = fmaf(x, x, square_sum);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) square_sum += __shfl_xor_sync(0xffffffffu, square_sum, o);
  const float inv_rms = rsqrtf(square_sum / (float)dim + p.eps);
  for (unsigned int d = lane; d < dim; d += 32) {
    const float n = to_f32(from_f32<InT>(to_f32(y_row[d]) * inv_rms * to_f32(weight[d])));
    const float gate = to_f32(z_row[d]);
    out_row[d] = from_f32<InT>(gate / (1.0f + expf(-gate)) * n);
  }
}

}  // namespace gated_rms_norm

#define GATED_RMS_NORM(NAME, T)                                                      \
  extern "C" __global__ void gated_rms_norm_##NAME(const T* y, const T* z, const T* weight, \
                                                   T* out, const GatedRmsNormParams p) {    \
    gated_rms_norm::norm<T>(y, z, weight, out, p);                                   \
  }

GATED_RMS_NORM(f32, float)
GATED_RMS_NORM(f16, __half)
GATED_RMS_NORM(bf16, __nv_bfloat16)
