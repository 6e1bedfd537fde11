// The gated-delta recurrence with the gated RMSNorm folded into its output, on CUDA: the twin
// of kernels/gated_delta_norm.metal (which documents the maths and the layout), with
// crates/gdn-ops/src/ops/gated_delta_norm/cpu.rs as the reference both must match.
//
// ENTRY POINTS (extern "C"; <in> in {f32, f16, bf16}, <st> in {f32, bf16}):
//   gated_delta_norm_<in>_<st>(q, k, v, g, beta, state, z, weight, out, GdnNormParams p)
//     q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] and weight [Dv] in InT; g, beta [B, T, Hv] f32;
//     state [B, Hv, Dv, Dk] in StT, advanced in place and rounded once per call; z at
//     b * z_batch_stride + t * z_token_stride + hv * Dv + d (a view is fine); out
//     [B, T, Hv, Dv] in InT.
//     block = (32, S) with ceil(Dv / S) <= 8 and S <= 32: warp s owns the state rows
//     s, s + S, ...; grid = B * Hv. Dk a multiple of 32 up to 256 (the host checks). The
//     keys per lane and the rows per warp (4 or 8) are compile-time, so that the state
//     stays in registers: 16 floats a lane at Qwen3-Next's shapes with 32 warps.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/gated_delta_norm.cu

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/gated_delta_norm.h"
#include "cuda_convert.h"

