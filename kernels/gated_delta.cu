// Fused gated-delta recurrence (Gated DeltaNet linear attention) for Qwen3-Next / Qwen3.5:
// the CUDA twin of kernels/gated_delta.metal. crates/gdn-ops/src/cpu.rs is the reference
// both must match.
//
// Per token t, for every state row S = state[b, hv, dv, :] (Dk values):
//   S <- g*S;  kv = S.k;  delta = (v - kv)*beta;  S <- S + delta*k;  y = S.q
// with k, q the key head hk = hv / (Hv / Hk) of token t (consecutive value heads share a key
// head, as HF's repeat_interleave), v = v[b, t, hv, dv], g, beta = g, beta[b, t, hv].
// Arithmetic is f32. Where mask[b, t] == 0 the state is left untouched and y[b, t, hv, dv] = 0.
//
// ---------------------------------------------------------------------------------------
// ENTRY POINTS (extern "C", so the names are not mangled): gated_delta_step_<in>_<st>
//   <in> in {f32, f16, bf16}: InT, the dtype of q, k, v and y (float, __half, __nv_bfloat16)
//   <st> in {f32, bf16}:      StT, the dtype the state is stored in (float, __nv_bfloat16)
//
// SIGNATURE (every entry point; push the arguments in this order):
//   extern "C" __global__ void gated_delta_step_<in>_<st>(
//       const InT*   q,        // [B, T, Hk, Dk]  contiguous (L2-normalised, q scaled by 1/sqrt(Dk))
//       const InT*   k,        // [B, T, Hk, Dk]  contiguous
//       const InT*   v,        // [B, T, Hv, Dv]  contiguous
//       const float* g,        // [B, T, Hv]      decay, in (0, 1] (not log space)
//       const float* beta,     // [B, T, Hv]
//       StT*         state,    // [B, Hv, Dv, Dk] contiguous, read once and written once, in place
//       InT*         y,        // [B, T, Hv, Dv]  output, every element written
//       const float* mask,     // [B, T], 0 = padding; never read when has_mask == 0 (may be null)
//       unsigned int B, unsigned int T, unsigned int Hk, unsigned int Hv,
//       unsigned int Dk, unsigned int Dv,
//       unsigned int has_mask);
//   (u32 scalars: from Rust push `u32` values; pointers: device pointers / CudaSlice views.)
//
// LAUNCH (RPW = rows per warp, the compile-time GDN_ROWS_PER_WARP, 2 unless overridden, with
//   evict-first state accesses, GDN_STREAM_STATE, on unless overridden;
//   W = warps per block, the host's choice, 4 recommended; both measured in
//   docs/perf-notes-gpu.md):
//   block = (32, W, 1) threads, grid = (ceil(Dv / (W * RPW)), B * Hv, 1), no shared memory.
//   threadIdx.x is the lane; warp threadIdx.y owns rows dv0 .. dv0 + RPW - 1 with
//   dv0 = (blockIdx.x * W + threadIdx.y) * RPW, of n = blockIdx.y = b * Hv + hv.
//   B * Hv must be <= 65535.
//
// HOST MUST CHECK (the kernel cannot report errors; it does nothing for a bad Dk):
//   Dk % 32 == 0 and 32 <= Dk <= 256; Hv % Hk == 0; T >= 1;
//   q, k, v and state 16-byte aligned (true for any tensor starting at its allocation, and
//   for any offset that is a multiple of 16 bytes): each lane reads Dk/32 consecutive
//   values with the widest aligned vector loads. Calls must not overlap in time on the same
//   state (in place).
//
// DESIGN: each lane keeps Dk/32 contiguous values of each of its warp's rows in f32
// registers from the first token to the last, so the state is read once and written once per
// call whatever T is, and a bf16 state is rounded once per call (never per token). Rows never
// communicate: no shared memory, no barriers; the two dot products of a token are warp
// butterflies (__shfl_xor_sync), in the reference's order (decay, read, write, read).
// A warp owning RPW rows of one head (rather than one, as on Metal) loads and converts k, q,
// g and beta once for all of them, keeps RPW independent reductions in flight, and has RPW
// times the state bytes in flight per warp; RPW = 1 is exactly the Metal layout.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 kernels/gated_delta.cu -o gated_delta.ptx
// With -DGDN_BENCH_VARIANTS the PTX also carries gated_delta_step_r{1,2,4}[cs]_<in>_<st>
// and r8cs (rows per warp 1, 2, 4, 8; "cs": evict-first state loads/stores) and gdn_noop, an empty
// kernel to measure the launch floor, for scripts/gpu/gdn_cuda.py.
// ---------------------------------------------------------------------------------------

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace gdn {

// ---- element conversions --------------------------------------------------------------

template <typename T>
struct Elem;

template <>
struct Elem<float> {
  static __device__ __forceinline__ float load1(const float* p) { return *p; }
  static __device__ __forceinline__ float cvt(float x) { return x; }
};
template <>
struct Elem<__half> {
  static __device__ __forceinline__ float load1(const __half* p) { return __half2float(*p); }
  static __device__ __forceinline__ __half cvt(float x) { return __float2half_rn(x); }
};
template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float load1(const __nv_bfloat16* p) {
    return __bfloat162float(*p);
  }
  static __device__ __forceinline__ __nv_bfloat16 cvt(float x) { return __float2bfloat16_rn(x); }
};

