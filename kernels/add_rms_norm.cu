// Fused residual add + RMSNorm on CUDA: the twin of kernels/add_rms_norm.metal, with
// crates/gdn-ops/src/ops/add_rms_norm/cpu.rs as the reference both must match.
//   sum    = InT(float(residual) + float(delta))          (only when has_delta)
//   normed = InT(float(sum) * rsqrt(mean(float(sum)^2) + eps) * float(weight))
//
// ENTRY POINTS (extern "C"; <t> in {f32, f16, bf16}):
//   add_rms_norm_<t>(residual, delta, weight, sum, normed, AddRmsNormParams p)
//   block = ceil(cols / kPer) threads rounded up to a multiple of 32 (at most 1024), one block
//   per row; grid = N. cols <= kPer * 1024 = 8192 (MAX_COLS on the host).
// Without a delta (has_delta == 0) delta and sum are never touched; pass any valid pointer.
//
// A decode step normalises one row of a few thousand values: one warp walking it in a loop
// spent ~30-50 us waiting on one load after another. Here every thread loads its kPer columns
// at once (a row is in flight in one go), keeps them in registers for the second pass, and the
// sum of squares is a shuffle within each warp and a pass over the warps' sums in shared
// memory. The squares are summed in a different order than the CPU twin (within rounding).
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 kernels/add_rms_norm.cu -o add_rms_norm.ptx

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/add_rms_norm.h"
#include "cuda_block_sum.h"
#include "cuda_convert.h"

namespace add_rms_norm {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

// Columns per thread, held in registers (ADD_RMS_NORM_PER on the host).
constexpr uint32_t kPer = 8;

using cuda_block_sum::block_sum;

// The body, with the thread and block indices and the shared scratch as arguments.
template <typename T>
__device__ __forceinline__ void row_body(const T* __restrict__ residual, const T* __restrict__ delta,
                                         const T* __restrict__ weight, T* __restrict__ sum,
                                         T* __restrict__ normed, const AddRmsNormParams& p,
                                         uint32_t row, uint32_t tid, uint32_t threads, float* warp_sums) {
  if (row >= p.rows) return;  // the whole block
  const size_t base = (size_t)row * p.cols;
  const bool add = p.has_delta != 0;
  float v[kPer];
#pragma unroll
  for (uint32_t k = 0; k < kPer; ++k) {
    const uint32_t j = tid + k * threads;
    v[k] = j < p.cols ? to_f32(residual[base + j]) : 0.f;
  }
  if (add) {
#pragma unroll
    for (uint32_t k = 0; k < kPer; ++k) {
      const uint32_t j = tid + k * threads;
      // Rounded before it is squared: the norm sees the stored sum.
      if (j < p.cols) v[k] = to_f32(from_f32<T>(v[k] + to_f32(delta[base + j])));
    }
  }
  // The norm's weights are loaded before the reduction waits, not after it.
  float wt[kPer];
#pragma unroll
  for (uint32_t k = 0; k < kPer; ++k) {
    const uint32_t j = tid + k * threads;
    wt[k] = j < p.cols ? to_f32(weight[j]) : 0.f;
  }
  float squares = 0.f;
#pragma unroll
  for (uint32_t k = 0; k < kPer; ++k) squares = fmaf(v[k], v[k], squares);
  const float inv = rsqrtf(block_sum(squares, warp_sums, tid, threads) / (float)p.cols + p.eps);
#pragma unroll
  for (uint32_t k = 0; k < kPer; ++k) {
    const uint32_t j = tid + k * threads;
    if (j < p.cols) {
      if (add) sum[base + j] = from_f32<T>(v[k]);
      normed[base + j] = from_f32<T>(v[k] * inv * wt[k]);
    }
  }
}

template <typename T>
__device__ void run(const T* residual, const T* delta, const T* weight, T* sum, T* normed,
                    const AddRmsNormParams p) {
  __shared__ float warp_sums[32];
  row_body<T>(residual, delta, weight, sum, normed, p, blockIdx.x, threadIdx.x, blockDim.x, warp_sums);
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
