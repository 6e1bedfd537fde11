// Greedy pick: per logits row, the first index of the largest finite value and the count of
// non-finite values, in two passes. crates/gdn-ops/src/ops/greedy_pick/cpu.rs is the
// reference; ops/greedy_pick/mod.rs has the spec.
//
// Slice pass, greedy_pick_slices_<in>: threadgroups (B, N, 1) of GREEDY_PICK_THREADS threads
// (8 simdgroups). Threadgroup (b, n) reads row n's values [b * slice, min(V, (b + 1) * slice))
// with a stride of the threadgroup (coalesced), each thread keeping its best finite value
// (strictly greater replaces, so its first index stays) and counting the rest; a simdgroup
// butterfly, then simdgroup 0 over the 8 simdgroups' records in threadgroup memory (3 words
// each, 96 bytes), leaves one record in partials[n * B + b]. An empty slice leaves
// (-INFINITY, GREEDY_PICK_NONE, 0).
// Finish pass, greedy_pick_finish: threadgroups (N, 1, 1) of 32 threads (one simdgroup per
// row): lane l takes records l, l + 32, ... then a butterfly; lane 0 writes out[n] = (index,
// count), index 0 when no value was finite.
//
// Records are ordered by value, then by the lower index: a total order, so the butterfly
// leaves the same record in every lane, whatever the slicing, and it is the CPU twin's pick.
// Finiteness is tested on the f32 bits: the run-time compiler uses fast math, under which
// isfinite and NaN comparisons may be folded away. bfloat needs MSL 3.1.

#include <metal_stdlib>
using namespace metal;

#include "params/greedy_pick.h"

struct GreedyPickBest {
  float value;
  uint index;
  uint nonfinite;
};

// NaN and +-Inf have every exponent bit set (f16 and bf16 keep that through the widening).
inline bool greedy_pick_finite(float x) {
  return (as_type<uint>(x) & 0x7F800000u) != 0x7F800000u;
}

// Whether record a comes before b: larger value, or equal value and lower index.
inline bool greedy_pick_before(GreedyPickBest a, GreedyPickBest b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

// The first record of the simdgroup's, and the simdgroup's count, in every lane.
inline GreedyPickBest greedy_pick_simd(GreedyPickBest b) {
  for (ushort o = 16; o > 0; o >>= 1) {
    GreedyPickBest other;
    other.value = simd_shuffle_xor(b.value, o);
    other.index = simd_shuffle_xor(b.index, o);
    other.nonfinite = 0;
    if (greedy_pick_before(other, b)) {
      b.value = other.value;
      b.index = other.index;
    }
  }
  b.nonfinite = simd_sum(b.nonfinite);
  return b;
}

inline GreedyPickBest greedy_pick_none() {
  GreedyPickBest b;
  b.value = -INFINITY;
  b.index = GREEDY_PICK_NONE;
  b.nonfinite = 0;
  return b;
}

template <typename InT>
inline void greedy_pick_slices_impl(
    const device InT* logits,
    device GreedyPickPartial* partials,
    threadgroup uint* scratch,
    constant GreedyPickParams& p,
    uint block,
    uint row,
    uint tid,
    uint simd,
    uint lane) {
  constexpr uint kSimdgroups = GREEDY_PICK_THREADS / 32;
  const uint begin = min(block * p.slice, p.vocab);
  const uint end = min(begin + p.slice, p.vocab);
  const device InT* values = logits + ulong(row) * p.vocab;
  GreedyPickBest best = greedy_pick_none();
  for (uint i = begin + tid; i < end; i += GREEDY_PICK_THREADS) {
    const float x = float(values[i]);
    if (!greedy_pick_finite(x)) {
      best.nonfinite += 1;
    } else if (x > best.value) {  // every finite x beats the initial -INFINITY
      best.value = x;
      best.index = i;
    }
  }
  best = greedy_pick_simd(best);
  if (lane == 0) {
    scratch[3 * simd] = as_type<uint>(best.value);
    scratch[3 * simd + 1] = best.index;
    scratch[3 * simd + 2] = best.nonfinite;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  // The whole of simdgroup 0 runs the second butterfly (lanes past the 8 records bring none).
  if (simd != 0) {
    return;
  }
  GreedyPickBest mine = greedy_pick_none();
  if (lane < kSimdgroups) {
    mine.value = as_type<float>(scratch[3 * lane]);
    mine.index = scratch[3 * lane + 1];
    mine.nonfinite = scratch[3 * lane + 2];
  }
  mine = greedy_pick_simd(mine);
  if (lane == 0) {
    device GreedyPickPartial& out = partials[ulong(row) * p.blocks + block];
    out.value = mine.value;
    out.index = mine.index;
    out.nonfinite = mine.nonfinite;
  }
}

inline void greedy_pick_finish_impl(
    const device GreedyPickPartial* partials,
    device uint* out,
    constant GreedyPickParams& p,
    uint row,
    uint lane) {
  const device GreedyPickPartial* records = partials + ulong(row) * p.blocks;
  GreedyPickBest best = greedy_pick_none();
  for (uint b = lane; b < p.blocks; b += 32) {
    GreedyPickBest r;
    r.value = records[b].value;
    r.index = records[b].index;
    r.nonfinite = 0;
    if (greedy_pick_before(r, best)) {
      best.value = r.value;
      best.index = r.index;
    }
    best.nonfinite += records[b].nonfinite;
  }
  best = greedy_pick_simd(best);
  if (lane == 0) {
    out[2 * ulong(row)] = best.index == GREEDY_PICK_NONE ? 0u : best.index;
    out[2 * ulong(row) + 1] = best.nonfinite;
  }
}

// Plain kernels forwarding to the template (see kernels/affine.metal for why), named
// greedy_pick_slices_{InT} as the host looks them up.
#define GREEDY_PICK_SLICES(name, InT)                                                   \
  [[kernel]] void name(                                                                 \
      const device InT* logits [[buffer(0)]],                 /* [N, V] */              \
      device GreedyPickPartial* partials [[buffer(1)]],       /* [N, B] */              \
      constant GreedyPickParams& p [[buffer(2)]],                                       \
      threadgroup uint* scratch [[threadgroup(0)]],           /* 3 words a simdgroup */ \
      uint3 tg [[threadgroup_position_in_grid]],                                        \
      uint tid [[thread_index_in_threadgroup]],                                         \
      uint simd [[simdgroup_index_in_threadgroup]],                                     \
      uint lane [[thread_index_in_simdgroup]]) {                                        \
    greedy_pick_slices_impl<InT>(logits, partials, scratch, p, tg.x, tg.y, tid, simd, lane); \
  }

GREEDY_PICK_SLICES(greedy_pick_slices_f32, float)
GREEDY_PICK_SLICES(greedy_pick_slices_f16, half)
#if defined(__HAVE_BFLOAT__)
GREEDY_PICK_SLICES(greedy_pick_slices_bf16, bfloat)
#endif

[[kernel]] void greedy_pick_finish(
    const device GreedyPickPartial* partials [[buffer(0)]],  // [N, B]
    device uint* out [[buffer(1)]],                          // [N, 2]
    constant GreedyPickParams& p [[buffer(2)]],
    uint3 tg [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]]) {
  greedy_pick_finish_impl(partials, out, p, tg.x, lane);
}
