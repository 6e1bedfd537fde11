// The gated-delta recurrence of kernels/gated_delta.metal with the gated RMSNorm of
// kernels/gated_rms_norm.metal folded into its output: one launch instead of two per GDN
// layer. crates/gdn-ops/src/ops/gated_delta_norm/cpu.rs is the twin (the recurrence's CPU
// reference, then the gated norm's).
//
// Per token, per state row S[b, hv, dv, :] (mlx-lm's order, as gated_delta.metal):
//   S <- g*S;  kv = S.k;  delta = (v - kv)*beta;  S <- S + delta (x) k;  y[dv] = InT(S.q)
// then over the Dv outputs of (b, t, hv):
//   n = InT(y * rsqrt(mean(y^2) + eps) * weight);  out = InT(gate(z) * n), the gate silu, or
//   sigmoid where p.sigmoid_gate is set (qwen4_exp's output_gate_type)
// y is rounded to InT before the norm, exactly as the unfused path stores it in between.
//
// Layout: one threadgroup per (b, hv), S simdgroups; simdgroup s owns the state rows
// dv = s, s + S, s + 2S, ... (at most kMaxRowsPerSimdgroup), each lane Dk/32 keys of each,
// in f32 registers for the whole call: the state is read once and written once, so a bf16
// state (StT = bfloat) is rounded once per call, never per step, and never to InT. Per
// token every simdgroup sums the squares of its rows' y (after simd_sum all lanes hold
// them), lane 0 stores that in threadgroup memory, one threadgroup_barrier, and every
// thread adds the S partial sums. The partial sums alternate between two halves of the
// threadgroup memory by token parity, so a token's writes never race the previous token's
// reads and one barrier per token suffices.
//
// Dispatch: threadgroups (B*Hv, 1, 1), threads per threadgroup (32, S, 1) with
// ceil(Dv / S) <= 8, threadgroup memory at index 0: 2*S floats (rounded up to 16 bytes).
// The host's obligations: Dk a multiple of 32 up to 256; q, k [B, T, Hk, Dk], v [B, T, Hv, Dv],
// g, beta [B, T, Hv] (f32), state [B, Hv, Dv, Dk], weight [Dv] contiguous; z may be a view
// whose tokens hold Hv*Dv contiguous values (z[b, t, hv, d] at b*z_batch_stride +
// t*z_token_stride + hv*Dv + d); out [B, T, Hv, Dv]. bfloat needs MSL 3.1 or later.

#include <metal_stdlib>
using namespace metal;

#include "params/gated_delta_norm.h"

