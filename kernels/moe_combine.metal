// MoE combine: the routing-weighted sum of the expert outputs of one token (the shared expert
// being one more slot), the residual add, and the RMSNorm that follows it, in one pass.
// crates/gdn-ops/src/ops/moe_combine/cpu.rs is the reference.
//
// Per token n and column j (f32 arithmetic; InT is the activation dtype):
//   acc    = sum_s weights[n, s] * f32(down[n, s, j])   (slots in order)
//   sum    = InT(f32(residual[n, j]) + f32(InT(acc)))
//   normed = InT(f32(sum) * rsqrt(mean_j(f32(sum)^2) + eps) * f32(norm_weight[j]))   (has_norm)
//
// Launch geometry (ops/moe_combine/metal.rs; kernels/emu/moe_combine_harness.cpp emulates
// it): threadgroups (N, 1, 1), threads per threadgroup (32, 1, 1): one simdgroup per token
// row; lane l takes columns l, l + 32, ... (consecutive lanes, consecutive addresses). The
// second pass reads back the sum row the same lane wrote, so no barrier is needed.
//
// Without a norm (has_norm == 0) buffers 3 and 5 are never touched, but bind one there (any
// buffer) so validation layers stay quiet. bfloat needs MSL 3.1.

#include <metal_stdlib>
using namespace metal;

#include "params/moe_combine.h"

template <typename InT>
inline void moe_combine_impl(
    const device InT* down,
    const device float* weights,
    const device InT* residual,
    const device InT* norm_weight,
    device InT* sum,
    device InT* normed,
    constant MoeCombineParams& p,
    uint token,
    uint lane) {
  // The whole simdgroup leaves together: the simd_sum below has all 32 lanes.
  if (token >= p.tokens) {
    return;
  }
  const uint H = p.hidden;
  const uint S = p.slots;
  const device InT* d = down + ulong(token) * S * H;
  const device float* w = weights + ulong(token) * S;
  const ulong row = ulong(token) * H;

  float squares = 0.0f;
  for (uint j = lane; j < H; j += 32) {
    float acc = 0.0f;
    for (uint s = 0; s < S; ++s) {
      acc += w[s] * float(d[ulong(s) * H + j]);
    }
    const InT total = static_cast<InT>(float(residual[row + j]) + float(static_cast<InT>(acc)));
    sum[row + j] = total;
    squares += float(total) * float(total);
  }
  // Uniform over the simdgroup: every lane takes the same branch.
  if (p.has_norm == 0) {
    return;
  }
  const float inv_rms = rsqrt(simd_sum(squares) / float(H) + p.eps);
  for (uint j = lane; j < H; j += 32) {
    normed[row + j] = static_cast<InT>(float(sum[row + j]) * inv_rms * float(norm_weight[j]));
  }
}

// Plain kernels forwarding to the template (see kernels/affine.metal for why), named
// moe_combine_{InT} as the host looks them up.
#define MOE_COMBINE(name, InT)                                                    \
  [[kernel]] void name(                                                           \
      const device InT* down [[buffer(0)]],         /* [N, S, H] */               \
      const device float* weights [[buffer(1)]],    /* [N, S] */                  \
      const device InT* residual [[buffer(2)]],     /* [N, H] */                  \
      const device InT* norm_weight [[buffer(3)]],  /* [H], read if has_norm */   \
      device InT* sum [[buffer(4)]],                /* [N, H] */                  \
      device InT* normed [[buffer(5)]],             /* [N, H], if has_norm */     \
      constant MoeCombineParams& p [[buffer(6)]],                                 \
      uint3 tg [[threadgroup_position_in_grid]],                                  \
      uint lane [[thread_index_in_simdgroup]]) {                                  \
    moe_combine_impl<InT>(down, weights, residual, norm_weight, sum, normed, p,   \
                          tg.x, lane);                                            \
  }

MOE_COMBINE(moe_combine_f32, float)
MOE_COMBINE(moe_combine_f16, half)
#if defined(__HAVE_BFLOAT__)
MOE_COMBINE(moe_combine_bf16, bfloat)
#endif
