// The gated RMSNorm that closes a Gated DeltaNet layer, before its out projection, in one
// launch. crates/gdn-ops/src/ops/gated_rms_norm/cpu.rs is the twin this must match.
//
// Per row (b, t, hv) of Dv values, in f32 with two roundings to InT (as the composed path):
//   n   = InT(y * rsqrt(mean(y^2) + eps) * weight)
//   out = InT(silu(z) * n)
//
// Layout: one 32-lane simdgroup per row; lane l takes values l, l + 32, ... (consecutive
// lanes, consecutive addresses), so any Dv works. y is read twice (the mean square, then the
// output): the second pass hits the cache, and no per-lane array bounds Dv.
//
// Dispatch: threadgroups (1, ceil(rows / 4), 1), threads per threadgroup (32, 4, 1), rows =
// B * T * Hv >= 1. The host's obligations: y [B, T, Hv, Dv] and weight [Dv] contiguous; z may
// be a view whose tokens hold Hv * Dv contiguous values (z[b, t, hv, d] at b * z_batch_stride
// + t * z_token_stride + hv * Dv + d); out [B, T, Hv, Dv]. bfloat needs MSL 3.1 or later.

#include <metal_stdlib>
using namespace metal;

#include "params/gated_rms_norm.h"

template <typename InT>
inline void gated_rms_norm_impl(
    const device InT* y,
    const device InT* z,
    const device InT* weight,
    device InT* out,
    constant GatedRmsNormParams& p,
    uint3 pos,
    uint lane) {
  // All 32 lanes of a simdgroup share pos.y: padding rows leave as a whole simdgroup.
  const uint row = pos.y;
  if (row >= p.rows) {
    return;
  }
  const uint dim = p.value_dim;
  const uint hv = row % p.value_heads;
  const uint bt = row / p.value_heads;
  const uint t = bt % p.tokens;
  const uint b = bt / p.tokens;
  const device InT* y_row = y + ulong(row) * dim;
  const device InT* z_row =
      z + ulong(b) * p.z_batch_stride + ulong(t) * p.z_token_stride + ulong(hv) * dim;
  device InT* out_row = out + ulong(row) * dim;

  float square_sum = 0.0f;
  for (uint d = lane; d < dim; d += 32) {
    const float x = float(y_row[d]);
    square_sum += x * x;
  }
  const float inv_rms = rsqrt(simd_sum(square_sum) / float(dim) + p.eps);
  for (uint d = lane; d < dim; d += 32) {
    const float n = float(static_cast<InT>(float(y_row[d]) * inv_rms * float(weight[d])));
    const float gate = float(z_row[d]);
    out_row[d] = static_cast<InT>(gate / (1.0f + exp(-gate)) * n);
  }
}

// The entry points, named as the host looks them up: gated_rms_norm_{InT}.
#define GATED_RMS_NORM(name, InT)                                          \
  [[kernel]] void name(                                                    \
      const device InT* y [[buffer(0)]],       /* [B, T, Hv, Dv] */        \
      const device InT* z [[buffer(1)]],       /* tokens of Hv * Dv */     \
      const device InT* weight [[buffer(2)]],  /* [Dv] */                  \
      device InT* out [[buffer(3)]],           /* [B, T, Hv, Dv] */        \
      constant GatedRmsNormParams& p [[buffer(4)]],                        \
      uint3 pos [[thread_position_in_grid]],                               \
      uint lane [[thread_index_in_simdgroup]]) {                           \
    gated_rms_norm_impl<InT>(y, z, weight, out, p, pos, lane);             \
  }

GATED_RMS_NORM(gated_rms_norm_f32, float)
GATED_RMS_NORM(gated_rms_norm_f16, half)
#if defined(__HAVE_BFLOAT__)
GATED_RMS_NORM(gated_rms_norm_bf16, bfloat)
#endif