// kWindow (the gated_delta_norm_window_* entries, a verify window of T tokens): the state is
// rounded to StT after every token, as T one-token launches store and reload it, and the state
// after token t < T - 1 is also written to after [T - 1, B, Hv, Dv, Dk] (the window's rollback
// points): bit for bit T one-token launches, in one launch and with no state copies.
template <typename InT, typename StT, bool kWindow = false>
inline void gated_delta_norm_impl(
    const device InT* q,
    const device InT* k,
    const device InT* v,
    const device float* g,
    const device float* beta,
    device StT* state,
    const device InT* z,
    const device InT* weight,
    device InT* out,
    threadgroup float* partial,
    constant GdnNormParams& p,
    uint n,
    uint simdgroup,
    uint simdgroups,
    uint lane,
    device StT* after = nullptr) {
  // Fixed register arrays (see gated_delta.metal): 8 keys per lane cover Dk = 256, 8 rows
  // per simdgroup cover Dv = 8 * S.
  constexpr uint kMaxKeysPerLane = 8;
  constexpr uint kMaxRowsPerSimdgroup = 8;

  const uint b = n / p.value_heads;
  const uint hv = n % p.value_heads;
  const uint hk = hv / (p.value_heads / p.key_heads);
  const uint per_lane = p.key_dim / 32;
  const uint key0 = lane * per_lane;
  const uint dim = p.value_dim;

  // Row r of this simdgroup is dv = simdgroup + r * simdgroups: uniform over its lanes.
  float s[kMaxRowsPerSimdgroup][kMaxKeysPerLane];
  for (uint r = 0; r < kMaxRowsPerSimdgroup; ++r) {
    const uint dv = simdgroup + r * simdgroups;
    device StT* s_row = state + (ulong(n) * dim + dv) * p.key_dim + key0;
    for (uint i = 0; i < kMaxKeysPerLane; ++i) {
      s[r][i] = (dv < dim && i < per_lane) ? float(s_row[i]) : 0.0f;
    }
  }

  for (uint t = 0; t < p.steps; ++t) {
    const ulong bt = ulong(b) * p.steps + t;
    const ulong gate_at = bt * p.value_heads + hv;
    const ulong qk_at = (bt * p.key_heads + hk) * p.key_dim + key0;
    const float g_t = g[gate_at];
    const float beta_t = beta[gate_at];
    float k_t[kMaxKeysPerLane];
    float q_t[kMaxKeysPerLane];
    for (uint i = 0; i < kMaxKeysPerLane; ++i) {
      k_t[i] = i < per_lane ? float(k[qk_at + i]) : 0.0f;
      q_t[i] = i < per_lane ? float(q[qk_at + i]) : 0.0f;
    }

    // The recurrence, row by row; y of each row rounded to InT as the unfused output.
    float y[kMaxRowsPerSimdgroup];
    float square_sum = 0.0f;
    for (uint r = 0; r < kMaxRowsPerSimdgroup; ++r) {
      y[r] = 0.0f;
      const uint dv = simdgroup + r * simdgroups;
      if (dv < dim) {
        float kv_part = 0.0f;
        for (uint i = 0; i < kMaxKeysPerLane; ++i) {
          if (i < per_lane) {
            s[r][i] *= g_t;
            kv_part += s[r][i] * k_t[i];
          }
        }
        const float kv = simd_sum(kv_part);
        const float delta = (float(v[gate_at * dim + dv]) - kv) * beta_t;
        float out_part = 0.0f;
        for (uint i = 0; i < kMaxKeysPerLane; ++i) {
          if (i < per_lane) {
            s[r][i] += k_t[i] * delta;
            out_part += s[r][i] * q_t[i];
          }
        }
        y[r] = float(static_cast<InT>(simd_sum(out_part)));
        square_sum += y[r] * y[r];
      }
    }

    // The mean square over all Dv rows: one partial sum per simdgroup.
    threadgroup float* sums = partial + (t & 1) * simdgroups;
    if (lane == 0) {
      sums[simdgroup] = square_sum;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint j = 0; j < simdgroups; ++j) {
      total += sums[j];
    }
    const float inv_rms = rsqrt(total / float(dim) + p.eps);

    const device InT* z_tok =
        z + ulong(b) * p.z_batch_stride + ulong(t) * p.z_token_stride + ulong(hv) * dim;
    device InT* out_tok = out + gate_at * dim;
    for (uint r = 0; r < kMaxRowsPerSimdgroup; ++r) {
      const uint dv = simdgroup + r * simdgroups;
      if (dv < dim && lane == 0) {
        const float normed = float(static_cast<InT>(y[r] * inv_rms * float(weight[dv])));
        // silu(z) = z * sigmoid(z): the numerator picks the gate (p.sigmoid_gate: qwen4_exp).
        const float gate = float(z_tok[dv]);
        const float numerator = p.sigmoid_gate ? 1.0f : gate;
        out_tok[dv] = static_cast<InT>(numerator / (1.0f + exp(-gate)) * normed);
      }
    }
    if (kWindow) {
      device StT* after_head = after + (ulong(t) * p.batch * p.value_heads + n) * dim * p.key_dim;
      for (uint r = 0; r < kMaxRowsPerSimdgroup; ++r) {
        const uint dv = simdgroup + r * simdgroups;
        device StT* a_row = after_head + ulong(dv) * p.key_dim + key0;
        for (uint i = 0; i < kMaxKeysPerLane; ++i) {
          const StT rounded = static_cast<StT>(s[r][i]);
          s[r][i] = float(rounded);
          if (dv < dim && i < per_lane && t + 1 < p.steps) {
            a_row[i] = rounded;
          }
        }
      }
    }
  }

  // The only rounding of the state in the call: StT, never InT.
  for (uint r = 0; r < kMaxRowsPerSimdgroup; ++r) {
    const uint dv = simdgroup + r * simdgroups;
    device StT* s_row = state + (ulong(n) * dim + dv) * p.key_dim + key0;
    for (uint i = 0; i < kMaxKeysPerLane; ++i) {
      if (dv < dim && i < per_lane) {
        s_row[i] = static_cast<StT>(s[r][i]);
      }
    }
  }
}

