// The end of a row group of the decode products (kernels/affine.cu's wide kernels and
// kernels/affine_stream.cu's streamed ones, which sum the same way): the group's lanes'
// partial sums reduced with shuffles, and its outputs written by its first lane — ROWS
// products, or for the SwiGLU ROWS activations silu(gate) * up of its gate and up rows.
// Include after cuda_convert.h.
#pragma once

namespace affine_row_group {

// acc: NR = ROWS (products) or 2 * ROWS (gate rows, then up rows) partial sums of this lane;
// l: the lane's place among the group's lpr lanes; outputs o0 .. o0 + ROWS of y_row.
template <uint32_t ROWS, bool SWIGLU, typename X, uint32_t NR>
__device__ __forceinline__ void reduce_and_write(float (&acc)[NR], uint32_t lpr, uint32_t l,
                                                 X* y_row, uint32_t o0, uint32_t outputs) {
  // xor offsets below lpr stay inside the group; every lane of the warp takes part.
#pragma unroll
  for (uint32_t r = 0; r < NR; ++r) {
    for (uint32_t o = lpr / 2; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  }
  if (l != 0) return;
#pragma unroll
  for (uint32_t r = 0; r < ROWS; ++r) {
    const uint32_t o = o0 + r;
    if (o >= outputs) continue;
    float v;
    if (SWIGLU) {
      const float gate = cuda_convert::to_f32(cuda_convert::from_f32<X>(acc[r]));
      const float up = cuda_convert::to_f32(cuda_convert::from_f32<X>(acc[ROWS + r]));
      v = gate / (1.f + expf(-gate)) * up;
    } else {
      v = acc[r];
    }
    y_row[o] = cuda_convert::from_f32<X>(v);
  }
}

}  // namespace affine_row_group
