// MoE router: softmax over the routed experts' logits, top-k with the lowest expert index
// first among equal probabilities, optional renormalisation, and the shared expert's sigmoid
// gate as one more slot. crates/gdn-ops/src/ops/moe_route/cpu.rs is the reference.
//
// Per token n (logits row of E + has_shared values, in InT):
//   p = softmax(f32(logits[n, 0..E]))      (max-subtracted, f32)
//   slots 0..k: the k largest p, descending, ties by lower index; weight p, or p / sum of
//               the k chosen p (summed in slot order) when renormalise
//   slot k (has_shared): id E, weight sigmoid(f32(logits[n, E]))
// Outputs ids [N, S] u32 and weights [N, S] f32, S = k + has_shared.
//
// Launch geometry (ops/moe_route/metal.rs; kernels/emu/moe_route_harness.cpp emulates it):
// threadgroups (N, 1, 1), threads per threadgroup (32, 1, 1): one simdgroup per token. Lane
// l holds the probabilities of experts l, l + 32, ... in registers; each of the k rounds is
// a simd_max over the lanes' best remaining value, then a simd_min over the indices holding
// it.
//
// The host must only launch with 1 <= E <= 512 (kMaxPerLane * 32), 1 <= k <= min(32, E):
// the kernel cannot report a violation. NaN logits are never chosen; if fewer than k finite
// probabilities remain, the slot gets id E - 1 and weight -1 (ids stay in range for the
// gathered products that read them). bfloat needs MSL 3.1.

#include <metal_stdlib>
using namespace metal;

#include "params/moe_route.h"

template <typename InT>
inline void moe_route_impl(
    const device InT* logits,
    device uint* ids,
    device float* weights,
    constant MoeRouteParams& p,
    uint token,
    uint lane) {
  constexpr uint kMaxPerLane = 16;  // E <= 512
  // The whole simdgroup leaves together: every simd_* below has all 32 lanes.
  if (token >= p.tokens) {
    return;
  }
  const uint E = p.experts;
  const uint slots = p.top_k + p.has_shared;
  const device InT* row = logits + ulong(token) * (E + p.has_shared);

  float v[kMaxPerLane];
  float local_max = -INFINITY;
  for (uint t = 0; t < kMaxPerLane; ++t) {
    const uint e = lane + 32 * t;
    v[t] = e < E ? float(row[e]) : -INFINITY;
    local_max = v[t] > local_max ? v[t] : local_max;
  }
  const float top_logit = simd_max(local_max);
  float local_sum = 0.0f;
  for (uint t = 0; t < kMaxPerLane; ++t) {
    if (lane + 32 * t < E) {
      v[t] = exp(v[t] - top_logit);
      local_sum += v[t];
    }
  }
  const float total = simd_sum(local_sum);
  // Probabilities are >= 0; -1 marks an expert already chosen or past E, never chosen again.
  for (uint t = 0; t < kMaxPerLane; ++t) {
    v[t] = lane + 32 * t < E ? v[t] / total : -1.0f;
  }

  // Lane r keeps slot r (k <= 32).
  uint my_id = 0;
  float my_weight = 0.0f;
  float chosen_sum = 0.0f;
  for (uint r = 0; r < p.top_k; ++r) {
    // The lane's best: strictly greater, in ascending expert order, keeps the lowest index.
    float best = -1.0f;
    uint best_e = 0xFFFFFFFFu;
    for (uint t = 0; t < kMaxPerLane; ++t) {
      if (v[t] > best) {
        best = v[t];
        best_e = lane + 32 * t;
      }
    }
    const float top = simd_max(best);
    uint winner = simd_min(best == top ? best_e : 0xFFFFFFFFu);
    winner = winner < E ? winner : E - 1;
    for (uint t = 0; t < kMaxPerLane; ++t) {
      if (lane + 32 * t == winner) {
        v[t] = -1.0f;
      }
    }
    if (lane == r) {
      my_id = winner;
      my_weight = top;
    }
    chosen_sum += top;
  }
  device uint* ids_row = ids + ulong(token) * slots;
  device float* weights_row = weights + ulong(token) * slots;
  if (lane < p.top_k) {
    ids_row[lane] = my_id;
    weights_row[lane] = p.renormalise != 0 ? my_weight / chosen_sum : my_weight;
  }
  if (p.has_shared != 0 && lane == 0) {
    const float gate = float(row[E]);
    ids_row[p.top_k] = E;
    weights_row[p.top_k] = 1.0f / (1.0f + exp(-gate));
  }
}

// Plain kernels forwarding to the template (see kernels/affine.metal for why), named
// moe_route_{InT} as the host looks them up.
#define MOE_ROUTE(name, InT)                                                      \
  [[kernel]] void name(                                                           \
      const device InT* logits [[buffer(0)]],  /* [N, E + has_shared] */          \
      device uint* ids [[buffer(1)]],          /* [N, k + has_shared] */          \
      device float* weights [[buffer(2)]],     /* [N, k + has_shared] */          \
      constant MoeRouteParams& p [[buffer(3)]],                                   \
      uint3 tg [[threadgroup_position_in_grid]],                                  \
      uint lane [[thread_index_in_simdgroup]]) {                                  \
    moe_route_impl<InT>(logits, ids, weights, p, tg.x, lane);                     \
  }

MOE_ROUTE(moe_route_f32, float)
MOE_ROUTE(moe_route_f16, half)
#if defined(__HAVE_BFLOAT__)
MOE_ROUTE(moe_route_bf16, bfloat)
#endif
