// Fused residual add + RMSNorm (crates/gdn-ops/src/ops/add_rms_norm: the spec; its cpu.rs is
// the twin this must match):
//   sum    = InT(float(residual) + float(delta))          (only when has_delta)
//   normed = InT(float(sum) * rsqrt(mean(float(sum)^2) + eps) * float(weight))
//
// Launch: threadgroups (N, 1, 1), threads per threadgroup (32, 1, 1): one simdgroup per row,
// lane l taking columns l, l + 32, ... (coalesced). The row's sum of squares is one
// simd_sum, so no threadgroup memory or barrier is needed. The second pass reads back the
// sum the same lane wrote (a thread sees its own device writes).
//
// Host obligations: H <= 8192 (any H >= 1 works; the bound keeps a row's two passes cheap);
// without a delta (has_delta == 0) buffers 1 and 3 are never touched, but bind any buffer
// there (the residual) so that validation layers stay quiet.

#include <metal_stdlib>
using namespace metal;

#include "params/add_rms_norm.h"

template <typename InT>
inline void add_rms_norm_impl(
    const device InT* residual,
    const device InT* delta,
    const device InT* weight,
    device InT* sum,
    device InT* normed,
    constant AddRmsNormParams& p,
    uint row,
    uint lane) {
  if (row >= p.rows) {
    return;
  }
  const ulong base = ulong(row) * p.cols;
  const bool add = p.has_delta != 0;
  float squares = 0.0f;
  for (uint j = lane; j < p.cols; j += 32) {
    float s = float(residual[base + j]);
    if (add) {
      // Rounded before it is squared: the norm sees the stored sum.
      const InT rounded = InT(s + float(delta[base + j]));
      sum[base + j] = rounded;
      s = float(rounded);
    }
    squares += s * s;
  }
  const float total = simd_sum(squares);
  const float inv = rsqrt(total / float(p.cols) + p.eps);
  const device InT* src = add ? (const device InT*)sum : residual;
  for (uint j = lane; j < p.cols; j += 32) {
    normed[base + j] = InT(float(src[base + j]) * inv * float(weight[j]));
  }
}

// Entry points add_rms_norm_{f32,f16,bf16}: plain kernels forwarding to the template (see
// kernels/affine.metal for why not explicit instantiations).
#define ADD_RMS_NORM(name, InT)                                                    \
  [[kernel]] void name(                                                            \
      const device InT* residual [[buffer(0)]], /* [N, H] */                       \
      const device InT* delta [[buffer(1)]],    /* [N, H], read if has_delta */    \
      const device InT* weight [[buffer(2)]],   /* [H] */                          \
      device InT* sum [[buffer(3)]],            /* [N, H], written if has_delta */ \
      device InT* normed [[buffer(4)]],         /* [N, H] */                       \
      constant AddRmsNormParams& p [[buffer(5)]],                                  \
      uint3 tg [[threadgroup_position_in_grid]],                                   \
      uint lane [[thread_index_in_simdgroup]]) {                                   \
    add_rms_norm_impl<InT>(residual, delta, weight, sum, normed, p, tg.x, lane);   \
  }

ADD_RMS_NORM(add_rms_norm_f32, float)
ADD_RMS_NORM(add_rms_norm_f16, half)
#if defined(__HAVE_BFLOAT__)
ADD_RMS_NORM(add_rms_norm_bf16, bfloat)
#endif
