// Decode-step preparation of gated attention (crates/gdn-ops/src/ops/attn_prep: the spec;
// its cpu.rs is the twin this must match). Per sequence b, from its merged projection row
// qkv[b] = [q heads (query_h | gate_h, 2*Dh each) | k heads (Dh) | v heads (Dh)]:
//   query head h: q[b, h]  = rope(InT(rmsnorm(query_h) * q_norm)),  gate[b, h] = gate_h
//   kv head h:    keys[b, h, pos] = rope(InT(rmsnorm(k_h) * k_norm)), values[b, h, pos] = v_h
// rope rotates features i and i + R/2 (i < R/2) by f32(pos) * inv_freq[i] (the "rotate half"
// layout) and passes features R..Dh through; its result is rounded once to InT.
//
// Launch: threadgroups (Nq + 2*Nkv, B, 1), threads per threadgroup (32, 1, 1): one simdgroup
// per head task (query heads, then key heads, then value heads), lane l taking features
// l, l + 32, ... A rotated feature needs its partner's normed value: the lane recomputes it
// from the input (the same f32 expression, so the same rounded value) instead of
// exchanging registers, which works for any R.
//
// pos is read from a device buffer (buffer 4) so that a recorded launch replays unchanged
// for every token. Host obligations: grow the KV buffers before the call; when
// pos >= capacity no key or value is written (the kernel cannot report it), q and gate are.

#include <metal_stdlib>
using namespace metal;

#include "params/attn_prep.h"

// The RMS-normed feature j of a head, rounded to InT as the composed path stores it.
template <typename InT>
inline float attn_prep_normed(const device InT* x, const device InT* w, uint j, float inv) {
  return float(InT(float(x[j]) * inv * float(w[j])));
}

template <typename InT>
inline void attn_prep_impl(
    const device InT* qkv,
    const device InT* q_norm,
    const device InT* k_norm,
    const device float* inv_freq,
    const device uint* pos_buf,
    device InT* keys,
    device InT* values,
    device InT* q_out,
    device InT* gate_out,
    constant AttnPrepParams& p,
    uint task,
    uint b,
    uint lane) {
  const uint nq = p.q_heads, nkv = p.kv_heads, dh = p.head_dim;
  if (b >= p.batch || task >= nq + 2 * nkv) {
    return;
  }
  const uint pos = pos_buf[0];
  const device InT* row = qkv + ulong(b) * (2 * nq + 2 * nkv) * dh;

  if (task >= nq + nkv) {
    const uint h = task - nq - nkv;
    if (pos >= p.capacity) {
      return;
    }
    const device InT* v = row + ulong(2 * nq + nkv + h) * dh;
    device InT* dst = values + ((ulong(b) * nkv + h) * p.capacity + pos) * dh;
    for (uint j = lane; j < dh; j += 32) {
      dst[j] = v[j];
    }
    return;
  }

  const bool is_query = task < nq;
  const uint h = is_query ? task : task - nq;
  const device InT* x = is_query ? row + ulong(2 * h) * dh : row + ulong(2 * nq + h) * dh;
  const device InT* w = is_query ? q_norm : k_norm;
  device InT* dst;
  if (is_query) {
    dst = q_out + (ulong(b) * nq + h) * dh;
    device InT* gate = gate_out + (ulong(b) * nq + h) * dh;
    for (uint j = lane; j < dh; j += 32) {
      gate[j] = x[dh + j];
    }
  } else {
    // The whole simdgroup leaves together: no lane misses the simd_sum below.
    if (pos >= p.capacity) {
      return;
    }
    dst = keys + ((ulong(b) * nkv + h) * p.capacity + pos) * dh;
  }

  float squares = 0.0f;
  for (uint j = lane; j < dh; j += 32) {
    const float v = float(x[j]);
    squares += v * v;
  }
  const float inv = rsqrt(simd_sum(squares) / float(dh) + p.eps);
  const uint half_r = p.rope_dims / 2;
  const float fpos = float(pos);
  for (uint j = lane; j < dh; j += 32) {
    const float n = attn_prep_normed(x, w, j, inv);
    float out = n;
    if (j < p.rope_dims) {
      const bool first = j < half_r;
      const uint i = first ? j : j - half_r;
      const float partner = attn_prep_normed(x, w, first ? j + half_r : i, inv);
      // precise: angles reach thousands of radians at long positions.
      const float angle = fpos * inv_freq[i];
      const float c = precise::cos(angle), s = precise::sin(angle);
      out = first ? n * c - partner * s : n * c + partner * s;
    }
    dst[j] = InT(out);
  }
}

// Entry points attn_prep_{f32,f16,bf16}: plain kernels forwarding to the template (see
// kernels/affine.metal for why not explicit instantiations).
#define ATTN_PREP(name, InT)                                                          \
  [[kernel]] void name(                                                               \
      const device InT* qkv [[buffer(0)]],        /* [B, 2*Nq*Dh + 2*Nkv*Dh] */       \
      const device InT* q_norm [[buffer(1)]],     /* [Dh] */                          \
      const device InT* k_norm [[buffer(2)]],     /* [Dh] */                          \
      const device float* inv_freq [[buffer(3)]], /* [R/2] */                         \
      const device uint* pos [[buffer(4)]],       /* [1] */                           \
      device InT* keys [[buffer(5)]],             /* [B, Nkv, cap, Dh], in place */   \
      device InT* values [[buffer(6)]],           /* [B, Nkv, cap, Dh], in place */   \
      device InT* q [[buffer(7)]],                /* [B, Nq, Dh] */                   \
      device InT* gate [[buffer(8)]],             /* [B, Nq*Dh] */                    \
      constant AttnPrepParams& p [[buffer(9)]],                                       \
      uint3 tg [[threadgroup_position_in_grid]],                                      \
      uint lane [[thread_index_in_simdgroup]]) {                                      \
    attn_prep_impl<InT>(qkv, q_norm, k_norm, inv_freq, pos, keys, values, q, gate, p, \
                        tg.x, tg.y, lane);                                            \
  }

ATTN_PREP(attn_prep_f32, float)
ATTN_PREP(attn_prep_f16, half)
#if defined(__HAVE_BFLOAT__)
ATTN_PREP(attn_prep_bf16, bfloat)
#endif
