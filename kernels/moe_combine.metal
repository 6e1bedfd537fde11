// MoE combine: the routing-weighted sum of the expert outputs of one token (the shared expert
// being one more slot), the residual add, and the RMSNorm that follows it, in one pass.
// crates/gdn-ops/src/ops/moe_combine/cpu.rs is the reference.
//
// Per token n and column j (f32 arithmetic; InT is the activation dtype):
//   acc    = sum_s weights[n, s] * f32(down[n, s, j])   (slots in order)
//   sum    = InT(f32(residual[n, j]) + f32(InT(acc)))    (has_residual; else InT(acc))
//   normed = InT(f32(sum) * rsqrt(mean_j(f32(sum)^2) + eps) * f32(norm_weight[j]))   (has_norm)
//
// Launch geometry (ops/moe_combine/metal.rs; kernels/emu/moe_combine_harness.cpp emulates
// it): threadgroups (N, 1, 1), threads per threadgroup (T, 1, 1) with T = combine_threads(H)
// (ops/moe_combine/mod.rs: ceil(H / kPer) rounded up to whole simdgroups, at most 512),
// threadgroup memory 32 floats (128 bytes) at index 0: one threadgroup per token row; thread t
// takes columns t, t + T, ... (consecutive threads, consecutive addresses). While H <= kPer * T
// (every row up to 2048 wide) a thread keeps its kPer columns in registers, so every slot's
// loads of the row go out together and the norm reads nothing back (one threadgroup walking
// the row column after column waited on its loads: 24 us of a decode step on the H100's twin);
// wider rows take their columns in turns and read back only the sums the same thread wrote.
// The sum of squares is reduced per simdgroup, then across the simdgroups through threadgroup
// memory.
//
// Gathered (prefill: the expert outputs in grouped order), `down` is [down_rows, H] and
// rows[n, s] names the row of token n's slot s; a row index at or past down_rows adds
// nothing (the host never passes one; the guard keeps a bad one in bounds).
//
// Without a norm (has_norm == 0) buffers 4 and 6 are never touched, without a residual buffer
// 3 is never read, and unless gathered buffer 1 is never read, but bind one there (any
// buffer) so validation layers stay quiet. bfloat needs MSL 3.1.

#include <metal_stdlib>
using namespace metal;

#include "params/moe_combine.h"

constant constexpr uint kPer = 4;  // COMBINE_PER on the host

// The weighted sum of a token's slots at column j.
template <typename InT>
inline float combine_column(const device InT* down, const device uint* slot_rows,
                            const device float* w, constant MoeCombineParams& p, uint token,
                            uint j) {
  float acc = 0.0f;
  for (uint s = 0; s < p.slots; ++s) {
    const ulong r = p.gathered != 0 ? ulong(slot_rows[s]) : ulong(token) * p.slots + s;
    if (p.gathered != 0 && r >= p.down_rows) {
      continue;
    }
    acc += w[s] * float(down[r * p.hidden + j]);
  }
  return acc;
}

template <typename InT>
inline InT combine_total(const device InT* residual, constant MoeCombineParams& p, ulong at,
                         float acc) {
  return p.has_residual != 0
             ? static_cast<InT>(float(residual[at]) + float(static_cast<InT>(acc)))
             : static_cast<InT>(acc);
}

template <typename InT>
inline void moe_combine_impl(
    const device InT* down,
    const device uint* rows,
    const device float* weights,
    const device InT* residual,
    const device InT* norm_weight,
    device InT* sum,
    device InT* normed,
    constant MoeCombineParams& p,
    threadgroup float* scratch,
    uint token,
    uint thread_index,
    uint threads,
    uint simdgroup,
    uint lane) {
  // The whole threadgroup leaves together: the simd_sum and the barrier below have every
  // thread.
  if (token >= p.tokens) {
    return;
  }
  const uint H = p.hidden;
  const device float* w = weights + ulong(token) * p.slots;
  const device uint* slot_rows = rows + ulong(token) * p.slots;
  const ulong row = ulong(token) * H;
  const bool in_registers = H <= kPer * threads;  // uniform over the threadgroup
  float t[kPer];
  float squares = 0.0f;
  if (in_registers) {
    for (uint k = 0; k < kPer; ++k) {
      const uint j = thread_index + k * threads;
      t[k] = j < H ? combine_column(down, slot_rows, w, p, token, j) : 0.0f;
    }
    for (uint k = 0; k < kPer; ++k) {
      const uint j = thread_index + k * threads;
      if (j < H) {
        const InT total = combine_total(residual, p, row + j, t[k]);
        sum[row + j] = total;
        t[k] = float(total);
        squares += t[k] * t[k];
      }
    }
  } else {
    for (uint j = thread_index; j < H; j += threads) {
      const InT total = combine_total(residual, p, row + j, combine_column(down, slot_rows, w, p, token, j));
      sum[row + j] = total;
      squares += float(total) * float(total);
    }
  }
  // Uniform over the threadgroup: every thread takes the same branch.
  if (p.has_norm == 0) {
    return;
  }
  const float simdgroup_squares = simd_sum(squares);
  if (lane == 0) {
    scratch[simdgroup] = simdgroup_squares;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  // Every thread sums the partials in the same order: the same value everywhere.
  float total = 0.0f;
  for (uint s = 0; s < threads / 32; ++s) {
    total += scratch[s];
  }
  const float inv_rms = rsqrt(total / float(H) + p.eps);
  if (in_registers) {
    for (uint k = 0; k < kPer; ++k) {
      const uint j = thread_index + k * threads;
      if (j < H) {
        normed[row + j] = static_cast<InT>(t[k] * inv_rms * float(norm_weight[j]));
      }
    }
  } else {
    for (uint j = thread_index; j < H; j += threads) {
      normed[row + j] = static_cast<InT>(float(sum[row + j]) * inv_rms * float(norm_weight[j]));
    }
  }
}

// Plain kernels forwarding to the template (see kernels/affine.metal for why), named
// moe_combine_{InT} as the host looks them up.
#define MOE_COMBINE(name, InT)                                                    \
  [[kernel]] void name(                                                           \
      const device InT* down [[buffer(0)]],         /* [N, S, H] or [rows, H] */  \
      const device uint* rows [[buffer(1)]],        /* [N, S], if gathered */     \
      const device float* weights [[buffer(2)]],    /* [N, S] */                  \
      const device InT* residual [[buffer(3)]],     /* [N, H], if has_residual */ \
      const device InT* norm_weight [[buffer(4)]],  /* [H], read if has_norm */   \
      device InT* sum [[buffer(5)]],                /* [N, H] */                  \
      device InT* normed [[buffer(6)]],             /* [N, H], if has_norm */     \
      constant MoeCombineParams& p [[buffer(7)]],                                 \
      threadgroup float* scratch [[threadgroup(0)]],  /* [32] */                  \
      uint3 tg [[threadgroup_position_in_grid]],                                  \
      uint thread_index [[thread_index_in_threadgroup]],                          \
      uint3 tpg [[threads_per_threadgroup]],                                      \
      uint simdgroup [[simdgroup_index_in_threadgroup]],                          \
      uint lane [[thread_index_in_simdgroup]]) {                                  \
    moe_combine_impl<InT>(down, rows, weights, residual, norm_weight, sum, normed, \
                          p, scratch, tg.x, thread_index, tpg.x, simdgroup, lane); \
  }

MOE_COMBINE(moe_combine_f32, float)
MOE_COMBINE(moe_combine_f16, half)
#if defined(__HAVE_BFLOAT__)
MOE_COMBINE(moe_combine_bf16, bfloat)
#endif