namespace gated_delta_norm {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

constexpr unsigned int kMaxWarps = 32;

// PER = Dk / 32 keys per lane and ROWS (4 or 8) rows per warp at most, known at compile time
// so that the state stays in registers: ROWS * PER floats per lane (16 at Qwen3-Next's
// Dk = 128 with 32 warps of 4 rows).
template <typename InT, typename StT, unsigned int PER, unsigned int ROWS>
__device__ __forceinline__ void step(const InT* __restrict__ q, const InT* __restrict__ k,
                     const InT* __restrict__ v, const float* __restrict__ g,
                     const float* __restrict__ beta, StT* __restrict__ state,
                     const InT* __restrict__ z, const InT* __restrict__ weight,
                     InT* __restrict__ out, const GdnNormParams p) {
  // Two halves of one partial sum per warp, alternating by token parity: one barrier a token.
  __shared__ float partial[2 * kMaxWarps];
  const unsigned int n = blockIdx.x;
  const unsigned int warp = threadIdx.y;
  const unsigned int warps = blockDim.y;
  const unsigned int lane = threadIdx.x;
  const unsigned int b = n / p.value_heads;
  const unsigned int hv = n % p.value_heads;
  const unsigned int hk = hv / (p.value_heads / p.key_heads);
  const unsigned int key0 = lane * PER;
  const unsigned int dim = p.value_dim;

  float s[ROWS][PER];
#pragma unroll
  for (unsigned int r = 0; r < ROWS; ++r) {
    const unsigned int dv = warp + r * warps;
    const StT* s_row = state + ((size_t)n * dim + dv) * p.key_dim + key0;
#pragma unroll
    for (unsigned int i = 0; i < PER; ++i) {
      s[r][i] = dv < dim ? to_f32(s_row[i]) : 0.0f;
    }
  }

  for (unsigned int t = 0; t < p.steps; ++t) {
    const size_t bt = (size_t)b * p.steps + t;
    const size_t gate_at = bt * p.value_heads + hv;
    const size_t qk_at = (bt * p.key_heads + hk) * p.key_dim + key0;
    const float g_t = g[gate_at];
    const float beta_t = beta[gate_at];
    float k_t[PER], q_t[PER];
#pragma unroll
    for (unsigned int i = 0; i < PER; ++i) {
      k_t[i] = to_f32(k[qk_at + i]);
      q_t[i] = to_f32(q[qk_at + i]);
    }
    // The output gate and the norm's weight, loaded with the token's other inputs rather than
    // after the barrier (one DRAM round trip less on the critical path).
    const InT* z_tok = z + (size_t)b * p.z_batch_stride + (size_t)t * p.z_token_stride + (size_t)hv * dim;
    float z_r[ROWS], w_r[ROWS];
#pragma unroll
    for (unsigned int r = 0; r < ROWS; ++r) {
      const unsigned int dv = warp + r * warps;
      const bool mine = dv < dim && lane == 0;
      z_r[r] = mine ? to_f32(z_tok[dv]) : 0.0f;
      w_r[r] = mine ? to_f32(weight[dv]) : 0.0f;
    }

    float y[ROWS];
    float square_sum = 0.0f;
#pragma unroll
    for (unsigned int r = 0; r < ROWS; ++r) {
      y[r] = 0.0f;
      const unsigned int dv = warp + r * warps;
      if (dv < dim) {  // uniform over the warp
        float kv = 0.0f;
#pragma unroll
        for (unsigned int i = 0; i < PER; ++i) {
          {
            s[r][i] *= g_t;
            kv = fmaf(s[r][i], k_t[i], kv);
          }
        }
        kv = warp_sum(kv);
        const float delta = (to_f32(v[gate_at * dim + dv]) - kv) * beta_t;
        float o = 0.0f;
#pragma unroll
        for (unsigned int i = 0; i < PER; ++i) {
          {
            s[r][i] = fmaf(k_t[i], delta, s[r][i]);
            o = fmaf(s[r][i], q_t[i], o);
          }
        }
        y[r] = to_f32(from_f32<InT>(warp_sum(o)));
        square_sum = fmaf(y[r], y[r], square_sum);
      }
    }

    float* sums = partial + (t & 1) * warps;
    if (lane == 0) sums[warp] = square_sum;
    __syncthreads();
    float total = 0.0f;
    for (unsigned int j = 0; j < warps; ++j) total += sums[j];
    const float inv_rms = rsqrtf(total / (float)dim + p.eps);

    InT* out_tok = out + gate_at * dim;
#pragma unroll
    for (unsigned int r = 0; r < ROWS; ++r) {
      const unsigned int dv = warp + r * warps;
      if (dv < dim && lane == 0) {
        const float normed = to_f32(from_f32<InT>(y[r] * inv_rms * w_r[r]));
        const float gate = z_r[r];
        out_tok[dv] = from_f32<InT>(gate / (1.0f + expf(-gate)) * normed);
      }
    }
  }

  // The only rounding of the state in the call: StT, never InT.
#pragma unroll
  for (unsigned int r = 0; r < ROWS; ++r) {
    const unsigned int dv = warp + r * warps;
    StT* s_row = state + ((size_t)n * dim + dv) * p.key_dim + key0;
#pragma unroll
    for (unsigned int i = 0; i < PER; ++i) {
      if (dv < dim) s_row[i] = from_f32<StT>(s[r][i]);
    }
  }
}

// Dispatches on Dk (PER) and on the rows per warp (at most 4, else 8); the host rejects other
// key dims and more than 8 rows per warp.
template <typename InT, typename StT>
__device__ __forceinline__ void entry(const InT* q, const InT* k, const InT* v, const float* g,
                                      const float* beta, StT* state, const InT* z,
                                      const InT* weight, InT* out, const GdnNormParams& p) {
  const bool four = p.value_dim <= 4 * blockDim.y;
  switch (p.key_dim) {
#define GDN_NORM_CASE(DK)                                                                   \
  case DK:                                                                                  \
    if (four) {                                                                             \
      step<InT, StT, DK / 32, 4>(q, k, v, g, beta, state, z, weight, out, p);               \
    } else {                                                                                \
      step<InT, StT, DK / 32, 8>(q, k, v, g, beta, state, z, weight, out, p);               \
    }                                                                                       \
    break;
    GDN_NORM_CASE(32)
    GDN_NORM_CASE(64)
    GDN_NORM_CASE(96)
    GDN_NORM_CASE(128)
    GDN_NORM_CASE(160)
    GDN_NORM_CASE(192)
    GDN_NORM_CASE(224)
    GDN_NORM_CASE(256)
#undef GDN_NORM_CASE
    default:
      break;
  }
}

}  // namespace gated_delta_norm

// __launch_bounds__(1024): any block of up to 32 warps launches (registers capped to fit).
#define GDN_NORM_KERNEL(NAME, InT, StT)                                                         \
  extern "C" __global__ void __launch_bounds__(1024) gated_delta_norm_##NAME(                   \
      const InT* q, const InT* k, const InT* v, const float* g, const float* beta, StT* state,   \
      const InT* z, const InT* weight, InT* out, const GdnNormParams p) {                       \
    gated_delta_norm::entry<InT, StT>(q, k, v, g, beta, state, z, weight, out, p);              \
  }

GDN_NORM_KERNEL(f32_f32, float, float)
GDN_NORM_KERNEL(f32_bf16, float, __nv_bfloat16)
GDN_NORM_KERNEL(f16_f32, __half, float)
GDN_NORM_KERNEL(f16_bf16, __half, __nv_bfloat16)
GDN_NORM_KERNEL(bf16_f32, __nv_bfloat16, float)
GDN_NORM_KERNEL(bf16_bf16, __nv_bfloat16, __nv_bfloat16)
