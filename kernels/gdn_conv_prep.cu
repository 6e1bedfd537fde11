// The front of a Gated DeltaNet layer on CUDA, for a decode step or a whole prefill chunk:
// the twin of kernels/gdn_conv_prep.metal (which documents the maths), with
// crates/gdn-ops/src/ops/gdn_conv_prep/cpu.rs as the reference both must match.
//
// ENTRY POINTS (extern "C"; <t> in {f32, f16, bf16}, InT its type):
//   gdn_conv_prep_<t>(qkv, b, a, conv_state, next_state, taps, dt_bias, neg_a_exp, q, k, v,
//                     g, beta, ConvPrepParams p)
//     S tokens per sequence: for each token the conv over its window of [conv_state; qkv],
//     SiLU, L2 norms of q and k (scales folded in), g and beta; the blocks of the last token
//     write the conv state after the chunk to next_state. qkv, b and a rows at their batch
//     and token strides (views are fine); conv_state, next_state [B, K-1, C] and taps [K, C]
//     contiguous; q, k [B, S, Hk, Dk], v [B, S, Hv, Dv] in InT; g, beta [B, S, Hv] f32.
//     next_state == conv_state is allowed only for S = 1 (the decode step's in-place shift:
//     each element is read, then written, by one thread); for S > 1 other tokens' blocks
//     still read conv_state, so next_state must be another buffer.
//     block = (32, 4): one warp per (batch row, token, head slot), slots = Hk q heads, Hk k
//     heads, Hv v heads; grid = (ceil((2 Hk + Hv) / 4), S, B). Lane l owns channels
//     l + 32 i of its head. Dk, Dv multiples of 32 up to 256, 2 <= K <= 8, S and B at most
//     65535 (the host checks).
//   gdn_conv_prep_slots_<t>(qkv, b, a, slots, taps, dt_bias, neg_a_exp, q, k, v, g, beta, p)
//     The decode step (S = 1) over B sequences whose conv states are separate tensors:
//     slots [B] holds the device address of sequence b's conv state [1, K-1, C], shifted in
//     place. Everything else as above: each sequence's outputs are what its own launch gives.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/gdn_conv_prep.cu

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/gdn_conv_prep.h"
#include "cuda_convert.h"

