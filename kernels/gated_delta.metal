// Fused gated-delta recurrence (Gated DeltaNet linear attention) for Qwen3-Next / Qwen3.5.
//
// Per token, in mlx-lm's order (crates/gdn-ops/src/cpu.rs is the reference this must match):
//   S <- g*S;  kv = S.k;  delta = (v - kv)*beta;  S <- S + delta (x) k;  y = S.q
//
// Layout: one 32-lane simdgroup per state row S[b, hv, dv, :]. A row's update reads only that
// row (plus the shared k, q of the step), so rows never communicate and the whole time loop
// runs without threadgroup memory or barriers. Each lane keeps Dk/32 contiguous keys of its
// row in fp32 registers from the first step to the last: the state is read once and written
// once per call, whatever T is, so a bf16 state (StT = bfloat) is rounded once per call,
// never per step.
//
// Dispatch: threadgroups (1, ceil(Dv/4), B*Hv), threads per threadgroup (32, 4, 1).
// The host must reject Dk that is not a multiple of 32 or exceeds 256 (kMaxKeysPerLane * 32):
// the kernel has no way to report it. The bfloat entry points exist only where the compiler
// defines __HAVE_BFLOAT__ (MSL 3.1, macOS 14). Where mask[b, t] == 0
// (padding) the state is left untouched and y is 0; without a mask (has_mask == 0) buffer 7
// is never read, but still bind one there (any buffer) so validation layers stay quiet.

#include <metal_stdlib>
using namespace metal;

#include "params/gated_delta.h"

// The body of every instantiation below: one simdgroup's row.
template <typename InT, typename StT>
inline void gated_delta_step_impl(
    const device InT* q,
    const device InT* k,
    const device InT* v,
    const device float* g,
    const device float* beta,
    device StT* state,
    device InT* y,
    const device float* mask,
    constant GdnParams& p,
    uint3 pos,
    uint lane) {
  // A fixed, small register array: 8 covers Dk = 256. A per-thread array of 64 floats was
  // seen to miscompile to zeros (candle PR #3906), and a bound known at compile time lets
  // every loop below unroll so that s[] stays in registers.
  constexpr uint kMaxKeysPerLane = 8;

  // All 32 lanes of a simdgroup share pos.y, so padding rows of the last threadgroup leave
  // as a whole simdgroup and no simd_sum below ever runs with missing lanes.
  const uint dv = pos.y;
  if (dv >= p.value_dim) {
    return;
  }
  const uint n = pos.z;  // b * Hv + hv
  const uint b = n / p.value_heads;
  const uint hv = n % p.value_heads;
  // Consecutive value heads share a key head (HF repeat_interleave, mlx-lm's kernel).
  const uint hk = hv / (p.value_heads / p.key_heads);
  const uint per_lane = p.key_dim / 32;
  const uint key0 = lane * per_lane;

  device StT* s_row = state + (ulong(n) * p.value_dim + dv) * p.key_dim + key0;
  float s[kMaxKeysPerLane];
  for (uint i = 0; i < kMaxKeysPerLane; ++i) {
    s[i] = i < per_lane ? float(s_row[i]) : 0.0f;
  }

  for (uint t = 0; t < p.steps; ++t) {
    const ulong bt = ulong(b) * p.steps + t;
    const ulong gate_at = bt * p.value_heads + hv;
    const ulong y_at = gate_at * p.value_dim + dv;
    // The mask depends on (b, t) only, so the whole simdgroup takes the same branch.
    if (p.has_mask != 0 && mask[bt] == 0.0f) {
      if (lane == 0) {
        y[y_at] = InT(0.0f);
      }
      continue;
    }
    const ulong qk_at = (bt * p.key_heads + hk) * p.key_dim + key0;
    const float g_t = g[gate_at];

    // Decay first: the memory read must see the decayed state, as in the reference.
    // k is kept for the write below rather than loaded twice.
    float k_t[kMaxKeysPerLane];
    float kv_part = 0.0f;
    for (uint i = 0; i < kMaxKeysPerLane; ++i) {
      if (i < per_lane) {
        k_t[i] = float(k[qk_at + i]);
        s[i] *= g_t;
        kv_part += s[i] * k_t[i];
      }
    }
    const float kv = simd_sum(kv_part);
    const float delta = (float(v[y_at]) - kv) * beta[gate_at];

    // The output reads the state after this token's write.
    float out_part = 0.0f;
    for (uint i = 0; i < kMaxKeysPerLane; ++i) {
      if (i < per_lane) {
        s[i] += k_t[i] * delta;
        out_part += s[i] * float(q[qk_at + i]);
      }
    }
    const float out = simd_sum(out_part);
    if (lane == 0) {
      y[y_at] = static_cast<InT>(out);
    }
  }

  // The only rounding of the state in the call: StT, never InT.
  for (uint i = 0; i < kMaxKeysPerLane; ++i) {
    if (i < per_lane) {
      s_row[i] = static_cast<StT>(s[i]);
    }
  }
}

// The six entry points, named as the host looks them up: gated_delta_step_{InT}_{StT}.
// Plain kernels that forward to the template, rather than explicit instantiations carrying
// [[host_name]]: clang outside Metal rejects attributes on explicit instantiations, and this
// way the CPU emulation compiles exactly these tokens and calls each kernel by its host name.
#define GDN_KERNEL(name, InT, StT)                                            \
  [[kernel]] void name(                                                       \
      const device InT* q [[buffer(0)]],      /* [B, T, Hk, Dk] */            \
      const device InT* k [[buffer(1)]],      /* [B, T, Hk, Dk] */            \
      const device InT* v [[buffer(2)]],      /* [B, T, Hv, Dv] */            \
      const device float* g [[buffer(3)]],    /* [B, T, Hv], in (0, 1] */     \
      const device float* beta [[buffer(4)]], /* [B, T, Hv] */                \
      device StT* state [[buffer(5)]],        /* [B, Hv, Dv, Dk], in place */ \
      device InT* y [[buffer(6)]],            /* [B, T, Hv, Dv] */            \
      const device float* mask [[buffer(7)]], /* [B, T], read if has_mask */  \
      constant GdnParams& p [[buffer(8)]],                                    \
      uint3 pos [[thread_position_in_grid]],                                  \
      uint lane [[thread_index_in_simdgroup]]) {                              \
    gated_delta_step_impl<InT, StT>(q, k, v, g, beta, state, y, mask, p,      \
                                    pos, lane);                               \
  }

GDN_KERNEL(gated_delta_step_f32_f32, float, float)
GDN_KERNEL(gated_delta_step_f16_f32, half, float)

// bfloat exists from MSL 3.1 (macOS 14); the compiler then defines __HAVE_BFLOAT__, as
// candle's own shaders test. Without it the library still builds, minus these entry points.
#if defined(__HAVE_BFLOAT__)
GDN_KERNEL(gated_delta_step_f32_bf16, float, bfloat)
GDN_KERNEL(gated_delta_step_f16_bf16, half, bfloat)
GDN_KERNEL(gated_delta_step_bf16_f32, bfloat, float)
GDN_KERNEL(gated_delta_step_bf16_bf16, bfloat, bfloat)
#endif
