// One decode step of gated attention (crates/gdn-ops/src/ops/attn_decode: the spec; its
// cpu.rs is the twin this must match). For sequence b and query head h (KV head
// h / (Nq / Nkv)), over positions t = 0..=last, last = min(pos, cap - 1):
//   s_t = (q . k_t) * scale,  p = softmax(s),  o = sum_t p_t v_t          (f32)
//   out[b, h] = InT(float(InT(o)) * sigmoid(float(gate[b, h])))
//
// Launch: threadgroups (Nq, B, 1), threads per threadgroup (32, S, 1), threadgroup memory
// S * (2 + Dh) floats at index 0 (rounded up to 16 bytes). Simdgroup sg takes keys sg,
// sg + S, ...: its lanes split the head dim (lane l holds features l*Dh/32 .. (l+1)*Dh/32 of
// q and of its partial output, contiguous so a lane's loads of a key row are one vector), a
// score is one simd_sum, and the softmax runs online (running max m from -FLT_MAX, sum l,
// output o rescaled when the max grows). Each simdgroup leaves (m, l, o) in threadgroup
// memory; after one barrier simdgroup 0 merges them: M = max m_s, L = sum l_s e^(m_s - M),
// o = sum o_s e^(m_s - M) / L.
//
// Split-K (flash decoding), for long contexts: with P = params.splits > 1 the keys 0..=last
// are cut into P ranges of ceil((last + 1) / P) keys; attn_decode_split_* runs threadgroups
// (Nq, B, P), each merging its range as above into one (M, L, O) record of 2 + Dh floats in
// `partials` [B, Nq, P, 2 + Dh] (O unnormalized), and attn_decode_combine_* (threadgroups
// (Nq, B, 1) of 32 threads, lane l owning features l*Dh/32 ..) merges the P records the same
// way and applies the gate. A range past the last key leaves (-FLT_MAX, 0, 0), which weighs
// 0. P comes from the host (fixed per recorded launch), the ranges from pos on the device.
//
// pos is read from a device buffer: a recorded launch replays for every token.
// Host obligations: Dh a multiple of 32 up to 256, Nq a multiple of Nkv, S = params.simdgroups
// = threads per threadgroup / 32, threadgroup memory as above, pos < cap (the kernel clamps),
// params.splits = 1 for attn_decode_*, the grid's depth for attn_decode_split_*.

#include <metal_stdlib>
using namespace metal;

#include "params/attn_decode.h"

