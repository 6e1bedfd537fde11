// The front of a Gated DeltaNet layer in one launch, for a decode step (S = 1) or a whole
// prefill chunk (S tokens per sequence): the causal depthwise conv over [conv_state; qkv],
// SiLU, the L2 norms of q and k (attention scale folded in), the decay g and write strength
// beta of the recurrence, and the conv state after the chunk.
// crates/gdn-ops/src/ops/gdn_conv_prep/cpu.rs is the twin this must match.
//
// Per batch row b, token t and channel c of C = 2*Hk*Dk + Hv*Dv (all q channels, all k, all
// v), with padded = [conv_state[b]; qkv[b]] (K-1+S rows):
//   conv[c] = sum_m padded[t + m, c] * taps[m, c]       (m = 0..K-1, oldest row first)
//   act[c]  = InT(silu(conv[c]))                        (f32 arithmetic, one rounding)
//   q = InT(act * rsqrt(mean(act^2) + eps) * q_scale)   per key head (Dk channels), k likewise
//   v = act                                             per value head (Dv channels)
//   g[b, t, hv]    = exp(neg_a_exp[hv] * softplus(a[b, t, hv] + dt_bias[hv]))
//   beta[b, t, hv] = sigmoid(b[b, t, hv])
//   next_state[b] = padded[S .. S+K-1]                  (written by the last token's lanes)
// Every token's arithmetic is the decode step's, in the same order: a prompt prefilled in one
// chunk and decoded token by token gives the same outputs, bit for bit.
//
// Layout: one 32-lane simdgroup per (batch row, token, head slot); the 2*Hk + Hv slots are
// the q heads, the k heads, then the v heads. Lane l owns channels first + l + 32*i of its
// head (consecutive lanes, consecutive addresses). The norm of a q or k head is one simd_sum;
// the g and beta of value head hv are written by lane 0 of its slot.
//
// The conv state: next_state may be conv_state itself only for S = 1 (a decode step's shift
// in place: every element is read, then written, by one thread, and no other simdgroup
// touches it). For S > 1 the other tokens' simdgroups still read conv_state, so the host
// passes a separate next_state.
//
// Dispatch: threadgroups (S, ceil((2*Hk + Hv) / 4), B), threads per threadgroup (32, 4, 1).
// The host's obligations: Dk and Dv multiples of 32 up to 256 (kMaxPerLane * 32), 2 <= K <= 8,
// Hv a multiple of Hk; qkv, b and a may be views whose rows are contiguous (batch and token
// strides in the params); conv_state, next_state [B, K-1, C] and taps [K, C] contiguous;
// dt_bias and neg_a_exp f32 [Hv]. Outputs q, k [B, S, Hk, Dk] and v [B, S, Hv, Dv] in InT, g
// and beta [B, S, Hv] f32. bfloat needs MSL 3.1 or later.

#include <metal_stdlib>
using namespace metal;

#include "params/gdn_conv_prep.h"

// log(1 + u) for u in (0, 1], accurate where 1 + u rounds to 1 (MSL has no log1p). A
// compiler that simplifies (w - 1) to u under fast math gets log(1 + u): off only where u is
// below f32's resolution next to 1, where g rounds to the same value either way.
inline float gdn_log1p(float u) {
  const float w = 1.0f + u;
  return w == 1.0f ? u : log(w) * (u / (w - 1.0f));
}