// 16-bit halves of a 32-bit word (little-endian: the element at the lower address is low).
template <typename T>
__device__ __forceinline__ float lo16(uint32_t w);
template <typename T>
__device__ __forceinline__ float hi16(uint32_t w);
template <>
__device__ __forceinline__ float lo16<__nv_bfloat16>(uint32_t w) { return __uint_as_float(w << 16); }
template <>
__device__ __forceinline__ float hi16<__nv_bfloat16>(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}
template <>
__device__ __forceinline__ float lo16<__half>(uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
}
template <>
__device__ __forceinline__ float hi16<__half>(uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}

template <typename T>
__device__ __forceinline__ uint32_t bits16(float x);
template <>
__device__ __forceinline__ uint32_t bits16<__nv_bfloat16>(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
template <>
__device__ __forceinline__ uint32_t bits16<__half>(float x) {
  return __half_as_ushort(__float2half_rn(x));
}

// Raw 32-bit words: 16-byte, 8-byte or 4-byte loads, the widest the size allows.
template <int WORDS, bool STREAM>
__device__ __forceinline__ void load_words(const uint32_t* __restrict__ p, uint32_t (&w)[WORDS]) {
  if constexpr (WORDS % 4 == 0) {
#pragma unroll
    for (int c = 0; c < WORDS / 4; ++c) {
      const uint4* a = reinterpret_cast<const uint4*>(p) + c;
      uint4 x;
      if constexpr (STREAM) x = __ldcs(a); else x = *a;
      w[4 * c] = x.x;
      w[4 * c + 1] = x.y;
      w[4 * c + 2] = x.z;
      w[4 * c + 3] = x.w;
    }
  } else if constexpr (WORDS % 2 == 0) {
#pragma unroll
    for (int c = 0; c < WORDS / 2; ++c) {
      const uint2* a = reinterpret_cast<const uint2*>(p) + c;
      uint2 x;
      if constexpr (STREAM) x = __ldcs(a); else x = *a;
      w[2 * c] = x.x;
      w[2 * c + 1] = x.y;
    }
  } else {
#pragma unroll
    for (int c = 0; c < WORDS; ++c) {
      if constexpr (STREAM) w[c] = __ldcs(reinterpret_cast<const unsigned int*>(p) + c); else w[c] = p[c];
    }
  }
}

template <int WORDS, bool STREAM>
__device__ __forceinline__ void store_words(uint32_t* __restrict__ p, const uint32_t (&w)[WORDS]) {
  if constexpr (WORDS % 4 == 0) {
#pragma unroll
    for (int c = 0; c < WORDS / 4; ++c) {
      uint4* a = reinterpret_cast<uint4*>(p) + c;
      const uint4 x = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
      if constexpr (STREAM) __stcs(a, x); else *a = x;
    }
  } else if constexpr (WORDS % 2 == 0) {
#pragma unroll
    for (int c = 0; c < WORDS / 2; ++c) {
      uint2* a = reinterpret_cast<uint2*>(p) + c;
      const uint2 x = make_uint2(w[2 * c], w[2 * c + 1]);
      if constexpr (STREAM) __stcs(a, x); else *a = x;
    }
  } else {
#pragma unroll
    for (int c = 0; c < WORDS; ++c) {
      if constexpr (STREAM) __stcs(reinterpret_cast<unsigned int*>(p) + c, w[c]); else p[c] = w[c];
    }
  }
}

// N consecutive elements of T at p, as f32.
template <typename T, int N, bool STREAM>
__device__ __forceinline__ void load_f32(const T* __restrict__ p, float (&out)[N]) {
  constexpr int BYTES = N * static_cast<int>(sizeof(T));
  if constexpr (BYTES % 4 != 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = Elem<T>::load1(p + i);
  } else {
    constexpr int WORDS = BYTES / 4;
    uint32_t w[WORDS];
    load_words<WORDS, STREAM>(reinterpret_cast<const uint32_t*>(p), w);
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < N; ++i) out[i] = __uint_as_float(w[i]);
    } else {
#pragma unroll
      for (int i = 0; i < WORDS; ++i) {
        out[2 * i] = lo16<T>(w[i]);
        out[2 * i + 1] = hi16<T>(w[i]);
      }
    }
  }
}

