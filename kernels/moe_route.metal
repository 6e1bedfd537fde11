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
// moe_route_block_{InT}: the same outputs, bit for bit, from one threadgroup a token: threads
// (32 * ceil(E / 32), 1, 1), one an expert, and kBlockScratchBytes of threadgroup memory at
// index 0. The simdgroup body's k rounds are serial; here each simdgroup offers its few best,
// which bound the k-th largest from below, and the few experts above the bound are ranked in
// parallel (the CUDA twin's block body, kernels/moe_route.cu, measured there).
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

// ---- The threadgroup body -------------------------------------------------------------------

constant constexpr uint kMaxSimdgroups = 16;  // one thread an expert, E <= 512
// Threadgroup memory, in 4-byte words: the candidates' keys and the exps (one an expert),
// each simdgroup's largest logit, its m = ceil(k / simdgroups) best keys (simdgroups * m <
// simdgroups + k <= 48), its candidate count, and the k slots' ids and weights.
constant constexpr uint kKeys = 0;  // and 4 zeros after the last candidate (read 4 a step)
constant constexpr uint kExps = kKeys + 32 * kMaxSimdgroups + 4;
constant constexpr uint kGroupMax = kExps + 32 * kMaxSimdgroups;
constant constexpr uint kGroupTop = kGroupMax + kMaxSimdgroups;
constant constexpr uint kGroupCount = kGroupTop + kMaxSimdgroups + 32;
constant constexpr uint kSlotId = kGroupCount + kMaxSimdgroups;
constant constexpr uint kSlotWeight = kSlotId + 32;
// The host sets this many (BLOCK_SCRATCH_WORDS in crates/gdn-ops/src/ops/moe_route/mod.rs).
constant constexpr uint kBlockScratchWords = 1172;
static_assert(kSlotWeight + 32 == kBlockScratchWords, "the layout fills the scratch");

// A non-NaN float's order as a signed integer's, and back.
inline int ordered(float f) {
  const int i = as_type<int>(f);
  return i ^ ((i >> 31) & 0x7fffffff);
}
inline float from_ordered(int i) {
  return as_type<float>(i ^ ((i >> 31) & 0x7fffffff));
}

