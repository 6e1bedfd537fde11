// One lane's share of a packed MLX affine row's dot product with x, for the widths that put
// whole values in a word (2, 4, 8 bits): the lane takes every 32nd word of the row, and since
// a group spans whole words, each word needs one scale and one bias: s * sum(q x) + b *
// sum(x), as MLX's qmv computes it (kernels/affine.cu's decode products; kernels/
// hyper_connection.cu's hc_up_mix sums each word the same way, its words split among fewer
// lanes). Include after cuda_convert.h.
#pragma once

namespace affine_word_dot {

template <uint32_t BITS, typename X, typename S>
__device__ __forceinline__ float lane_dot(const uint32_t* row, const S* row_scales,
                                          const S* row_biases, const X* xr, uint32_t cols,
                                          uint32_t group_size, uint32_t lane) {
  constexpr uint32_t PER_WORD = 32 / BITS, MASK = (1u << BITS) - 1u;
  const uint32_t words = cols / PER_WORD;
  float acc = 0.f;
  for (uint32_t w = lane; w < words; w += 32) {
    const uint32_t word = row[w], j0 = w * PER_WORD, g = j0 / group_size;
    float qx = 0.f, sx = 0.f;
#pragma unroll
    for (uint32_t k = 0; k < PER_WORD; ++k) {
      const float xv = cuda_convert::to_f32(xr[j0 + k]);
      qx = fmaf((float)((word >> (k * BITS)) & MASK), xv, qx);
      sx += xv;
    }
    acc = fmaf(cuda_convert::to_f32(row_scales[g]), qx,
               fmaf(cuda_convert::to_f32(row_biases[g]), sx, acc));
  }
  return acc;
}

}  // namespace affine_word_dot