template <typename InT>
inline void gdn_conv_prep_impl(
    const device InT* qkv,
    const device InT* b_in,
    const device InT* a_in,
    const device InT* conv_state,
    device InT* next_state,
    const device InT* taps,
    const device float* dt_bias,
    const device float* neg_a_exp,
    device InT* q,
    device InT* k,
    device InT* v,
    device float* g,
    device float* beta,
    constant ConvPrepParams& p,
    uint3 pos,
    uint lane) {
  // Channels per lane, fixed so that the activations stay in registers: 8 covers D = 256.
  constexpr uint kMaxPerLane = 8;
  // The window of one channel, likewise in registers: 8 taps at most.
  constexpr uint kMaxTaps = 8;

  // All 32 lanes of a simdgroup share pos.y, so padding slots of the last threadgroup leave
  // as a whole simdgroup and the simd_sum below never runs with missing lanes.
  const uint slot = pos.y;
  const uint key_heads = p.key_heads;
  if (slot >= 2 * key_heads + p.value_heads) {
    return;
  }
  const uint token = pos.x / 32;
  const uint batch = pos.z;
  const ulong row = ulong(batch) * p.tokens + token;  // the outputs' (batch, token) row
  const uint qk_channels = key_heads * p.key_dim;
  const uint channels = 2 * qk_channels + p.value_heads * p.value_dim;

  uint first;          // the head's first channel in qkv
  uint width;          // its channels
  device InT* out;     // its output row
  float scale = 1.0f;  // q_scale or k_scale
  const bool is_value = slot >= 2 * key_heads;
  if (slot < key_heads) {
    first = slot * p.key_dim;
    width = p.key_dim;
    out = q + (row * key_heads + slot) * p.key_dim;
    scale = p.q_scale;
  } else if (!is_value) {
    const uint h = slot - key_heads;
    first = qk_channels + h * p.key_dim;
    width = p.key_dim;
    out = k + (row * key_heads + h) * p.key_dim;
    scale = p.k_scale;
  } else {
    const uint hv = slot - 2 * key_heads;
    first = 2 * qk_channels + hv * p.value_dim;
    width = p.value_dim;
    out = v + (row * p.value_heads + hv) * p.value_dim;
  }
  const uint per_lane = width / 32;
  const uint history = p.kernel_size - 1;
  const device InT* rows = qkv + ulong(batch) * p.qkv_batch_stride;
  const device InT* state = conv_state + ulong(batch) * history * channels;
  device InT* next = next_state + ulong(batch) * history * channels;
  const bool last_token = token + 1 == p.tokens;

  float act[kMaxPerLane];
  float square_sum = 0.0f;
  for (uint i = 0; i < kMaxPerLane; ++i) {
    act[i] = 0.0f;
    if (i < per_lane) {
      const uint c = first + lane + 32 * i;
      // The window: rows token .. token + K - 1 of [conv_state; qkv], oldest first, all read
      // before the state is written (in place for a decode step).
      InT window[kMaxTaps];
      float acc = 0.0f;
      for (uint m = 0; m < kMaxTaps; ++m) {
        if (m < p.kernel_size) {
          const uint at = token + m;
          window[m] = at < history ? state[ulong(at) * channels + c]
                                   : rows[ulong(at - history) * p.qkv_token_stride + c];
          acc += float(window[m]) * float(taps[ulong(m) * channels + c]);
        }
      }
      if (last_token) {
        for (uint m = 1; m < kMaxTaps; ++m) {
          if (m < p.kernel_size) {
            next[ulong(m - 1) * channels + c] = window[m];
          }
        }
      }
      act[i] = float(static_cast<InT>(acc / (1.0f + exp(-acc))));
      square_sum += act[i] * act[i];
    }
  }

  if (is_value) {
    for (uint i = 0; i < kMaxPerLane; ++i) {
      if (i < per_lane) {
        out[lane + 32 * i] = static_cast<InT>(act[i]);
      }
    }
    if (lane == 0) {
      const uint hv = slot - 2 * key_heads;
      const ulong at = row * p.value_heads + hv;
      const float a_x =
          float(a_in[ulong(batch) * p.a_batch_stride + ulong(token) * p.a_token_stride + hv]) +
          dt_bias[hv];
      // softplus, stable for large |x|: max(x, 0) + log(1 + exp(-|x|)).
      const float softplus = (a_x > 0.0f ? a_x : 0.0f) + gdn_log1p(exp(-fabs(a_x)));
      g[at] = exp(neg_a_exp[hv] * softplus);
      const float b_x =
          float(b_in[ulong(batch) * p.b_batch_stride + ulong(token) * p.b_token_stride + hv]);
      beta[at] = 1.0f / (1.0f + exp(-b_x));
    }
    return;
  }
  // q or k: the whole simdgroup takes this branch (the slot is uniform).
  const float inv_rms = rsqrt(simd_sum(square_sum) / float(width) + p.norm_eps);
  for (uint i = 0; i < kMaxPerLane; ++i) {
    if (i < per_lane) {
      out[lane + 32 * i] = static_cast<InT>(act[i] * inv_rms * scale);
    }
  }
}

// The entry points, named as the host looks them up: gdn_conv_prep_{InT}. Plain kernels that
// forward to the template (clang outside Metal rejects [[host_name]] on explicit
// instantiations; the CPU emulation compiles exactly these tokens).
#define GDN_CONV_PREP(name, InT)                                                   \
  [[kernel]] void name(                                                            \
      const device InT* qkv [[buffer(0)]],          /* rows of C, two strides */   \
      const device InT* b_in [[buffer(1)]],         /* rows of Hv, two strides */  \
      const device InT* a_in [[buffer(2)]],         /* rows of Hv, two strides */  \
      const device InT* conv_state [[buffer(3)]],   /* [B, K-1, C] before */       \
      device InT* next_state [[buffer(4)]],         /* [B, K-1, C] after */        \
      const device InT* taps [[buffer(5)]],         /* [K, C] */                   \
      const device float* dt_bias [[buffer(6)]],    /* [Hv] */                     \
      const device float* neg_a_exp [[buffer(7)]],  /* [Hv], -exp(A_log) */        \
      device InT* q [[buffer(8)]],                  /* [B, S, Hk, Dk] */           \
      device InT* k [[buffer(9)]],                  /* [B, S, Hk, Dk] */           \
      device InT* v [[buffer(10)]],                 /* [B, S, Hv, Dv] */           \
      device float* g [[buffer(11)]],               /* [B, S, Hv] */               \
      device float* beta [[buffer(12)]],            /* [B, S, Hv] */               \
      constant ConvPrepParams& p [[buffer(13)]],                                   \
      uint3 pos [[thread_position_in_grid]],                                       \
      uint lane [[thread_index_in_simdgroup]]) {                                   \
    gdn_conv_prep_impl<InT>(qkv, b_in, a_in, conv_state, next_state, taps,         \
                            dt_bias, neg_a_exp, q, k, v, g, beta, p, pos, lane);   \
  }

GDN_CONV_PREP(gdn_conv_prep_f32, float)
GDN_CONV_PREP(gdn_conv_prep_f16, half)
#if defined(__HAVE_BFLOAT__)
GDN_CONV_PREP(gdn_conv_prep_bf16, bfloat)
#endif
