// The hyper-connection kernels of a qwen4_exp decode step (crates/gdn-ops/src/ops/
// hyper_connection: the spec; its cpu.rs is the twin this must match):
//   hc_inject_norm: w = InT(2 * InT(sigmoid(InT(g[n,s] / S))))
//                   sum = InT(hs + InT(w * y[n,j]))                    (has_inject)
//                   with K = slots > 0: y[n,j] = InT(sum_k slot_weights[n,k] * y[n,k,j]),
//                   a MoE block's slot outputs summed as moe_combine sums them
//                   normed = InT(sum * rsqrt(mean_j sum^2 + eps) * weight[s,j])   (has_norm)
//   hc_act:         a[i] = InT(silu(InT(d[i] / S)))     (d: the down product's output)
//   hc_mix:         x[n,j] = InT((1/S) * sum_s InT(InT(sigmoid(u[n,s,j])) * normed[n,s,j]))
//   hc_up_mix:      hc_act, u[n,s,j] = InT(W[s*H+j] . a[n]) with the affine up matrix W
//                   [S*H, R] in f32 (ScT scales and biases), then hc_mix
//
// Launch, hc_inject_norm: threadgroups (N * S, 1, 1), one per stream row, of (T, 1, 1)
// threads with T = row_threads(H) (ceil(H / kPer) rounded up to whole simdgroups, at most
// 1024), threadgroup memory of 32 floats at index 0. Thread t holds columns t, t + T, ... (kPer
// of them) in registers between the injection and the norm; the sum of squares is a simd_sum
// per simdgroup and a pass over their partial sums (in another order than the CPU twin's,
// within rounding).
// Launch, hc_act: threadgroups (ceil(len / 256), 1, 1) of (256, 1, 1) threads, one value each.
// Launch, hc_mix: threadgroups (ceil(N * H / 256), 1, 1) of (256, 1, 1) threads, one output
// value each.
// Launch, hc_up_mix: threadgroups (ceil(H / 4), N, 1) of (32 * 4, 1, 1) threads (UP_MIX_WARPS
// simdgroups, one output value x[n, j] each, j = tg.x * 4 + simdgroup), threadgroup memory of
// R floats at index 0 (token n's activations, which every threadgroup recomputes). A
// simdgroup's lanes split among the streams (L = 32 / G lanes a stream, G the power of two >=
// min(S, 32)); lane q of a stream's group takes every L-th packed word of its row, s * sum(q a)
// + b * sum(a) a word, and xor shuffles add the group's lanes (another order than the CPU
// twin's, within rounding); the streams' terms are then added in stream order.
//
// Host obligations: H <= kPer * 1024 = 8192. Without an injection (has_inject == 0) y, gate
// and sum are never touched, without a norm (has_norm == 0) weight and normed neither: bind
// any buffer there so that validation layers stay quiet.

#include <metal_stdlib>
using namespace metal;

#include "params/hyper_connection.h"

constant constexpr uint kHcPer = 8;  // PER_THREAD on the host

inline float hc_sigmoid(float x) {
  return 1.0f / (1.0f + exp(-x));
}