// N f32 values rounded to T and stored at p.
template <typename T, int N, bool STREAM>
__device__ __forceinline__ void store_f32(T* __restrict__ p, const float (&in)[N]) {
  constexpr int BYTES = N * static_cast<int>(sizeof(T));
  if constexpr (BYTES % 4 != 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = Elem<T>::cvt(in[i]);
  } else {
    constexpr int WORDS = BYTES / 4;
    uint32_t w[WORDS];
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < N; ++i) w[i] = __float_as_uint(in[i]);
    } else {
#pragma unroll
      for (int i = 0; i < WORDS; ++i) w[i] = bits16<T>(in[2 * i]) | (bits16<T>(in[2 * i + 1]) << 16);
    }
    store_words<WORDS, STREAM>(reinterpret_cast<uint32_t*>(p), w);
  }
}

// ---- one warp's rows --------------------------------------------------------------------

struct Dims {
  unsigned int B, T, Hk, Hv, Dk, Dv, has_mask;
};

// One warp owns RPW consecutive rows dv0 .. dv0+RPW-1 of one (b, hv): they share k, q, g and
// beta, so those are loaded and converted once per token for all of them, and the RPW
// reductions are independent (they overlap in the pipeline). RPW = 1 is the Metal kernel's
// layout, one warp per row. Each row's arithmetic is the reference's, in its order.
// STREAM: the state is read and written with evict-first hints (__ldcs/__stcs): it is used
// once per call and only again at the next token, after every other layer has run.
template <typename InT, typename StT, int PER, int RPW, bool STREAM>
__device__ __forceinline__ void rows_loop(const InT* __restrict__ q, const InT* __restrict__ k,
                                          const InT* __restrict__ v, const float* __restrict__ g,
                                          const float* __restrict__ beta, StT* __restrict__ state,
                                          InT* __restrict__ y, const float* __restrict__ mask,
                                          const Dims& d, unsigned int n, unsigned int dv0,
                                          unsigned int lane) {
  const unsigned int b = n / d.Hv;
  const unsigned int hv = n % d.Hv;
  const unsigned int hk = hv / (d.Hv / d.Hk);
  const unsigned int key0 = lane * PER;
  // Rows of this warp that exist (the last warp of a head may have fewer): uniform per warp.
  const unsigned int nrows = min(static_cast<unsigned int>(RPW), d.Dv - dv0);

  StT* s_row = state + (static_cast<size_t>(n) * d.Dv + dv0) * d.Dk + key0;
  float s[RPW][PER];
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    if (static_cast<unsigned int>(r) < nrows) {
      load_f32<StT, PER, STREAM>(s_row + static_cast<size_t>(r) * d.Dk, s[r]);
    } else {
#pragma unroll
      for (int i = 0; i < PER; ++i) s[r][i] = 0.0f;
    }
  }

  for (unsigned int t = 0; t < d.T; ++t) {
    const size_t bt = static_cast<size_t>(b) * d.T + t;
    const size_t gate_at = bt * d.Hv + hv;
    const size_t y_at = gate_at * d.Dv + dv0;
    // The mask depends on (b, t) only, so the whole warp takes the same branch.
    if (d.has_mask != 0 && mask[bt] == 0.0f) {
      if (lane < nrows) y[y_at + lane] = Elem<InT>::cvt(0.0f);
      continue;
    }
    const size_t qk_at = (bt * d.Hk + hk) * d.Dk + key0;
    float kt[PER], qt[PER];
    load_f32<InT, PER, false>(k + qk_at, kt);
    load_f32<InT, PER, false>(q + qk_at, qt);
    const float g_t = g[gate_at];
    const float beta_t = beta[gate_at];
    float v_t[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) v_t[r] = static_cast<unsigned int>(r) < nrows ? Elem<InT>::load1(v + y_at + r) : 0.0f;

    // Decay first: the memory read must see the decayed state, as in the reference.
    float kv[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      kv[r] = 0.0f;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        s[r][i] *= g_t;
        kv[r] = fmaf(s[r][i], kt[i], kv[r]);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int r = 0; r < RPW; ++r) kv[r] += __shfl_xor_sync(0xffffffffu, kv[r], o);
    }
    // Write, then the output reads the state after this token's write.
    float out[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const float delta = (v_t[r] - kv[r]) * beta_t;
      out[r] = 0.0f;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        s[r][i] = fmaf(kt[i], delta, s[r][i]);
        out[r] = fmaf(s[r][i], qt[i], out[r]);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int r = 0; r < RPW; ++r) out[r] += __shfl_xor_sync(0xffffffffu, out[r], o);
    }
    // Lane r writes row r (every lane holds every sum; select without a run-time index).
    float mine = out[0];
