// Just enough CUDA to run the bodies of kernels/gated_delta_chunk.cu, kernels/affine_grouped.cu
// and kernels/attn_decode.cu on the CPU, on top of the Metal emulation (kernels/emu/metal_emu.h):
// a block is a threadgroup of fibers, a warp a simdgroup, __syncthreads a threadgroup barrier,
// __syncwarp a simdgroup barrier, __shfl_up_sync simd_shuffle_up (the same semantics: lanes
// below the offset keep their value), __shfl_xor_sync simd_shuffle_xor (full-warp masks only);
// wmma is in mma.h beside this file. A kernel's body takes its thread and block indices and its
// shared memory as arguments (the entry points pass threadIdx, blockIdx and extern __shared__
// memory, which exist here only so that the entry points compile).
//
// Include <metal_stdlib> (or guarded_buffer.h) first, then this, then the .cu file, with
// kernels/emu/cuda on the include path so that <cuda_fp16.h>, <cuda_bf16.h> and <mma.h> are
// the stand-ins here.
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

// CUDA's integer min for device code.
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }

// Rounded float arithmetic that the compiler may not contract into an FMA (each its own call).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

// Bit casts between float and its 32-bit pattern.
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct dim3 {
  unsigned x, y, z;
};
// Read only by the entry points, which the harness never calls.
inline dim3 threadIdx, blockIdx;
