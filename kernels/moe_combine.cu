// MoE combine on CUDA: the twin of kernels/moe_combine.metal (same maths, same roundings);
// crates/gdn-ops/src/ops/moe_combine/cpu.rs is the reference.
//
// ENTRY POINTS (extern "C"; <x> in {f32, f16, bf16}):
//   moe_combine_<x>(down, rows, weights, residual, norm_weight, sum, normed, MoeCombineParams p)
//     down [N, S, H] (or, gathered, [down_rows, H] with rows [N, S] u32 naming the row of
//     each slot), residual [N, H], norm_weight [H], sum and normed [N, H] in <x>;
//     weights [N, S] f32. Per token n, column j, in f32:
//       acc = sum_s weights[n, s] * down[n, s, j]           (slots in order)
//       sum = x(residual[n, j] + x(acc))   (has_residual; else sum = x(acc))
//       normed = x(sum * rsqrt(mean_j sum^2 + eps) * norm_weight[j])   (has_norm only)
//     block = 256 threads (one block per token row), grid = N.
// Without a norm (has_norm == 0) norm_weight and normed are never touched; without a residual
// residual is never read; unless gathered, rows is never read. A gathered row index at or past
// down_rows adds nothing (the host never passes one; the guard keeps a bad one in bounds).
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 kernels/moe_combine.cu -o moe_combine.ptx

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/moe_combine.h"
#include "cuda_convert.h"

namespace moe_combine {

constexpr uint32_t kThreads = 256;  // COMBINE_THREADS on the host

using cuda_convert::from_f32;
using cuda_convert::to_f32;

template <typename T>
__device__ void combine(const T* down, const uint32_t* rows, const float* weights,
                        const T* residual, const T* norm_weight, T* sum, T* normed,
                        const MoeCombineParams p) {
  __shared__ float warp_sums[kThreads / 32];
  const uint32_t token = blockIdx.x, H = p.hidden, S = p.slots;
  if (token >= p.tokens) return;  // the whole block
  const float* w = weights + (size_t)token * S;
  const uint32_t* slot_rows = rows + (size_t)token * S;
  const size_t row = (size_t)token * H;
  float squares = 0.f;
  for (uint32_t j = threadIdx.x; j < H; j += blockDim.x) {
    float acc = 0.f;
    for (uint32_t s = 0; s < S; ++s) {
      const size_t r = p.gathered ? (size_t)slot_rows[s] : (size_t)token * S + s;
      if (p.gathered && r >= p.down_rows) continue;
      acc = fmaf(w[s], to_f32(down[r * H + j]), acc);
    }
    const T total = p.has_residual
                        ? from_f32<T>(to_f32(residual[row + j]) + to_f32(from_f32<T>(acc)))
                        : from_f32<T>(acc);
    sum[row + j] = total;
    const float t = to_f32(total);
    squares = fmaf(t, t, squares);
  }
  if (!p.has_norm) return;  // uniform over the block
  for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = squares;
  __syncthreads();
  float total = 0.f;
  for (uint32_t i = 0; i < blockDim.x / 32; ++i) total += warp_sums[i];
  const float inv_rms = rsqrtf(total / (float)H + p.eps);
  // Each thread reads back only the sum values it wrote itself.
  for (uint32_t j = threadIdx.x; j < H; j += blockDim.x) {
    normed[row + j] = from_f32<T>(to_f32(sum[row + j]) * inv_rms * to_f32(norm_weight[j]));
  }
}

}  // namespace moe_combine

#define MOE_COMBINE_ENTRY(XN, XT)                                                          \
  extern "C" __global__ void moe_combine_##XN(                                             \
      const XT* down, const uint32_t* rows, const float* weights, const XT* residual,      \
      const XT* norm_weight, XT* sum, XT* normed, const MoeCombineParams p) {              \
    moe_combine::combine<XT>(down, rows, weights, residual, norm_weight, sum, normed, p);  \
  }

MOE_COMBINE_ENTRY(f32, float)
MOE_COMBINE_ENTRY(f16, __half)
MOE_COMBINE_ENTRY(bf16, __nv_bfloat16)