#pragma unroll
    for (int r = 1; r < RPW; ++r) mine = lane == static_cast<unsigned int>(r) ? out[r] : mine;
    if (lane < nrows) y[y_at + lane] = Elem<InT>::cvt(mine);
  }

  // The only rounding of the state in the call: to StT, never to InT.
#pragma unroll
  for (int r = 0; r < RPW; ++r) {
    if (static_cast<unsigned int>(r) < nrows) store_f32<StT, PER, STREAM>(s_row + static_cast<size_t>(r) * d.Dk, s[r]);
  }
}

template <typename InT, typename StT, int RPW, bool STREAM>
__device__ __forceinline__ void entry(const InT* __restrict__ q, const InT* __restrict__ k,
                                      const InT* __restrict__ v, const float* __restrict__ g,
                                      const float* __restrict__ beta, StT* __restrict__ state,
                                      InT* __restrict__ y, const float* __restrict__ mask,
                                      unsigned int B, unsigned int T, unsigned int Hk,
                                      unsigned int Hv, unsigned int Dk, unsigned int Dv,
                                      unsigned int has_mask) {
  // All 32 lanes of a warp share threadIdx.y, so padding warps of the last block leave as a
  // whole warp and no shuffle ever runs with missing lanes.
  const unsigned int dv0 = (blockIdx.x * blockDim.y + threadIdx.y) * RPW;
  if (dv0 >= Dv) return;
  const unsigned int n = blockIdx.y;
  const unsigned int lane = threadIdx.x;
  const Dims d{B, T, Hk, Hv, Dk, Dv, has_mask};
  switch (Dk) {
#define GDN_CASE(DK)                                                                  \
  case DK:                                                                            \
    rows_loop<InT, StT, DK / 32, RPW, STREAM>(q, k, v, g, beta, state, y, mask, d, n, \
                                              dv0, lane);                             \
    break;
    GDN_CASE(32)
    GDN_CASE(64)
    GDN_CASE(96)
    GDN_CASE(128)
    GDN_CASE(160)
    GDN_CASE(192)
    GDN_CASE(224)
    GDN_CASE(256)
#undef GDN_CASE
    default:
      break;  // rejected on the host
  }
}

}  // namespace gdn

#ifndef GDN_ROWS_PER_WARP
#define GDN_ROWS_PER_WARP 2
#endif
#ifndef GDN_STREAM_STATE
#define GDN_STREAM_STATE true
#endif

#define GDN_KERNEL(name, InT, StT, RPW, STREAM)                                                \
  extern "C" __global__ void name(const InT* __restrict__ q, const InT* __restrict__ k,        \
                                  const InT* __restrict__ v, const float* __restrict__ g,      \
                                  const float* __restrict__ beta, StT* __restrict__ state,     \
                                  InT* __restrict__ y, const float* __restrict__ mask,         \
                                  unsigned int B, unsigned int T, unsigned int Hk,             \
                                  unsigned int Hv, unsigned int Dk, unsigned int Dv,           \
                                  unsigned int has_mask) {                                     \
    gdn::entry<InT, StT, RPW, STREAM>(q, k, v, g, beta, state, y, mask, B, T, Hk, Hv, Dk, Dv,  \
                                      has_mask);                                               \
  }

#define GDN_SIX(prefix, RPW, STREAM)                                               \
  GDN_KERNEL(prefix##f32_f32, float, float, RPW, STREAM)                           \
  GDN_KERNEL(prefix##f32_bf16, float, __nv_bfloat16, RPW, STREAM)                  \
  GDN_KERNEL(prefix##f16_f32, __half, float, RPW, STREAM)                          \
  GDN_KERNEL(prefix##f16_bf16, __half, __nv_bfloat16, RPW, STREAM)                 \
  GDN_KERNEL(prefix##bf16_f32, __nv_bfloat16, float, RPW, STREAM)                  \
  GDN_KERNEL(prefix##bf16_bf16, __nv_bfloat16, __nv_bfloat16, RPW, STREAM)

// The entry points candle launches: gated_delta_step_{InT}_{StT}.
GDN_SIX(gated_delta_step_, GDN_ROWS_PER_WARP, GDN_STREAM_STATE)

#ifdef GDN_BENCH_VARIANTS
// For scripts/gpu/gdn_cuda.py: rows per warp 1 (the Metal layout), 2, 4, 8; with "cs" the
// state goes through evict-first loads and stores.
GDN_SIX(gated_delta_step_r1_, 1, false)
GDN_SIX(gated_delta_step_r2_, 2, false)
GDN_SIX(gated_delta_step_r4_, 4, false)
GDN_SIX(gated_delta_step_r1cs_, 1, true)
GDN_SIX(gated_delta_step_r2cs_, 2, true)
GDN_SIX(gated_delta_step_r4cs_, 4, true)
GDN_SIX(gated_delta_step_r8cs_, 8, true)
extern "C" __global__ void gdn_noop() {}
#endif
