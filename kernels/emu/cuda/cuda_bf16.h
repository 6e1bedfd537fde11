// Stand-in for CUDA's <cuda_bf16.h> (see cuda_emu.h): __nv_bfloat16 is the compiler's __bf16
// (round to nearest even, as __float2bfloat16_rn).
#pragma once
typedef __bf16 __nv_bfloat16;
inline float __bfloat162float(__nv_bfloat16 h) { return float(h); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return (__nv_bfloat16)f; }
// A pair, the lower one first in memory, as __floats2bfloat162_rn packs it.
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