// Thread `thread` of 32 * groups holds expert `thread`. Same selection, ids order and weight
// bits as moe_route_impl:
// - the softmax denominator summed in its order (lane l: experts l, l + 32, ... in turn, then
//   simd_sum), every simdgroup for itself from the exps in threadgroup memory;
// - an expert's key is its probability's bits + 1 (0: NaN or past E); the k slots are the k
//   largest keys, equal keys by the lower expert, as its rounds take them;
// - each simdgroup hands in its m = ceil(k / groups) largest keys, one expert each: at least
//   k distinct experts, so an expert that k of them exceed is not in the top k. The others,
//   the candidates, are ranked against each other;
// - the chosen weights summed in slot order.
template <typename InT>
inline void moe_route_block_impl(
    const device InT* logits,
    device uint* ids,
    device float* weights,
    constant MoeRouteParams& p,
    threadgroup float* scratch,
    uint token,
    uint thread,
    uint groups) {
  if (token >= p.tokens) {
    return;  // the whole threadgroup
  }
  threadgroup float* exps = scratch + kExps;
  threadgroup uint* keys = (threadgroup uint*)(scratch + kKeys);
  threadgroup float* group_max = scratch + kGroupMax;
  threadgroup uint* group_top = (threadgroup uint*)(scratch + kGroupTop);
  threadgroup uint* group_count = (threadgroup uint*)(scratch + kGroupCount);
  threadgroup uint* slot_id = (threadgroup uint*)(scratch + kSlotId);
  threadgroup float* slot_weight = scratch + kSlotWeight;
  const uint lane = thread % 32;
  const uint group = thread / 32;
  const uint E = p.experts;
  const uint k = p.top_k;
  const uint slots = k + p.has_shared;
  const device InT* row = logits + ulong(token) * (E + p.has_shared);
  const uint e = thread;
  const float x = e < E ? float(row[e]) : -INFINITY;
  // The largest logit, NaN left out (as moe_route_impl's `>` leaves it).
  const int group_top_logit = simd_max(ordered(x > -INFINITY ? x : -INFINITY));
  if (lane == 0) {
    group_max[group] = from_ordered(group_top_logit);
  }
  // Slots no candidate fills keep moe_route_impl's empty slot.
  if (thread < k) {
    slot_id[thread] = E - 1;
    slot_weight[thread] = -1.0f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float top_logit = -INFINITY;
  for (uint g = 0; g < groups; ++g) {
    top_logit = max(top_logit, group_max[g]);
  }
  const float ex = e < E ? exp(x - top_logit) : 0.0f;
  if (e < E) {
    exps[e] = ex;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float local_sum = 0.0f;
  for (uint t = 0; t < groups; ++t) {
    if (lane + 32 * t < E) {
      local_sum += exps[lane + 32 * t];
    }
  }
  const float total = simd_sum(local_sum);
  const float prob = e < E ? ex / total : -1.0f;
  const uint key = prob >= 0.0f ? as_type<uint>(prob) + 1 : 0;

  const uint m = (k + groups - 1) / groups;
  uint live = key;
  for (uint r = 0; r < m; ++r) {
    const uint top = simd_max(live);
    const uint first = simd_min(live == top ? lane : 32u);
    if (lane == first) {
      live = 0;
    }
    if (lane == 0) {
      group_top[group * m + r] = top;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint above = 0;
  for (uint j = 0; j < groups * m; ++j) {
    above += group_top[j] > key ? 1 : 0;
  }
  const bool candidate = key != 0 && above < k;

  // The candidates in expert order: pos below the count of every simdgroup before this one.
  uint pos = simd_prefix_exclusive_sum(candidate ? 1u : 0u);
  const uint in_group = simd_sum(candidate ? 1u : 0u);
  if (lane == 0) {
    group_count[group] = in_group;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint count = 0;
  for (uint g = 0; g < groups; ++g) {
    const uint c = group_count[g];
    pos += g < group ? c : 0;
    count += c;
  }
  if (candidate) {
    keys[pos] = key;
  }
  if (thread < 4) {
    keys[count + thread] = 0;  // a zero key never comes first
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (candidate) {
    // Slot = how many candidates come first: a larger key, or an equal one of a lower expert.
    // Four keys a step, and no early exit, so that the loads are issued ahead.
    uint rank = 0;
    for (uint j = 0; j < count; j += 4) {
      for (uint i = j; i < j + 4; ++i) {
        const uint other = keys[i];
        rank += other > key || (other == key && i < pos) ? 1 : 0;
      }
    }
    if (rank < k) {
      slot_id[rank] = e;
      slot_weight[rank] = prob;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (group != 0) {
    return;
  }
  float chosen_sum = 0.0f;
  for (uint r = 0; r < k; ++r) {
    chosen_sum += slot_weight[r];
  }
  device uint* ids_row = ids + ulong(token) * slots;
  device float* weights_row = weights + ulong(token) * slots;
  if (lane < k) {
    const float w = slot_weight[lane];
    ids_row[lane] = slot_id[lane];
    weights_row[lane] = p.renormalise != 0 ? w / chosen_sum : w;
  }
  if (p.has_shared != 0 && lane == 0) {
    const float gate = float(row[E]);
    ids_row[k] = E;
    weights_row[k] = 1.0f / (1.0f + exp(-gate));
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

#define MOE_ROUTE_BLOCK(name, InT)                                                         \
  [[kernel]] void name(                                                                    \
      const device InT* logits [[buffer(0)]],  /* [N, E + has_shared] */                   \
      device uint* ids [[buffer(1)]],          /* [N, k + has_shared] */                   \
      device float* weights [[buffer(2)]],     /* [N, k + has_shared] */                   \
      constant MoeRouteParams& p [[buffer(3)]],                                            \
      threadgroup float* scratch [[threadgroup(0)]], /* kBlockScratchWords */              \
      uint3 tg [[threadgroup_position_in_grid]],                                           \
      uint thread [[thread_index_in_threadgroup]],                                         \
      uint groups [[simdgroups_per_threadgroup]]) {                                        \
    moe_route_block_impl<InT>(logits, ids, weights, p, scratch, tg.x, thread, groups);     \
  }

MOE_ROUTE(moe_route_f32, float)
MOE_ROUTE(moe_route_f16, half)
MOE_ROUTE_BLOCK(moe_route_block_f32, float)
MOE_ROUTE_BLOCK(moe_route_block_f16, half)
#if defined(__HAVE_BFLOAT__)
MOE_ROUTE(moe_route_bf16, bfloat)
MOE_ROUTE_BLOCK(moe_route_block_bf16, bfloat)
#endif