// The entry points, named as the host looks them up: gated_delta_norm_{InT}_{StT}.
#define GDN_NORM_KERNEL(name, InT, StT)                                          \
  [[kernel]] void name(                                                          \
      const device InT* q [[buffer(0)]],       /* [B, T, Hk, Dk] */              \
      const device InT* k [[buffer(1)]],       /* [B, T, Hk, Dk] */              \
      const device InT* v [[buffer(2)]],       /* [B, T, Hv, Dv] */              \
      const device float* g [[buffer(3)]],     /* [B, T, Hv] */                  \
      const device float* beta [[buffer(4)]],  /* [B, T, Hv] */                  \
      device StT* state [[buffer(5)]],         /* [B, Hv, Dv, Dk], in place */   \
      const device InT* z [[buffer(6)]],       /* tokens of Hv * Dv */           \
      const device InT* weight [[buffer(7)]],  /* [Dv] */                        \
      device InT* out [[buffer(8)]],           /* [B, T, Hv, Dv] */              \
      constant GdnNormParams& p [[buffer(9)]],                                   \
      threadgroup float* partial [[threadgroup(0)]], /* 2 * S floats */          \
      uint3 tg [[threadgroup_position_in_grid]],                                 \
      uint3 threads [[threads_per_threadgroup]],                                 \
      uint simdgroup [[simdgroup_index_in_threadgroup]],                         \
      uint lane [[thread_index_in_simdgroup]]) {                                 \
    gated_delta_norm_impl<InT, StT>(q, k, v, g, beta, state, z, weight, out,     \
                                    partial, p, tg.x, simdgroup, threads.y,      \
                                    lane);                                       \
  }

// The window entries: gated_delta_norm_window_{InT}_{StT}, `after` at buffer 9 (the
// parameters after the buffers, at 10).
#define GDN_NORM_WINDOW_KERNEL(name, InT, StT)                                   \
  [[kernel]] void name(                                                          \
      const device InT* q [[buffer(0)]],       /* [B, T, Hk, Dk] */              \
      const device InT* k [[buffer(1)]],       /* [B, T, Hk, Dk] */              \
      const device InT* v [[buffer(2)]],       /* [B, T, Hv, Dv] */              \
      const device float* g [[buffer(3)]],     /* [B, T, Hv] */                  \
      const device float* beta [[buffer(4)]],  /* [B, T, Hv] */                  \
      device StT* state [[buffer(5)]],         /* [B, Hv, Dv, Dk], in place */   \
      const device InT* z [[buffer(6)]],       /* tokens of Hv * Dv */           \
      const device InT* weight [[buffer(7)]],  /* [Dv] */                        \
      device InT* out [[buffer(8)]],           /* [B, T, Hv, Dv] */              \
      device StT* after [[buffer(9)]],         /* [T - 1, B, Hv, Dv, Dk] */      \
      constant GdnNormParams& p [[buffer(10)]],                                  \
      threadgroup float* partial [[threadgroup(0)]], /* 2 * S floats */          \
      uint3 tg [[threadgroup_position_in_grid]],                                 \
      uint3 threads [[threads_per_threadgroup]],                                 \
      uint simdgroup [[simdgroup_index_in_threadgroup]],                         \
      uint lane [[thread_index_in_simdgroup]]) {                                 \
    gated_delta_norm_impl<InT, StT, true>(q, k, v, g, beta, state, z, weight,    \
                                          out, partial, p, tg.x, simdgroup,      \
                                          threads.y, lane, after);               \
  }

GDN_NORM_KERNEL(gated_delta_norm_f32_f32, float, float)
GDN_NORM_KERNEL(gated_delta_norm_f16_f32, half, float)
#if defined(__HAVE_BFLOAT__)
GDN_NORM_KERNEL(gated_delta_norm_f32_bf16, float, bfloat)
GDN_NORM_KERNEL(gated_delta_norm_f16_bf16, half, bfloat)
GDN_NORM_KERNEL(gated_delta_norm_bf16_f32, bfloat, float)
GDN_NORM_KERNEL(gated_delta_norm_bf16_bf16, bfloat, bfloat)
#endif

GDN_NORM_WINDOW_KERNEL(gated_delta_norm_window_f32_f32, float, float)
GDN_NORM_WINDOW_KERNEL(gated_delta_norm_window_f16_f32, half, float)
#if defined(__HAVE_BFLOAT__)
GDN_NORM_WINDOW_KERNEL(gated_delta_norm_window_f32_bf16, float, bfloat)
GDN_NORM_WINDOW_KERNEL(gated_delta_norm_window_f16_bf16, half, bfloat)
GDN_NORM_WINDOW_KERNEL(gated_delta_norm_window_bf16_f32, bfloat, float)
GDN_NORM_WINDOW_KERNEL(gated_delta_norm_window_bf16_bf16, bfloat, bfloat)
#endif
