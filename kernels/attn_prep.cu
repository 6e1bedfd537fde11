// Decode-step preparation of gated attention on CUDA: the twin of kernels/attn_prep.metal
// (which describes the maths), with crates/gdn-ops/src/ops/attn_prep/cpu.rs as the reference
// both must match.
//
// ENTRY POINTS (extern "C"; <t> in {f32, f16, bf16}):
//   attn_prep_<t>(qkv, q_norm, k_norm, inv_freq, pos, keys, values, q, gate,
//                 AttnPrepParams p)
//   block = 32 threads (one warp per head task: query heads, key heads, value heads),
//   grid = (Nq + 2*Nkv, B).
//   attn_prep_slots_<t>(qkv, q_norm, k_norm, inv_freq, slots, q, gate, AttnPrepParams p)
//   The same over B sequences with KV buffers of their own: slots [4 B] holds per sequence the
//   device addresses of its keys and values [1, Nkv, cap_b, Dh] and of its [1] u32 position,
//   then cap_b; p.capacity is unused. Each sequence's results are its own launch's.
// pos is read from device memory (a CUDA graph replays the launch for every token). When
// pos >= capacity no key or value is written; the host grows the buffers first.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 kernels/attn_prep.cu -o attn_prep.ptx

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/attn_prep.h"
#include "cuda_convert.h"

namespace attn_prep {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

// The RMS-normed feature j of a head, rounded to T as the composed path stores it.
template <typename T>
__device__ __forceinline__ float normed(const T* x, const T* w, uint32_t j, float inv) {
  return to_f32(from_f32<T>(to_f32(x[j]) * inv * to_f32(w[j])));
}

template <typename T>
__device__ void run(const T* qkv, const T* q_norm, const T* k_norm, const float* inv_freq,
                    const uint32_t* pos_buf, T* keys, T* values, T* q_out, T* gate_out,
                    const AttnPrepParams p, const unsigned long long* slots = nullptr) {
  const uint32_t task = blockIdx.x, b = blockIdx.y, lane = threadIdx.x;
  const uint32_t nq = p.q_heads, nkv = p.kv_heads, dh = p.head_dim;
  if (b >= p.batch || task >= nq + 2 * nkv) return;
  // Sequence b's KV buffers, position and capacity: row b of the call's [B, Nkv, cap, Dh]
  // buffers at the call's position, or (the slot entry) its own buffers [1, Nkv, cap_b, Dh],
  // its own [1] u32 position and capacity from slots[4b .. 4b + 4) = keys, values, pos, cap.
  const unsigned long long* slot = slots != nullptr ? slots + 4 * (size_t)b : nullptr;
  const uint32_t pos = slot != nullptr ? *reinterpret_cast<const uint32_t*>(slot[2]) : pos_buf[0];
  const uint32_t capacity = slot != nullptr ? (uint32_t)slot[3] : p.capacity;
  T* seq_keys = slot != nullptr ? reinterpret_cast<T*>(slot[0]) : keys + (size_t)b * nkv * p.capacity * dh;
  T* seq_values =
      slot != nullptr ? reinterpret_cast<T*>(slot[1]) : values + (size_t)b * nkv * p.capacity * dh;
  const T* row = qkv + (size_t)b * (2 * nq + 2 * nkv) * dh;

  if (task >= nq + nkv) {
    const uint32_t h = task - nq - nkv;
    if (pos >= capacity) return;
    const T* v = row + (size_t)(2 * nq + nkv + h) * dh;
    T* dst = seq_values + ((size_t)h * capacity + pos) * dh;
    for (uint32_t j = lane; j < dh; j += 32) dst[j] = v[j];
    return;
  }

  const bool is_query = task < nq;
  const uint32_t h = is_query ? task : task - nq;
  const T* x = is_query ? row + (size_t)(2 * h) * dh : row + (size_t)(2 * nq + h) * dh;
  const T* w = is_query ? q_norm : k_norm;
  T* dst;
  if (is_query) {
    dst = q_out + ((size_t)b * nq + h) * dh;
    T* gate = gate_out + ((size_t)b * nq + h) * dh;
    for (uint32_t j = lane; j < dh; j += 32) gate[j] = x[dh + j];
  } else {
    if (pos >= capacity) return;  // the whole warp: no lane misses the shuffles below
    dst = seq_keys + ((size_t)h * capacity + pos) * dh;
  }

  float squares = 0.f;
  for (uint32_t j = lane; j < dh; j += 32) {
    const float v = to_f32(x[j]);
    squares = fmaf(v, v, squares);
  }
  for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
  const float inv = rsqrtf(squares / (float)dh + p.eps);
  const uint32_t half_r = p.rope_dims / 2;
  const float fpos = (float)pos;
  for (uint32_t j = lane; j < dh; j += 32) {
    const float n = normed(x, w, j, inv);
    float out = n;
    if (j < p.rope_dims) {
      const bool first = j < half_r;
      const uint32_t i = first ? j : j - half_r;
      const float partner = normed(x, w, first ? j + half_r : i, inv);
      float s, c;
      sincosf(fpos * inv_freq[i], &s, &c);  // accurate (no --use_fast_math) at large angles
      out = first ? n * c - partner * s : n * c + partner * s;
    }
    dst[j] = from_f32<T>(out);
  }
}

}  // namespace attn_prep

#define ATTN_PREP_ENTRY(TN, T)                                                               \
  extern "C" __global__ void attn_prep_##TN(                                                 \
      const T* qkv, const T* q_norm, const T* k_norm, const float* inv_freq,                 \
      const uint32_t* pos, T* keys, T* values, T* q, T* gate, const AttnPrepParams p) {      \
    attn_prep::run<T>(qkv, q_norm, k_norm, inv_freq, pos, keys, values, q, gate, p);         \
  }                                                                                          \
  extern "C" __global__ void attn_prep_slots_##TN(                                           \
      const T* qkv, const T* q_norm, const T* k_norm, const float* inv_freq,                 \
      const unsigned long long* slots, T* q, T* gate, const AttnPrepParams p) {              \
    attn_prep::run<T>(qkv, q_norm, k_norm, inv_freq, nullptr, nullptr, nullptr, q, gate, p,  \
                      slots);                                                                \
  }

ATTN_PREP_ENTRY(f32, float)
ATTN_PREP_ENTRY(f16, __half)
ATTN_PREP_ENTRY(bf16, __nv_bfloat16)