// kSplit: this threadgroup takes key range tg.z of p.splits and writes its record to
// `partials`; otherwise it takes every key and writes `out` (gate and out unused when split).
template <typename InT, bool kSplit>
inline void attn_decode_impl(
    const device InT* q,
    const device InT* gate,
    const device InT* keys,
    const device InT* values,
    const device uint* pos_buf,
    device InT* out,
    device float* partials,
    constant AttnDecodeParams& p,
    threadgroup float* scratch,
    uint3 tg,
    uint sg,
    uint lane) {
  constexpr uint kMaxPerLane = 8;  // Dh <= 256
  // Uniform over the threadgroup: every thread reaches the barrier below, or none does.
  const uint h = tg.x, b = tg.y;
  if (h >= p.q_heads || b >= p.batch) {
    return;
  }
  const uint dh = p.head_dim, per_lane = dh / 32, groups = p.simdgroups;
  const uint kvh = h / (p.q_heads / p.kv_heads);
  const uint last = min(pos_buf[0], p.capacity - 1);
  const ulong head_at = (ulong(b) * p.q_heads + h) * dh + lane * per_lane;
  const ulong kv_at = (ulong(b) * p.kv_heads + kvh) * p.capacity * dh + lane * per_lane;
  // This threadgroup's keys: begin..end (all of 0..=last without a split).
  const uint splits = kSplit ? p.splits : 1;
  const uint per_split = last / splits + 1;  // ceil((last + 1) / splits)
  const uint begin = kSplit ? min(tg.z * per_split, last + 1) : 0;
  const uint end = min(begin + per_split, last + 1);

  float qv[kMaxPerLane], o[kMaxPerLane];
  for (uint i = 0; i < kMaxPerLane; ++i) {
    qv[i] = i < per_lane ? float(q[head_at + i]) : 0.0f;
    o[i] = 0.0f;
  }
  // A finite floor, not -inf: Metal compiles with fast math by default, which assumes no
  // infinities. exp(floor - s) is 0 for any score, as exp(-inf) would be.
  float m = -FLT_MAX, l = 0.0f;
  // The simdgroup takes its keys kKeys at a time, so that their loads are in flight together
  // (one key at a time, each key's loads, sum and exponentials were one long chain); the
  // running max moves once per batch, within rounding of one key at a time.
  constexpr uint kKeys = 4;
  for (uint t0 = begin + sg; t0 < end; t0 += kKeys * groups) {
    float s[kKeys];
    for (uint u = 0; u < kKeys; ++u) {
      const uint t = min(t0 + u * groups, end - 1);
      const device InT* k = keys + kv_at + ulong(t) * dh;
      float dot = 0.0f;
      for (uint i = 0; i < kMaxPerLane; ++i) {
        if (i < per_lane) {
          dot += qv[i] * float(k[i]);
        }
      }
      s[u] = dot;
    }
    // Every lane holds the same scores, so the softmax state stays uniform in the simdgroup.
    float m_new = m;
    for (uint u = 0; u < kKeys; ++u) {
      s[u] = t0 + u * groups < end ? simd_sum(s[u]) * p.scale : -FLT_MAX;
      m_new = max(m_new, s[u]);
    }
    const float rescale = exp(m - m_new);  // 0 at the first batch (m = -FLT_MAX)
    l *= rescale;
    for (uint i = 0; i < kMaxPerLane; ++i) {
      o[i] *= rescale;
    }
    for (uint u = 0; u < kKeys; ++u) {
      const uint t = t0 + u * groups;
      if (t >= end) {
        break;  // uniform over the simdgroup
      }
      const float w = exp(s[u] - m_new);
      const device InT* v = values + kv_at + ulong(t) * dh;
      l += w;
      for (uint i = 0; i < kMaxPerLane; ++i) {
        if (i < per_lane) {
          o[i] += w * float(v[i]);
        }
      }
    }
    m = m_new;
  }

  // Layout: [S] running maxima, [S] sums, [S][Dh] partial outputs.
  threadgroup float* maxima = scratch;
  threadgroup float* sums = scratch + groups;
  threadgroup float* partial = scratch + 2 * groups;
  if (lane == 0) {
    maxima[sg] = m;
    sums[sg] = l;
  }
  for (uint i = 0; i < per_lane; ++i) {
    partial[sg * dh + lane * per_lane + i] = o[i];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg != 0) {
    return;
  }
  // Without a split key 0 always exists (last >= 0), so some simdgroup saw a key; one that
  // saw none (m = -FLT_MAX, l = 0, o = 0) weighs exp(-FLT_MAX - top) = 0. A split range may
  // be empty: then top = -FLT_MAX and the record is (-FLT_MAX, 0, 0).
  float top = -FLT_MAX;
  for (uint s = 0; s < groups; ++s) {
    top = max(top, maxima[s]);
  }
  float total = 0.0f;
  for (uint s = 0; s < groups; ++s) {
    total += sums[s] * exp(maxima[s] - top);
  }
  device float* record =
      kSplit ? partials + ((ulong(b) * p.q_heads + h) * splits + tg.z) * (2 + dh) : partials;
  if (kSplit && lane == 0) {
    record[0] = top;
    record[1] = total;
  }
  for (uint i = 0; i < per_lane; ++i) {
    const uint j = lane * per_lane + i;
    float acc = 0.0f;
    for (uint s = 0; s < groups; ++s) {
      acc += partial[s * dh + j] * exp(maxima[s] - top);
    }
    if (kSplit) {
      record[2 + j] = acc;
    } else {
      const float attended = float(InT(acc / total));
      const float g = float(gate[head_at + i]);
      out[head_at + i] = InT(attended * (1.0f / (1.0f + exp(-g))));
    }
  }
}

// The merge of a split's records (see the top): threadgroup (h, b), one simdgroup.
template <typename InT>
inline void attn_decode_combine_impl(
    const device float* partials,
    const device InT* gate,
    device InT* out,
    constant AttnDecodeParams& p,
    uint3 tg,
    uint lane) {
  const uint h = tg.x, b = tg.y;
  if (h >= p.q_heads || b >= p.batch) {
    return;
  }
  const uint dh = p.head_dim, per_lane = dh / 32, splits = p.splits, stride = 2 + dh;
  const device float* records = partials + (ulong(b) * p.q_heads + h) * splits * stride;
  const ulong head_at = (ulong(b) * p.q_heads + h) * dh + lane * per_lane;
  // Range 0 holds key 0, so top is a real score.
  float top = -FLT_MAX;
  for (uint s = 0; s < splits; ++s) {
    top = max(top, records[s * stride]);
  }
  float total = 0.0f;
  for (uint s = 0; s < splits; ++s) {
    total += records[s * stride + 1] * exp(records[s * stride] - top);
  }
  for (uint i = 0; i < per_lane; ++i) {
    const uint j = lane * per_lane + i;
    float acc = 0.0f;
    for (uint s = 0; s < splits; ++s) {
      acc += records[s * stride + 2 + j] * exp(records[s * stride] - top);
    }
    const float attended = float(InT(acc / total));
    const float g = float(gate[head_at + i]);
    out[head_at + i] = InT(attended * (1.0f / (1.0f + exp(-g))));
  }
}

