// Conversions between the kernels' storage types (f32, f16, bf16) and f32, shared by every
// kernels/*.cu. f32 -> f16/bf16 rounds to nearest even, as candle's and Metal's casts do.
// Also the list of instantiations of a kernel over two storage types (values and scales).
// Include it after <cuda_fp16.h> and <cuda_bf16.h> (or the emulation's stand-ins); a kernel's
// namespace takes the two names with `using cuda_convert::to_f32;` (and from_f32).
#pragma once

namespace cuda_convert {

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

}  // namespace cuda_convert

// Expands M(XN, XT, SN, ST) for each pair of storage types (name, C++ type), the values
// (XN, XT) outer and the scales (SN, ST) inner: the nine instantiations of a kernel entry.
#define CUDA_FOR_FLOAT_TYPE_PAIRS(M)              \
  M(f32, float, f32, float)                       \
  M(f32, float, f16, __half)                      \
  M(f32, float, bf16, __nv_bfloat16)              \
  M(f16, __half, f32, float)                      \
  M(f16, __half, f16, __half)                     \
  M(f16, __half, bf16, __nv_bfloat16)             \
  M(bf16, __nv_bfloat16, f32, float)              \
  M(bf16, __nv_bfloat16, f16, __half)             \
  M(bf16, __nv_bfloat16, bf16, __nv_bfloat16)
