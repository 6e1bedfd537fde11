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
//   moe_route_block_<x>(logits, ids, weights, MoeRouteParams p)
//     the same outputs, bit for bit, from one block per token: block = 32 * ceil(E / 32)
//     threads (one per expert), grid = N. The warp body's k rounds are serial (~6.4 µs a call
//     at E 512, k 10 on the H200); here every warp offers its few best, which bound the k-th
//     largest from below, and the few experts above that bound are ranked in parallel.
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

constexpr uint32_t kMaxPerLane = 16;  // E <= 512

// The warp body: one warp routes token `token`, lane `lane` holding experts lane, lane + 32, ...
template <typename T>
__device__ void route(const T* logits, uint32_t* ids, float* weights, const MoeRouteParams p,
                      uint32_t token, uint32_t lane) {
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

// ---- The block body -------------------------------------------------------------------------

constexpr uint32_t kFull = 0xffffffffu;
constexpr uint32_t kMaxWarps = 16;  // one thread an expert, E <= 512

// What a block shares: a few KB, far under the 48 KB of static shared memory.
struct BlockShared {
  // The candidates' keys in expert order, and 4 zeros after the last (read as uint4s).
  alignas(16) uint32_t keys[32 * kMaxWarps + 4];
  float exps[32 * kMaxWarps];  // exp(logit - max) of every expert
  float warp_max[kMaxWarps];
  // Each warp's m = ceil(k / warps) largest keys: warps * m < warps + k <= 48.
  uint32_t warp_top[kMaxWarps + 32];
  uint32_t warp_count[kMaxWarps];
  uint32_t slot_id[32];
  float slot_weight[32];
};

// A non-NaN float's order as a signed integer's, and back (REDUX reduces integers only).
__device__ __forceinline__ int ordered(float f) {
  const int i = __float_as_int(f);
  return i ^ ((i >> 31) & 0x7fffffff);
}
__device__ __forceinline__ float from_ordered(int i) {
  return __int_as_float(i ^ ((i >> 31) & 0x7fffffff));
}

// The block body: the block routes token `token`, thread `thread` (of 32 * warps, warps =
// ceil(E / 32)) holding expert `thread`. Same selection, ids order and weight bits as `route`:
// - the softmax denominator is summed in `route`'s order (lane l: experts l, l + 32, ... in
//   turn, then across the lanes), every warp for itself, from the exps in shared memory;
// - an expert's key is its probability's bits + 1 (0: NaN or past E); the k slots are the k
//   largest keys, equal keys by the lower expert, as `route`'s rounds take them;
// - each warp hands in its m = ceil(k / warps) largest keys, one expert each: at least k
//   distinct experts, so an expert that k of them exceed is not in the top k. The others,
//   the candidates (typically 15-20 at E 512, k 10), are ranked against each other;
// - the chosen weights are summed in slot order, as `route` sums them.
template <typename T>
__device__ void route_block(const T* logits, uint32_t* ids, float* weights,
                            const MoeRouteParams p, uint32_t token, uint32_t thread,
                            uint32_t warps, BlockShared& sh) {
  if (token >= p.tokens) return;  // the whole block
  const uint32_t lane = thread & 31, warp = thread >> 5;
  const uint32_t E = p.experts, k = p.top_k, slots = k + p.has_shared;
  const T* row = logits + (size_t)token * (E + p.has_shared);
  const uint32_t e = thread;
  const float x = e < E ? to_f32(row[e]) : -INFINITY;
  // The largest logit, NaN left out (as `route`'s `>` leaves it): one value whatever the order.
  const int warp_top_logit = __reduce_max_sync(kFull, ordered(x > -INFINITY ? x : -INFINITY));
  if (lane == 0) sh.warp_max[warp] = from_ordered(warp_top_logit);
  // Slots no candidate fills keep `route`'s empty slot.
  if (thread < k) {
    sh.slot_id[thread] = E - 1;
    sh.slot_weight[thread] = -1.f;
  }
  __syncthreads();
  float top_logit = -INFINITY;
  for (uint32_t w = 0; w < warps; ++w) top_logit = fmaxf(top_logit, sh.warp_max[w]);
  const float ex = e < E ? expf(x - top_logit) : 0.f;
  if (e < E) sh.exps[e] = ex;
  __syncthreads();
  float local_sum = 0.f;
  for (uint32_t t = 0; t < warps; ++t) {
    if (lane + 32 * t < E) local_sum += sh.exps[lane + 32 * t];
  }
  const float total = warp_sum(local_sum);
  const float prob = e < E ? ex / total : -1.f;
  const uint32_t key = prob >= 0.f ? __float_as_uint(prob) + 1u : 0u;

  const uint32_t m = (k + warps - 1) / warps;
  uint32_t live = key;
  for (uint32_t r = 0; r < m; ++r) {
    const uint32_t top = __reduce_max_sync(kFull, live);
    const uint32_t first = __ffs(__ballot_sync(kFull, live == top)) - 1;
    if (lane == first) live = 0u;
    if (lane == 0) sh.warp_top[warp * m + r] = top;
  }
  __syncthreads();
  uint32_t above = 0;
  for (uint32_t j = 0; j < warps * m; ++j) above += sh.warp_top[j] > key ? 1u : 0u;
  const bool candidate = key != 0u && above < k;

  // The candidates in expert order: pos below the count of every warp before this one.
  const uint32_t mask = __ballot_sync(kFull, candidate);
  if (lane == 0) sh.warp_count[warp] = __popc(mask);
  __syncthreads();
  uint32_t pos = __popc(mask & ((1u << lane) - 1u)), count = 0;
  for (uint32_t w = 0; w < warps; ++w) {
    const uint32_t c = sh.warp_count[w];
    pos += w < warp ? c : 0u;
    count += c;
  }
  if (candidate) sh.keys[pos] = key;
  if (thread < 4) sh.keys[count + thread] = 0u;  // a zero key never comes first
  __syncthreads();
  if (candidate) {
    // Slot = how many candidates come first: a larger key, or an equal one of a lower expert.
    // Four keys a load, and no early exit, so that the loads are issued ahead.
    const auto first = [&](uint32_t other, uint32_t j) {
      return other > key || (other == key && j < pos) ? 1u : 0u;
    };
    uint32_t rank = 0;
    for (uint32_t j = 0; j < count; j += 4) {
      const uint4 q = *reinterpret_cast<const uint4*>(&sh.keys[j]);
      rank += first(q.x, j) + first(q.y, j + 1) + first(q.z, j + 2) + first(q.w, j + 3);
    }
    if (rank < k) {
      sh.slot_id[rank] = e;
      sh.slot_weight[rank] = prob;
    }
  }
  __syncthreads();
  if (warp != 0) return;
  float chosen_sum = 0.f;
  for (uint32_t r = 0; r < k; ++r) chosen_sum += sh.slot_weight[r];
  uint32_t* ids_row = ids + (size_t)token * slots;
  float* weights_row = weights + (size_t)token * slots;
  if (lane < k) {
    const float w = sh.slot_weight[lane];
    ids_row[lane] = sh.slot_id[lane];
    weights_row[lane] = p.renormalise ? w / chosen_sum : w;
  }
  if (p.has_shared && lane == 0) {
    ids_row[k] = E;
    weights_row[k] = 1.f / (1.f + expf(-to_f32(row[E])));
  }
}

}  // namespace moe_route

#define MOE_ROUTE_ENTRY(XN, XT)                                                              \
  extern "C" __global__ void moe_route_##XN(const XT* logits, uint32_t* ids,                 \
                                            float* weights, const MoeRouteParams p) {        \
    moe_route::route<XT>(logits, ids, weights, p, blockIdx.x * blockDim.y + threadIdx.y,     \
                         threadIdx.x);                                                       \
  }                                                                                          \
  extern "C" __global__ void __launch_bounds__(32 * moe_route::kMaxWarps)                    \
      moe_route_block_##XN(const XT* logits, uint32_t* ids, float* weights,                  \
                           const MoeRouteParams p) {                                         \
    __shared__ moe_route::BlockShared shared;                                                \
    moe_route::route_block<XT>(logits, ids, weights, p, blockIdx.x, threadIdx.x,             \
                               blockDim.x / 32, shared);                                     \
  }

MOE_ROUTE_ENTRY(f32, float)
MOE_ROUTE_ENTRY(f16, __half)
MOE_ROUTE_ENTRY(bf16, __nv_bfloat16)