template <typename InT>
inline void hc_inject_norm_impl(
    const device InT* hs,
    const device InT* y,
    const device InT* gate,
    const device float* weight,
    const device float* slot_weights,
    device InT* sum,
    device InT* normed,
    constant HcInjectNormParams& p,
    uint row,
    uint tid,
    uint threads,
    uint lane,
    uint simd,
    threadgroup float* partial) {
  if (row >= p.tokens * p.streams) {
    return;  // the whole threadgroup
  }
  const uint n = row / p.streams;
  const uint s = row % p.streams;
  const ulong base = ulong(row) * p.cols;
  const bool inject = p.has_inject != 0;
  float v[kHcPer];
  for (uint k = 0; k < kHcPer; ++k) {
    const uint j = tid + k * threads;
    v[k] = j < p.cols ? float(hs[base + j]) : 0.0f;
  }
  if (inject) {
    // gate is [N, S]: this row's logit.
    const float g = float(InT(float(gate[row]) / float(p.streams)));
    const float w = float(InT(2.0f * float(InT(hc_sigmoid(g)))));
    for (uint k = 0; k < kHcPer; ++k) {
      const uint j = tid + k * threads;
      if (j >= p.cols) {
        continue;
      }
      float yj;
      if (p.slots == 0) {
        yj = float(y[ulong(n) * p.cols + j]);
      } else {
        // moe_combine's sum over the slots, in order, rounded once.
        float acc = 0.0f;
        for (uint k2 = 0; k2 < p.slots; ++k2) {
          const ulong r = ulong(n) * p.slots + k2;
          acc += slot_weights[r] * float(y[r * p.cols + j]);
        }
        yj = float(InT(acc));
      }
      // Rounded before it is squared: the norm sees the stored sum.
      v[k] = float(InT(v[k] + float(InT(w * yj))));
    }
  }
  if (p.has_norm != 0) {
    float squares = 0.0f;
    for (uint k = 0; k < kHcPer; ++k) {
      squares += v[k] * v[k];
    }
    squares = simd_sum(squares);
    if (lane == 0) {
      partial[simd] = squares;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint i = 0; i < threads / 32; ++i) {
      total += partial[i];
    }
    const float inv = rsqrt(total / float(p.cols) + p.eps);
    for (uint k = 0; k < kHcPer; ++k) {
      const uint j = tid + k * threads;
      if (j < p.cols) {
        normed[base + j] = InT(v[k] * inv * weight[ulong(s) * p.cols + j]);
      }
    }
  }
  if (inject) {
    for (uint k = 0; k < kHcPer; ++k) {
      const uint j = tid + k * threads;
      if (j < p.cols) {
        sum[base + j] = InT(v[k]);
      }
    }
  }
}

template <typename InT>
inline void hc_act_impl(const device InT* d, device InT* a, constant HcActParams& p, uint i) {
  if (i >= p.len) {
    return;
  }
  const float t = float(InT(float(d[i]) / float(p.streams)));
  a[i] = InT(t / (1.0f + exp(-t)));
}

template <typename InT>
inline void hc_mix_impl(
    const device InT* up,
    const device InT* normed,
    device InT* x,
    constant HcMixParams& p,
    uint i) {
  if (i >= p.tokens * p.cols) {
    return;
  }
  const uint n = i / p.cols;
  const uint j = i % p.cols;
  float acc = 0.0f;
  for (uint s = 0; s < p.streams; ++s) {
    const ulong at = (ulong(n) * p.streams + s) * p.cols + j;
    acc += float(InT(float(InT(hc_sigmoid(float(up[at])))) * float(normed[at])));
  }
  x[i] = InT(acc / float(p.streams));
}

// hc_up_mix splits a simdgroup's lanes among the streams, as kernels/hyper_connection.cu does:
// G = the power of two >= min(S, 32) lane groups of L = 32 / G lanes, group g taking stream
// s = r * G + g in round r (one round at the release: S = 4, 4 groups of 8 lanes), so that the
// S dots of an output are summed side by side.
inline uint hc_up_mix_groups(uint streams) {
  uint g = 1;
  while (g < streams && g < 32) {
    g <<= 1;
  }
  return g;
}

// One packed word's s * sum(q a) + b * sum(a) added to acc (the CUDA kernel's per-word order).
template <uint BITS>
inline float hc_up_word(uint word, float scale, float bias, threadgroup float* act, uint j0,
                        float acc) {
  constexpr uint kPerWord = 32 / BITS;
  constexpr uint kMask = (1u << BITS) - 1u;
  float qa = 0.0f;
  float sa = 0.0f;
  for (uint k = 0; k < kPerWord; ++k) {
    const float av = act[j0 + k];
    qa = fma(float((word >> (k * BITS)) & kMask), av, qa);
    sa += av;
  }
  return fma(scale, qa, fma(bias, sa, acc));
}

// Lane q's share (words q, q + L, ...) of one up row's dot product with the activations.
template <uint BITS, typename ScT>
inline float hc_up_lane_dot(
    const device uint* row,
    const device ScT* row_scales,
    const device ScT* row_biases,
    threadgroup float* act,
    constant HcUpMixParams& p,
    uint q,
    uint lanes) {
  constexpr uint kPerWord = 32 / BITS;
  const uint words = p.rank / kPerWord;
  float acc = 0.0f;
  for (uint w = q; w < words; w += lanes) {
    const uint j0 = w * kPerWord;
    const uint g = j0 / p.group_size;
    acc = hc_up_word<BITS>(row[w], float(row_scales[g]), float(row_biases[g]), act, j0, acc);
  }
  return acc;
}

