// Just enough CUDA to run the bodies of kernels/gated_delta_chunk.cu, kernels/affine_grouped.cu,
// kernels/attn_decode.cu, kernels/moe_route.cu, kernels/affine_mma.cu (and others) on the CPU,
// on top of the Metal emulation (kernels/emu/metal_emu.h):
// a block is a threadgroup of fibers, a warp a simdgroup, __syncthreads a threadgroup barrier,
// __syncwarp a simdgroup barrier, __shfl_up_sync simd_shuffle_up (the same semantics: lanes
// below the offset keep their value), __shfl_xor_sync simd_shuffle_xor and __shfl_sync
// simd_shuffle (full-warp masks only);
// wmma is in mma.h beside this file, cp.async (__pipeline_memcpy_async, deferred to the
// thread's __pipeline_wait_prior) in cuda_pipeline_primitives.h. A kernel's body takes its
// thread and block indices and its shared memory as arguments (the entry points pass
// threadIdx, blockIdx and extern __shared__ memory, which exist here only so that the entry
// points compile).
//
// Include <metal_stdlib> (or guarded_buffer.h) first, then this, then the .cu file, with
// kernels/emu/cuda on the include path so that <cuda_fp16.h>, <cuda_bf16.h>, <mma.h> and
// <cuda_pipeline_primitives.h> are the stand-ins here.
#pragma once

#include <cmath>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __shared__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __syncthreads() metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define __syncwarp() metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup)
#define __shfl_up_sync(mask, value, offset) metal::simd_shuffle_up(value, offset)
#define __shfl_xor_sync(mask, value, offset) metal::simd_shuffle_xor(value, offset)
#define __shfl_sync(mask, value, lane) metal::simd_shuffle(value, lane)

// CUDA's integer min for device code.
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }

// Rounded float arithmetic that the compiler may not contract into an FMA (each its own call).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }

// CUDA's reciprocal square root (its rounding within an ulp of this).
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

// Bit casts between float and its 32 bits.
namespace cuda_emu {
template <class To, class From>
inline To bits_as(From from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}
}  // namespace cuda_emu
inline float __uint_as_float(unsigned u) { return cuda_emu::bits_as<float>(u); }
inline float __int_as_float(int i) { return cuda_emu::bits_as<float>(i); }
inline int __float_as_int(float f) { return cuda_emu::bits_as<int>(f); }
inline unsigned __float_as_uint(float f) { return cuda_emu::bits_as<unsigned>(f); }

// CUDA's uint2 and uint4 (loads and stores of 8 and 16 bytes): the Metal emulation's uint2, and
// a uint4 of the same kind; both sized and aligned as CUDA's.
typedef uint uint4 __attribute__((ext_vector_type(4)));
static_assert(sizeof(uint2) == 8 && alignof(uint2) == 8 && sizeof(uint4) == 16 &&
                  alignof(uint4) == 16,
              "uint2 and uint4 as CUDA lays them out");
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  uint4 v;
  v.x = x, v.y = y, v.z = z, v.w = w;
  return v;
}

// CUDA's float4 is the Metal emulation's (16 bytes, 16-aligned).
inline float4 make_float4(float x, float y, float z, float w) {
  float4 v;
  v.x = x, v.y = y, v.z = z, v.w = w;
  return v;
}

// Bit counts: set bits, and the 1-based position of the lowest one (0 for none).
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs(int(x)); }
// Leading zero bits (32 for 0, as CUDA's __clz; __builtin_clz leaves 0 undefined): the
// affine_mma kernels' log2 of the group size.
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }

// PRMT without a mode, as CUDA's __byte_perm: byte n of the result is byte (s >> 4n) & 7 of
// the eight bytes (y << 32) | x (the affine_mma kernels' interleaving of x's bf16 values).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long bytes = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (unsigned n = 0; n < 4; ++n) r |= unsigned((bytes >> (8 * ((s >> (4 * n)) & 7u))) & 0xFFu) << (8 * n);
  return r;
}

// The warp reductions in hardware (REDUX) and the vote (full-warp masks only): rendezvous of
// the 32 lanes as the simdgroup functions are, each call site its own.
inline unsigned __reduce_max_sync(unsigned, unsigned v, metal_emu::Site site = metal_emu::Site::here()) {
  return metal::simd_max(v, site);
}
inline int __reduce_max_sync(unsigned, int v, metal_emu::Site site = metal_emu::Site::here()) {
  return metal::simd_max(v, site);
}
inline unsigned __reduce_min_sync(unsigned, unsigned v, metal_emu::Site site = metal_emu::Site::here()) {
  return metal::simd_min(v, site);
}
namespace cuda_emu {
// Lane i's predicate as bit i, for every lane.
inline void ballot(metal_emu::SimdCall* lanes) {
  unsigned r = 0;
  for (int i = 0; i < metal_emu::kSimdWidth; ++i) r |= metal_emu::operand<bool>(lanes[i]) ? 1u << i : 0u;
  for (int i = 0; i < metal_emu::kSimdWidth; ++i) metal_emu::answer(lanes[i], r);
}
}  // namespace cuda_emu
inline unsigned __ballot_sync(unsigned, bool pred, metal_emu::Site site = metal_emu::Site::here()) {
  return metal_emu::simd_collective<unsigned>("__ballot_sync", &cuda_emu::ballot, pred, 0, site);
}

struct dim3 {
  unsigned x, y, z;
};
// Read only by the entry points, which the harness never calls.
inline dim3 threadIdx, blockIdx, blockDim, gridDim;
