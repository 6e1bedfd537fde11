// Stand-in for CUDA's <cuda_fp16.h> when a .cu kernel body runs on the CPU through
// kernels/emu/cuda/cuda_emu.h: __half is the compiler's _Float16 (round to nearest even, as
// __float2half_rn).
#pragma once
typedef _Float16 __half;
inline float __half2float(__half h) { return float(h); }
inline __half __float2half_rn(float f) { return (__half)f; }
// A pair, the lower one first in memory, as __floats2half2_rn packs it.
struct __half2 {
  __half x, y;
};
inline __half2 __floats2half2_rn(float lo, float hi) { return __half2{__float2half_rn(lo), __float2half_rn(hi)}; }
