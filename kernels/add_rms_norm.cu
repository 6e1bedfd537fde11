// Fused residual add + RMSNorm on CUDA: the twin of kernels/add_rms_norm.metal, with
// crates/gdn-ops/src/ops/add_rms_norm/cpu.rs as the reference both must match.
//   sum    = InT(float(residual) + float(delta))          (only when has_delta)
//   normed = InT(float(sum) * rsqrt(mean(float(sum)^2) + eps) * float(weight))
//
// ENTRY POINTS (extern "C"; <t> in {f32, f16, bf16}):
//   add_rms_norm_<t>(residual, delta, weight, sum, normed, AddRmsNormParams p)
//   block = (32, ROWS_PER_BLOCK = 4) threads, one warp per row; grid = ceil(N / 4).
// Without a delta (has_delta == 0) delta and sum are never touched; pass any valid pointer.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 kernels/add_rms_norm.cu -o add_rms_norm.ptx

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/add_rms_norm.h"
#include "cuda_convert.h"

namespace add_rms_norm {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

template <typename T>
__device__ void run(const T* residual, const T* delta, const T* weight, T* sum, T* normed,
                    const AddRmsNormParams p) {
  const uint32_t row = blockIdx.x * blockDim.y + threadIdx.y, lane = threadIdx.x;
  if (row >= p.rows) return;
  const size_t base = (size_t)row * p.cols;
  const bool add = p.has_delta != 0;
  float squares = 0.f;
  for (uint32_t j = lane; j < p.cols; j += 32) {
    float s = to_f32(residual[base + j]);
    if (add) {
      const T rounded = from_f32<T>(s + to_f32(delta[base + j]));
      sum[base + j] = rounded;
      s = to_f32(rounded);
    }
    squares = fmaf(s, s, squares);
  }
  for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
  const float inv = rsqrtf(squares / (float)p.cols + p.eps);
  const T* src = add ? sum : residual;
  for (uint32_t j = lane; j < p.cols; j += 32) {
    normed[base + j] = from_f32<T>(to_f32(src[base + j]) * inv * to_f32(weight[j]));
  }
}

}  // namespace add_rms_norm

#define ADD_RMS_NORM_ENTRY(TN, T)                                                          \
  extern "C" __global__ void add_rms_norm_##TN(const T* residual, const T* delta,          \
                                               const T* weight, T* sum, T* normed,         \
                                               const AddRmsNormParams p) {                 \
    add_rms_norm::run<T>(residual, delta, weight, sum, normed, p);                         \
  }

ADD_RMS_NORM_ENTRY(f32, float)
ADD_RMS_NORM_ENTRY(f16, __half)
ADD_RMS_NORM_ENTRY(bf16, __nv_bfloat16)