// Output x[n, j] of one simdgroup; every thread of the threadgroup first writes its share of
// token n's activations into `act` (R floats), so the whole threadgroup calls this.
template <typename InT, typename ScT>
inline void hc_up_mix_impl(
    const device uint* packed,
    const device ScT* scales,
    const device ScT* biases,
    const device InT* d,
    const device InT* normed,
    device InT* x,
    constant HcUpMixParams& p,
    uint n,
    uint j,
    uint tid,
    uint threads,
    uint lane,
    threadgroup float* act) {
  for (uint k = tid; k < p.rank; k += threads) {
    const float t = float(InT(float(d[ulong(n) * p.rank + k]) / float(p.streams)));
    act[k] = float(InT(t / (1.0f + exp(-t))));
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (j >= p.cols) {
    return;  // a whole simdgroup, after the barrier
  }
  const uint groups = hc_up_mix_groups(p.streams);
  const uint lanes = 32 / groups;
  const uint g = lane / lanes;
  const uint q = lane % lanes;
  const uint words = p.rank * p.bits / 32;
  const uint row_groups = p.rank / p.group_size;
  const uint rounds = (p.streams + groups - 1) / groups;
  float acc = 0.0f;
  for (uint r = 0; r < rounds; ++r) {
    const uint s = r * groups + g;
    float dot = 0.0f;
    float term = 0.0f;
    if (s < p.streams) {
      const ulong row = ulong(s) * p.cols + j;
      const device uint* row_words = packed + row * words;
      const device ScT* row_scales = scales + row * row_groups;
      const device ScT* row_biases = biases + row * row_groups;
      if (p.bits == 4) {
        dot = hc_up_lane_dot<4, ScT>(row_words, row_scales, row_biases, act, p, q, lanes);
      } else if (p.bits == 8) {
        dot = hc_up_lane_dot<8, ScT>(row_words, row_scales, row_biases, act, p, q, lanes);
      } else {
        dot = hc_up_lane_dot<2, ScT>(row_words, row_scales, row_biases, act, p, q, lanes);
      }
    }
    // The group's lanes summed (the xor stays inside a group of L lanes).
    for (uint o = lanes / 2; o > 0; o >>= 1) {
      dot += simd_shuffle_xor(dot, ushort(o));
    }
    if (s < p.streams) {
      const ulong at = (ulong(n) * p.streams + s) * p.cols + j;
      term = float(InT(float(InT(hc_sigmoid(float(InT(dot))))) * float(normed[at])));
    }
    // The streams' terms added in stream order, as hc_mix adds them.
    for (uint gg = 0; gg < groups; ++gg) {
      const float t = simd_shuffle(term, ushort(gg * lanes));
      if (r * groups + gg < p.streams) {
        acc += t;
      }
    }
  }
  if (lane == 0) {
    x[ulong(n) * p.cols + j] = InT(acc / float(p.streams));
  }
}

// Entry points hc_inject_norm_, hc_act_ and hc_mix_{f32,f16,bf16}: plain kernels
// forwarding to the templates (see kernels/affine.metal for why not explicit instantiations).
#define HC_INJECT_NORM(name, InT)                                                        \
  [[kernel]] void name(                                                                  \
      const device InT* hs [[buffer(0)]],       /* [N, S, H] */                          \
      const device InT* y [[buffer(1)]],        /* [N, H] or [N, K, H], if has_inject */ \
      const device InT* gate [[buffer(2)]],     /* [N, S], read if has_inject */         \
      const device float* weight [[buffer(3)]], /* [S, H], read if has_norm */           \
      const device float* slot_weights [[buffer(4)]], /* [N, K], read if slots = K > 0 */ \
      device InT* sum [[buffer(5)]],            /* [N, S, H], written if has_inject */   \
      device InT* normed [[buffer(6)]],         /* [N, S, H], written if has_norm */     \
      constant HcInjectNormParams& p [[buffer(7)]],                                      \
      threadgroup float* partial [[threadgroup(0)]],                                     \
      uint3 tg [[threadgroup_position_in_grid]],                                         \
      uint tid [[thread_index_in_threadgroup]],                                          \
      uint3 tpg [[threads_per_threadgroup]],                                             \
      uint lane [[thread_index_in_simdgroup]],                                           \
      uint simd [[simdgroup_index_in_threadgroup]]) {                                    \
    hc_inject_norm_impl<InT>(hs, y, gate, weight, slot_weights, sum, normed, p, tg.x, tid,  \
                             tpg.x, lane, simd, partial);                                \
  }

#define HC_ACT(name, InT)                                                                \
  [[kernel]] void name(                                                                  \
      const device InT* d [[buffer(0)]], /* [N, R] */                                    \
      device InT* a [[buffer(1)]],       /* [N, R] */                                    \
      constant HcActParams& p [[buffer(2)]],                                             \
      uint i [[thread_position_in_grid]]) {                                              \
    hc_act_impl<InT>(d, a, p, i);                                                        \
  }

#define HC_MIX(name, InT)                                                                \
  [[kernel]] void name(                                                                  \
      const device InT* up [[buffer(0)]],     /* [N, S, H] */                            \
      const device InT* normed [[buffer(1)]], /* [N, S, H] */                            \
      device InT* x [[buffer(2)]],            /* [N, H] */                               \
      constant HcMixParams& p [[buffer(3)]],                                             \
      uint i [[thread_position_in_grid]]) {                                              \
    hc_mix_impl<InT>(up, normed, x, p, i);                                               \
  }

// hc_up_mix_<InT>_<ScT>: the up matrix's scales and biases in ScT.
#define HC_UP_MIX(name, InT, ScT)                                                         \
  [[kernel]] void name(                                                                  \
      const device uint* packed [[buffer(0)]],  /* [S * H, R * bits / 32] */             \
      const device ScT* scales [[buffer(1)]],   /* [S * H, R / group_size] */            \
      const device ScT* biases [[buffer(2)]],   /* [S * H, R / group_size] */            \
      const device InT* d [[buffer(3)]],        /* [N, R] */                             \
      const device InT* normed [[buffer(4)]],   /* [N, S, H] */                          \
      device InT* x [[buffer(5)]],              /* [N, H] */                             \
      constant HcUpMixParams& p [[buffer(6)]],                                           \
      threadgroup float* act [[threadgroup(0)]],                                         \
      uint3 tg [[threadgroup_position_in_grid]],                                         \
      uint tid [[thread_index_in_threadgroup]],                                          \
      uint3 tpg [[threads_per_threadgroup]],                                             \
      uint lane [[thread_index_in_simdgroup]],                                           \
      uint simd [[simdgroup_index_in_threadgroup]]) {                                    \
    hc_up_mix_impl<InT, ScT>(packed, scales, biases, d, normed, x, p, tg.y,               \
                             tg.x * (tpg.x / 32) + simd, tid, tpg.x, lane, act);          \
  }

HC_INJECT_NORM(hc_inject_norm_f32, float)
HC_INJECT_NORM(hc_inject_norm_f16, half)
HC_ACT(hc_act_f32, float)
HC_ACT(hc_act_f16, half)
HC_MIX(hc_mix_f32, float)
HC_MIX(hc_mix_f16, half)
HC_UP_MIX(hc_up_mix_f32_f32, float, float)
HC_UP_MIX(hc_up_mix_f32_f16, float, half)
HC_UP_MIX(hc_up_mix_f16_f32, half, float)
HC_UP_MIX(hc_up_mix_f16_f16, half, half)
#if defined(__HAVE_BFLOAT__)
HC_UP_MIX(hc_up_mix_f32_bf16, float, bfloat)
HC_UP_MIX(hc_up_mix_f16_bf16, half, bfloat)
HC_UP_MIX(hc_up_mix_bf16_f32, bfloat, float)
HC_UP_MIX(hc_up_mix_bf16_f16, bfloat, half)
HC_UP_MIX(hc_up_mix_bf16_bf16, bfloat, bfloat)
HC_INJECT_NORM(hc_inject_norm_bf16, bfloat)
HC_ACT(hc_act_bf16, bfloat)
HC_MIX(hc_mix_bf16, bfloat)
#endif
