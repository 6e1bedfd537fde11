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
//     s, s + S, ...; grid = B * Hv. Dk a multiple of 32 up to 256 (the host checks).
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/gated_delta_norm.cu

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/gated_delta_norm.h"

namespace gated_delta_norm {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

constexpr unsigned int kMaxKeysPerLane = 8;
constexpr unsigned int kMaxRowsPerWarp = 8;
constexpr unsigned int kMaxWarps = 32;

template <typename InT, typename StT>
__device__ void step(const InT* __restrict__ q, const InT* __restrict__ k,
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
  const unsigned int per_lane = p.key_dim / 32;
  const unsigned int key0 = lane * per_lane;
  const unsigned int dim = p.value_dim;

  float s[kMaxRowsPerWarp][kMaxKeysPerLane];
#pragma unroll
  for (unsigned int r = 0; r < kMaxRowsPerWarp; ++r) {
    const unsigned int dv = warp + r * warps;
    const StT* s_row = state + ((size_t)n * dim + dv) * p.key_dim + key0;
#pragma unroll
    for (unsigned int i = 0; i < kMaxKeysPerLane; ++i) {
      s[r][i] = (dv < dim && i < per_lane) ? to_f32(s_row[i]) : 0.0f;
    }
  }

  for (unsigned int t = 0; t < p.steps; ++t) {
    const size_t bt = (size_t)b * p.steps + t;
    const size_t gate_at = bt * p.value_heads + hv;
    const size_t qk_at = (bt * p.key_heads + hk) * p.key_dim + key0;
    const float g_t = g[gate_at];
    const float beta_t = beta[gate_at];
    float k_t[kMaxKeysPerLane], q_t[kMaxKeysPerLane];
#pragma unroll
    for (unsigned int i = 0; i < kMaxKeysPerLane; ++i) {
      k_t[i] = i < per_lane ? to_f32(k[qk_at + i]) : 0.0f;
      q_t[i] = i < per_lane ? to_f32(q[qk_at + i]) : 0.0f;
    }

    float y[kMaxRowsPerWarp];
    float square_sum = 0.0f;
#pragma unroll
    for (unsigned int r = 0; r < kMaxRowsPerWarp; ++r) {
      y[r] = 0.0f;
      const unsigned int dv = warp + r * warps;
      if (dv < dim) {  // uniform over the warp
        float kv = 0.0f;
#pragma unroll
        for (unsigned int i = 0; i < kMaxKeysPerLane; ++i) {
          if (i < per_lane) {
            s[r][i] *= g_t;
            kv = fmaf(s[r][i], k_t[i], kv);
          }
        }
        kv = warp_sum(kv);
        const float delta = (to_f32(v[gate_at * dim + dv]) - kv) * beta_t;
        float o = 0.0f;
#pragma unroll
        for (unsigned int i = 0; i < kMaxKeysPerLane; ++i) {
          if (i < per_lane) {
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

    const InT* z_tok = z + (size_t)b * p.z_batch_stride + (size_t)t * p.z_token_stride + (size_t)hv * dim;
    InT* out_tok = out + gate_at * dim;
#pragma unroll
    for (unsigned int r = 0; r < kMaxRowsPerWarp; ++r) {
      const unsigned int dv = warp + r * warps;
      if (dv < dim && lane == 0) {
        const float normed = to_f32(from_f32<InT>(y[r] * inv_rms * to_f32(weight[dv])));
        const float gate = to_f32(z_tok[dv]);
        out_tok[dv] = from_f32<InT>(gate / (1.0f + expf(-gate)) * normed);
      }
    }
  }

  // The only rounding of the state in the call: StT, never InT.
#pragma unroll
  for (unsigned int r = 0; r < kMaxRowsPerWarp; ++r) {
    const unsigned int dv = warp + r * warps;
    StT* s_row = state + ((size_t)n * dim + dv) * p.key_dim + key0;
#pragma unroll
    for (unsigned int i = 0; i < kMaxKeysPerLane; ++i) {
      if (dv < dim && i < per_lane) s_row[i] = from_f32<StT>(s[r][i]);
    }
  }
}

}  // namespace gated_delta_norm

#define GDN_NORM_KERNEL(NAME, InT, StT)                                                         \
  extern "C" __global__ void gated_delta_norm_##NAME(                                           \
      const InT* q, const InT* k, const InT* v, const float* g, const float* beta, StT* state,   \
      const InT* z, const InT* weight, InT* out, const GdnNormParams p) {                       \
    gated_delta_norm::step<InT, StT>(q, k, v, g, beta, state, z, weight, out, p);               \
  }

GDN_NORM_KERNEL(f32_f32, float, float)
GDN_NORM_KERNEL(f32_bf16, float, __nv_bfloat16)
GDN_NORM_KERNEL(f16_f32, __half, float)
GDN_NORM_KERNEL(f16_bf16, __half, __nv_bfloat16)
GDN_NORM_KERNEL(bf16_f32, __nv_bfloat16, float)
GDN_NORM_KERNEL(bf16_bf16, __nv_bfloat16, __nv_bfloat16)
