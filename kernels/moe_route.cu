// MoE router on CUDA: the twin of kernels/moe_route.metal (same maths, same selection rule);
// crates/gdn-ops/src/ops/moe_route/cpu.rs is the reference.
//
// ENTRY POINTS (extern "C"; <x> in {f32, f16, bf16}):
//   moe_route_<x>(logits, ids, weights, MoeRouteParams p)
//     logits [N, E + has_shared] in <x>; ids [N, S] u32, weights [N, S] f32, S = k + has_shared.
//     p = softmax(logits[n, :E]) in f32; slots 0..k the k largest p descending, ties by the
//     lower index; weight p (or p / sum of the chosen p, in slot order, when renormalise);
//     slot k (has_shared): id E, weight sigmoid(logits[n, E]).
//     block = (32, W) threads (one warp per token), grid = ceil(N / W).
// The host launches only with 1 <= E <= 512 and 1 <= k <= min(32, E). NaN probabilities are
// never chosen; a slot without a candidate gets id E - 1 and weight -1.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 kernels/moe_route.cu -o moe_route.ptx

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/moe_route.h"
#include "cuda_convert.h"

namespace moe_route {

using cuda_convert::to_f32;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ void route(const T* logits, uint32_t* ids, float* weights, const MoeRouteParams p) {
  constexpr uint32_t kMaxPerLane = 16;  // E <= 512
  const uint32_t token = blockIdx.x * blockDim.y + threadIdx.y, lane = threadIdx.x;
  // Whole warps leave: every shuffle below has all 32 lanes.
  if (token >= p.tokens) return;
  const uint32_t E = p.experts, slots = p.top_k + p.has_shared;
  const T* row = logits + (size_t)token * (E + p.has_shared);
  float v[kMaxPerLane];
  float local_max = -INFINITY;
#pragma unroll
  for (uint32_t t = 0; t < kMaxPerLane; ++t) {
    const uint32_t e = lane + 32 * t;
    v[t] = e < E ? to_f32(row[e]) : -INFINITY;
    local_max = v[t] > local_max ? v[t] : local_max;
  }
  const float top_logit = warp_max(local_max);
  float local_sum = 0.f;
#pragma unroll
  for (uint32_t t = 0; t < kMaxPerLane; ++t) {
    if (lane + 32 * t < E) {
      v[t] = expf(v[t] - top_logit);
      local_sum += v[t];
    }
  }
  const float total = warp_sum(local_sum);
  // -1 marks an expert already chosen or past E.
#pragma unroll
  for (uint32_t t = 0; t < kMaxPerLane; ++t) v[t] = lane + 32 * t < E ? v[t] / total : -1.f;

  // Each lane's best remaining expert: the first (lowest) of its largest probabilities.
  float best = -1.f;
  uint32_t best_e = 0xFFFFFFFFu;
  auto rescan = [&]() {
    best = -1.f;
    best_e = 0xFFFFFFFFu;
#pragma unroll
    for (uint32_t t = 0; t < kMaxPerLane; ++t) {
      if (v[t] > best) {
        best = v[t];
        best_e = lane + 32 * t;
      }
    }
  };
  rescan();
  uint32_t my_id = 0;
  float my_weight = 0.f, chosen_sum = 0.f;
  for (uint32_t r = 0; r < p.top_k; ++r) {
    // The round's largest probability, then the lowest expert holding it: two warp reductions
    // in hardware (REDUX) where ten shuffles were. Probabilities are non-negative floats, whose
    // bits order as unsigned integers; + 1 keeps 0 for a lane with no candidate left.
    const uint32_t key = best >= 0.f ? __float_as_uint(best) + 1u : 0u;
    const uint32_t top_key = __reduce_max_sync(0xffffffffu, key);
    const float top = top_key == 0u ? -1.f : __uint_as_float(top_key - 1u);
    uint32_t winner = __reduce_min_sync(0xffffffffu, key == top_key ? best_e : 0xFFFFFFFFu);
    winner = winner < E ? winner : E - 1;
    if (best_e == winner) {  // only the winner's lane has a new best
#pragma unroll
      for (uint32_t t = 0; t < kMaxPerLane; ++t) {
        if (lane + 32 * t == winner) v[t] = -1.f;
      }
      rescan();
    }
    if (lane == r) {
      my_id = winner;
      my_weight = top;
    }
    chosen_sum += top;
  }
  uint32_t* ids_row = ids + (size_t)token * slots;
  float* weights_row = weights + (size_t)token * slots;
  if (lane < p.top_k) {
    ids_row[lane] = my_id;
    weights_row[lane] = p.renormalise ? my_weight / chosen_sum : my_weight;
  }
  if (p.has_shared && lane == 0) {
    ids_row[p.top_k] = E;
    weights_row[p.top_k] = 1.f / (1.f + expf(-to_f32(row[E])));
  }
}

}  // namespace moe_route

#define MOE_ROUTE_ENTRY(XN, XT)                                                        \
  extern "C" __global__ void moe_route_##XN(const XT* logits, uint32_t* ids,           \
                                            float* weights, const MoeRouteParams p) {  \
    moe_route::route<XT>(logits, ids, weights, p);                                     \
  }

MOE_ROUTE_ENTRY(f32, float)
MOE_ROUTE_ENTRY(f16, __half)
MOE_ROUTE_ENTRY(bf16, __nv_bfloat16)
