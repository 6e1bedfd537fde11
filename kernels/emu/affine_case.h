// What the four affine harnesses read the same way (affine_harness.cpp and
// affine_grouped_harness.cpp for the Metal kernels, affine_wide_cuda_harness.cpp and
// affine_grouped_cuda_harness.cpp for the CUDA ones): the stacked quantized matrix, and the
// bit widths of the MLX affine format the Metal kernels take.
#pragma once

// Include it after guarded_buffer.h, which includes the system headers it needs.
#include "guarded_buffer.h"

namespace affine_case {

// Dies unless `bits` is a width the Metal kernels take: 2, 3, 4, 5, 6 or 8.
inline void check_metal_bits(std::uint32_t bits) {
  const bool ok = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
  if (!ok) guarded::die("bits must be 2, 3, 4, 5, 6 or 8");
}

// Reads `stacked` rows of the matrix from stdin: packed u32 [stacked, cols * bits / 32], then
// f32 scales and biases [stacked, cols / group_size] (the caller has checked that group_size
// divides cols).
inline void read_weights(std::size_t stacked, std::uint32_t cols, std::uint32_t bits, std::uint32_t group_size,
                         std::vector<std::uint32_t>& packed, std::vector<float>& scales,
                         std::vector<float>& biases) {
  packed = guarded::read_raw<std::uint32_t>(stacked * cols * bits / 32);
  scales = guarded::read_raw<float>(stacked * (cols / group_size));
  biases = guarded::read_raw<float>(stacked * (cols / group_size));
}

}  // namespace affine_case