// Entry points attn_decode_{f32,f16,bf16}, attn_decode_split_*, attn_decode_combine_*: plain
// kernels forwarding to the templates (see kernels/affine.metal for why not explicit
// instantiations).
#define ATTN_DECODE(name, InT)                                                      \
  [[kernel]] void name(                                                             \
      const device InT* q [[buffer(0)]],      /* [B, Nq, Dh] */                     \
      const device InT* gate [[buffer(1)]],   /* [B, Nq*Dh] */                      \
      const device InT* keys [[buffer(2)]],   /* [B, Nkv, cap, Dh] */               \
      const device InT* values [[buffer(3)]], /* [B, Nkv, cap, Dh] */               \
      const device uint* pos [[buffer(4)]],   /* [1] */                             \
      device InT* out [[buffer(5)]],          /* [B, 1, Nq*Dh] */                   \
      constant AttnDecodeParams& p [[buffer(6)]],                                   \
      threadgroup float* scratch [[threadgroup(0)]], /* S * (2 + Dh) */             \
      uint3 tg [[threadgroup_position_in_grid]],                                    \
      uint sg [[simdgroup_index_in_threadgroup]],                                   \
      uint lane [[thread_index_in_simdgroup]]) {                                    \
    attn_decode_impl<InT, false>(q, gate, keys, values, pos, out, nullptr, p, scratch, \
                                 tg, sg, lane);                                     \
  }

#define ATTN_DECODE_SPLIT(name, InT)                                                \
  [[kernel]] void name(                                                             \
      const device InT* q [[buffer(0)]],      /* [B, Nq, Dh] */                     \
      const device InT* keys [[buffer(1)]],   /* [B, Nkv, cap, Dh] */               \
      const device InT* values [[buffer(2)]], /* [B, Nkv, cap, Dh] */               \
      const device uint* pos [[buffer(3)]],   /* [1] */                             \
      device float* partials [[buffer(4)]],   /* [B, Nq, P, 2 + Dh] */              \
      constant AttnDecodeParams& p [[buffer(5)]],                                   \
      threadgroup float* scratch [[threadgroup(0)]], /* S * (2 + Dh) */             \
      uint3 tg [[threadgroup_position_in_grid]],                                    \
      uint sg [[simdgroup_index_in_threadgroup]],                                   \
      uint lane [[thread_index_in_simdgroup]]) {                                    \
    attn_decode_impl<InT, true>(q, nullptr, keys, values, pos, nullptr, partials, p,  \
                                scratch, tg, sg, lane);                             \
  }

#define ATTN_DECODE_COMBINE(name, InT)                                              \
  [[kernel]] void name(                                                             \
      const device float* partials [[buffer(0)]], /* [B, Nq, P, 2 + Dh] */          \
      const device InT* gate [[buffer(1)]],       /* [B, Nq*Dh] */                  \
      device InT* out [[buffer(2)]],              /* [B, 1, Nq*Dh] */               \
      constant AttnDecodeParams& p [[buffer(3)]],                                   \
      uint3 tg [[threadgroup_position_in_grid]],                                    \
      uint lane [[thread_index_in_simdgroup]]) {                                    \
    attn_decode_combine_impl<InT>(partials, gate, out, p, tg, lane);                \
  }

ATTN_DECODE(attn_decode_f32, float)
ATTN_DECODE(attn_decode_f16, half)
ATTN_DECODE_SPLIT(attn_decode_split_f32, float)
ATTN_DECODE_SPLIT(attn_decode_split_f16, half)
ATTN_DECODE_COMBINE(attn_decode_combine_f32, float)
ATTN_DECODE_COMBINE(attn_decode_combine_f16, half)
#if defined(__HAVE_BFLOAT__)
ATTN_DECODE(attn_decode_bf16, bfloat)
ATTN_DECODE_SPLIT(attn_decode_split_bf16, bfloat)
ATTN_DECODE_COMBINE(attn_decode_combine_bf16, bfloat)
#endif
