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
// pos is read from a device buffer (buffer 4): a recorded launch replays for every token.
// Host obligations: Dh a multiple of 32 up to 256, Nq a multiple of Nkv, S = params.simdgroups
// = threads per threadgroup / 32, threadgroup memory as above, pos < cap (the kernel clamps).

#include <metal_stdlib>
using namespace metal;

#include "params/attn_decode.h"

template <typename InT>
inline void attn_decode_impl(
    const device InT* q,
    const device InT* gate,
    const device InT* keys,
    const device InT* values,
    const device uint* pos_buf,
    device InT* out,
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

  float qv[kMaxPerLane], o[kMaxPerLane];
  for (uint i = 0; i < kMaxPerLane; ++i) {
    qv[i] = i < per_lane ? float(q[head_at + i]) : 0.0f;
    o[i] = 0.0f;
  }
  // A finite floor, not -inf: Metal compiles with fast math by default, which assumes no
  // infinities. exp(floor - s) is 0 for any score, as exp(-inf) would be.
  float m = -FLT_MAX, l = 0.0f;
  for (uint t = sg; t <= last; t += groups) {
    const device InT* k = keys + kv_at + ulong(t) * dh;
    const device InT* v = values + kv_at + ulong(t) * dh;
    float dot = 0.0f;
    for (uint i = 0; i < kMaxPerLane; ++i) {
      if (i < per_lane) {
        dot += qv[i] * float(k[i]);
      }
    }
    // Every lane holds the same score, so the softmax state stays uniform in the simdgroup.
    const float s = simd_sum(dot) * p.scale;
    const float m_new = max(m, s);
    const float rescale = exp(m - m_new);  // 0 at the first key (m = -FLT_MAX)
    const float w = exp(s - m_new);
    l = l * rescale + w;
    for (uint i = 0; i < kMaxPerLane; ++i) {
      if (i < per_lane) {
        o[i] = o[i] * rescale + w * float(v[i]);
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
  // Key 0 always exists (last >= 0), so some simdgroup saw a key; one that saw none
  // (m = -FLT_MAX, l = 0, o = 0) weighs exp(-FLT_MAX - top) = 0.
  float top = -FLT_MAX;
  for (uint s = 0; s < groups; ++s) {
    top = max(top, maxima[s]);
  }
  float total = 0.0f;
  for (uint s = 0; s < groups; ++s) {
    total += sums[s] * exp(maxima[s] - top);
  }
  for (uint i = 0; i < per_lane; ++i) {
    const uint j = lane * per_lane + i;
    float acc = 0.0f;
    for (uint s = 0; s < groups; ++s) {
      acc += partial[s * dh + j] * exp(maxima[s] - top);
    }
    const float attended = float(InT(acc / total));
    const float g = float(gate[head_at + i]);
    out[head_at + i] = InT(attended * (1.0f / (1.0f + exp(-g))));
  }
}

// Entry points attn_decode_{f32,f16,bf16}: plain kernels forwarding to the template (see
// kernels/affine.metal for why not explicit instantiations).
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
    attn_decode_impl<InT>(q, gate, keys, values, pos, out, p, scratch, tg, sg, lane); \
  }

ATTN_DECODE(attn_decode_f32, float)
ATTN_DECODE(attn_decode_f16, half)
#if defined(__HAVE_BFLOAT__)
ATTN_DECODE(attn_decode_bf16, bfloat)
#endif