namespace gdn_conv_prep {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

// conv_state and next_state carry no __restrict__: a decode step passes the same buffer.
template <typename InT>
__device__ void prep(const InT* __restrict__ qkv, const InT* __restrict__ b_in,
                     const InT* __restrict__ a_in, const InT* conv_state, InT* next_state,
                     const InT* __restrict__ taps, const float* __restrict__ dt_bias,
                     const float* __restrict__ neg_a_exp, InT* __restrict__ q,
                     InT* __restrict__ k, InT* __restrict__ v, float* __restrict__ g,
                     float* __restrict__ beta, const ConvPrepParams p,
                     const unsigned long long* __restrict__ slots = nullptr) {
  constexpr unsigned int kMaxPerLane = 8;
  constexpr unsigned int kMaxTaps = 8;
  // All 32 lanes of a warp share threadIdx.y: padding warps leave whole.
  const unsigned int slot = blockIdx.x * blockDim.y + threadIdx.y;
  const unsigned int key_heads = p.key_heads;
  if (slot >= 2 * key_heads + p.value_heads) return;
  const unsigned int token = blockIdx.y;
  const unsigned int batch = blockIdx.z;
  const size_t row = (size_t)batch * p.tokens + token;  // the outputs' (batch, token) row
  const unsigned int lane = threadIdx.x;
  const unsigned int qk_channels = key_heads * p.key_dim;
  const unsigned int channels = 2 * qk_channels + p.value_heads * p.value_dim;

  unsigned int first, width;
  InT* out;
  float scale = 1.0f;
  const bool is_value = slot >= 2 * key_heads;
  if (slot < key_heads) {
    first = slot * p.key_dim;
    width = p.key_dim;
    out = q + (row * key_heads + slot) * p.key_dim;
    scale = p.q_scale;
  } else if (!is_value) {
    const unsigned int h = slot - key_heads;
    first = qk_channels + h * p.key_dim;
    width = p.key_dim;
    out = k + (row * key_heads + h) * p.key_dim;
    scale = p.k_scale;
  } else {
    const unsigned int hv = slot - 2 * key_heads;
    first = 2 * qk_channels + hv * p.value_dim;
    width = p.value_dim;
    out = v + (row * p.value_heads + hv) * p.value_dim;
  }
  const unsigned int per_lane = width / 32;
  const unsigned int history = p.kernel_size - 1;
  const InT* rows = qkv + (size_t)batch * p.qkv_batch_stride;
  // Sequence `batch`'s conv state: a row of the call's [B, K-1, C] tensor, or (the slot
  // entry, a decode step) its own [1, K-1, C] tensor at the device address slots[batch],
  // shifted in place.
  const InT* state = slots != nullptr ? reinterpret_cast<const InT*>(slots[batch])
                                      : conv_state + (size_t)batch * history * channels;
  InT* next = slots != nullptr ? reinterpret_cast<InT*>(slots[batch])
                               : next_state + (size_t)batch * history * channels;
  const bool last_token = token + 1 == p.tokens;

  // A value slot's decay and gate inputs are asked for with the window, not after the conv
  // (lane 0 reads them; they were a second round trip at the end of the warp's work).
  float a_x = 0.0f, b_x = 0.0f, neg_a = 0.0f;
  if (is_value && lane == 0) {
    const unsigned int hv = slot - 2 * key_heads;
    a_x = to_f32(a_in[(size_t)batch * p.a_batch_stride + (size_t)token * p.a_token_stride + hv]) +
          dt_bias[hv];
    b_x = to_f32(b_in[(size_t)batch * p.b_batch_stride + (size_t)token * p.b_token_stride + hv]);
    neg_a = neg_a_exp[hv];
  }

  // Every window is read before anything is computed or written: the loads of all of a
  // lane's channels are in flight together (written channel by channel, the in-place state
  // write of one channel kept the next channel's loads waiting behind it), and the in-place
  // shift of a decode step still reads each element before it is overwritten.
  InT window[kMaxPerLane][kMaxTaps];
#pragma unroll
  for (unsigned int i = 0; i < kMaxPerLane; ++i) {
    if (i < per_lane) {
      const unsigned int c = first + lane + 32 * i;
#pragma unroll
      for (unsigned int m = 0; m < kMaxTaps; ++m) {
        if (m < p.kernel_size) {
          const unsigned int at = token + m;
          window[i][m] = at < history ? state[(size_t)at * channels + c]
                                      : rows[(size_t)(at - history) * p.qkv_token_stride + c];
        }
      }
    }
  }
  float act[kMaxPerLane];
  float square_sum = 0.0f;
#pragma unroll
  for (unsigned int i = 0; i < kMaxPerLane; ++i) {
    act[i] = 0.0f;
    if (i < per_lane) {
      const unsigned int c = first + lane + 32 * i;
      float acc = 0.0f;
#pragma unroll
      for (unsigned int m = 0; m < kMaxTaps; ++m) {
        if (m < p.kernel_size) acc = fmaf(to_f32(window[i][m]), to_f32(taps[(size_t)m * channels + c]), acc);
      }
      act[i] = to_f32(from_f32<InT>(acc / (1.0f + expf(-acc))));
      square_sum = fmaf(act[i], act[i], square_sum);
    }
  }
  if (last_token) {
#pragma unroll
    for (unsigned int i = 0; i < kMaxPerLane; ++i) {
      if (i < per_lane) {
        const unsigned int c = first + lane + 32 * i;
#pragma unroll
        for (unsigned int m = 1; m < kMaxTaps; ++m) {
          if (m < p.kernel_size) next[(size_t)(m - 1) * channels + c] = window[i][m];
        }
      }
    }
  }
  if (is_value) {
#pragma unroll
    for (unsigned int i = 0; i < kMaxPerLane; ++i) {
      if (i < per_lane) out[lane + 32 * i] = from_f32<InT>(act[i]);
    }
    if (lane == 0) {
      const unsigned int hv = slot - 2 * key_heads;
      const size_t at = row * p.value_heads + hv;
      // softplus, stable for large |x|.
      const float softplus = fmaxf(a_x, 0.0f) + log1pf(expf(-fabsf(a_x)));
      g[at] = expf(neg_a * softplus);
      beta[at] = 1.0f / (1.0f + expf(-b_x));
    }
    return;
  }
  // q or k: the slot is uniform over the warp.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) square_sum += __shfl_xor_sync(0xffffffffu, square_sum, o);
  const float inv_rms = rsqrtf(square_sum / (float)width + p.norm_eps);
#pragma unroll
  for (unsigned int i = 0; i < kMaxPerLane; ++i) {
    if (i < per_lane) out[lane + 32 * i] = from_f32<InT>(act[i] * inv_rms * scale);
  }
}

}  // namespace gdn_conv_prep

#define GDN_CONV_PREP(NAME, T)                                                                  \
  extern "C" __global__ void gdn_conv_prep_##NAME(                                              \
      const T* qkv, const T* b_in, const T* a_in, const T* conv_state, T* next_state,           \
      const T* taps, const float* dt_bias, const float* neg_a_exp, T* q, T* k, T* v, float* g,  \
      float* beta, const ConvPrepParams p) {                                                    \
    gdn_conv_prep::prep<T>(qkv, b_in, a_in, conv_state, next_state, taps, dt_bias, neg_a_exp,   \
                           q, k, v, g, beta, p);                                                \
  }                                                                                             \
  extern "C" __global__ void gdn_conv_prep_slots_##NAME(                                        \
      const T* qkv, const T* b_in, const T* a_in, const unsigned long long* slots,              \
      const T* taps, const float* dt_bias, const float* neg_a_exp, T* q, T* k, T* v, float* g,  \
      float* beta, const ConvPrepParams p) {                                                    \
    gdn_conv_prep::prep<T>(qkv, b_in, a_in, nullptr, nullptr, taps, dt_bias, neg_a_exp, q, k,   \
                           v, g, beta, p, slots);                                               \
  }

GDN_CONV_PREP(f32, float)
GDN_CONV_PREP(f16, __half)
GDN_CONV_PREP(bf16, __nv_bfloat16)
