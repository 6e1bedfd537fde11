// The MLX affine dot product of 2-, 4- and 8-bit packed rows, which put whole values in a
// word: since a group spans whole words, each word needs one scale and one bias, and adds
// s * sum(q x) + b * sum(x), as MLX's qmv computes it. `word_sum` is that word's sum, the one
// order both kernels/affine.cu's decode products (through `lane_dot`: a lane takes every 32nd
// word of the row) and kernels/hyper_connection.cu's hc_up_mix (its words split among fewer
// lanes, x read from shared memory four at a time) add in. Include after cuda_convert.h.
#pragma once

namespace affine_word_dot {

// acc + s * sum(q x) + b * sum(x) for one packed word against its PER_WORD values of x.
template <uint32_t BITS>
__device__ __forceinline__ float word_sum(uint32_t word, float scale, float bias,
                                          const float (&xv)[32 / BITS], float acc) {
  constexpr uint32_t PER_WORD = 32 / BITS, MASK = (1u << BITS) - 1u;
  float qx = 0.f, sx = 0.f;
#pragma unroll
  for (uint32_t k = 0; k < PER_WORD; ++k) {
    qx = fmaf((float)((word >> (k * BITS)) & MASK), xv[k], qx);
    sx += xv[k];
  }
  return fmaf(scale, qx, fmaf(bias, sx, acc));
}

// One lane's share of a row's dot product with x: words lane, lane + 32, ...
template <uint32_t BITS, typename X, typename S>
__device__ __forceinline__ float lane_dot(const uint32_t* row, const S* row_scales,
                                          const S* row_biases, const X* xr, uint32_t cols,
                                          uint32_t group_size, uint32_t lane) {
  constexpr uint32_t PER_WORD = 32 / BITS;
  const uint32_t words = cols / PER_WORD;
  float acc = 0.f;
  for (uint32_t w = lane; w < words; w += 32) {
    const uint32_t j0 = w * PER_WORD, g = j0 / group_size;
    float xv[PER_WORD];
#pragma unroll
    for (uint32_t k = 0; k < PER_WORD; ++k) xv[k] = cuda_convert::to_f32(xr[j0 + k]);
    acc = word_sum<BITS>(row[w], cuda_convert::to_f32(row_scales[g]),
                         cuda_convert::to_f32(row_biases[g]), xv, acc);
  }
  return acc;
}

}  // namespace affine_word_dot
