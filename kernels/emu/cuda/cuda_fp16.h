// Stand-in for CUDA's <cuda_fp16.h> when a .cu kernel body runs on the CPU through
// kernels/emu/cuda/cuda_emu.h: __half is the compiler's _Float16 (round to nearest even, as
// __float2half_rn).
#pragma once
typedef _Float16 __half;
inline float __half2float(__half h) { return float(h); }
inline __half __float2half_rn(float f) { return (__half)f; }
