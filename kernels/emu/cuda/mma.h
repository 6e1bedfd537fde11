// Stand-in for CUDA's <mma.h> (see cuda_emu.h): the wmma fragments, loads, stores, fill and
// mma_sync that kernels/gated_delta_chunk.cu (TF32, m16n16k8) and kernels/affine_grouped.cu
// (f16 and bf16, m16n16k16) use.
//
// Every lane holds the whole tile (x[] in row-major order of the tile, num_elements = all of
// it), so an elementwise loop over x[] touches each element once per lane, as the kernel's
// TF32 split does on the GPU's own per-lane share. mma_sync and store_matrix_sync start with a
// rendezvous of the warp (a simdgroup of metal_emu.h): on the GPU both are collective, so
// every lane has loaded its operands before any lane stores over them. mma_sync reads only the
// TF32 bits of its operands (the low 13 mantissa bits dropped, as the tensor cores do) and
// sums in float in k order; __float_to_tf32 rounds to nearest, ties away, as cvt.rna.tf32.f32.
// f16 and bf16 operands are held widened to float (exact) and their products are exact in
// float, summed in k order as well. Loads and stores check the 256-bit alignment wmma
// requires, that the pointer's element type is the fragment's (float for TF32), and that the
// leading dimension is a multiple of 16 bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int kRows = std::is_same<Use, matrix_b>::value ? K : M;
  static constexpr int kCols = std::is_same<Use, matrix_a>::value ? K : N;
  static constexpr int num_elements = kRows * kCols;
  float x[kRows * kCols];
};

inline float tf32_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  b &= 0xFFFFE000u;
  std::memcpy(&f, &b, 4);
  return f;
}

inline float __float_to_tf32(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  b = (b + 0x1000u) & 0xFFFFE000u;
  std::memcpy(&f, &b, 4);
  return f;
}

inline void check_aligned(const void* p, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0) metal_emu::fail("%s: %p is not 256-bit aligned", what, p);
}

// The element type a fragment of precision T loads from memory.
template <class T>
struct memory_type {
  using type = T;
};
template <>
struct memory_type<precision::tf32> {
  using type = float;
};

template <class E>
void check_leading_dimension(unsigned ld, const char* what) {
  if (ld * sizeof(E) % 16 != 0) metal_emu::fail("%s: leading dimension %u is not a multiple of 16 bytes", what, ld);
}

// A multiplicand as the tensor cores read it: the TF32 bits of a float, an f16 or bf16 value
// whole.
template <class T>
float operand(float v) {
  return std::is_same<T, precision::tf32>::value ? tf32_bits(v) : v;
}

template <class Use, int M, int N, int K, class T, class Layout, class E>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const E* p, unsigned ld) {
  static_assert(std::is_same<E, typename memory_type<T>::type>::value, "wmma: pointer and fragment types differ");
  using F = fragment<Use, M, N, K, T, Layout>;
  check_aligned(p, "wmma::load_matrix_sync");
  check_leading_dimension<E>(ld, "wmma::load_matrix_sync");
  for (int r = 0; r < F::kRows; ++r)
    for (int c = 0; c < F::kCols; ++c)
      f.x[r * F::kCols + c] = float(std::is_same<Layout, row_major>::value ? p[r * ld + c] : p[c * ld + r]);
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ld, layout_t l) {
  check_aligned(p, "wmma::load_matrix_sync");
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) f.x[r * N + c] = l == mem_row_major ? p[r * ld + c] : p[c * ld + r];
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ld, layout_t l) {
  metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup);
  check_aligned(p, "wmma::store_matrix_sync");
  check_leading_dimension<float>(ld, "wmma::store_matrix_sync");
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) (l == mem_row_major ? p[r * ld + c] : p[c * ld + r]) = f.x[r * N + c];
}

template <int M, int N, int K>
void fill_fragment(fragment<accumulator, M, N, K, float>& f, float v) {
  for (float& e : f.x) e = v;
}

template <int M, int N, int K, class T, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  static_assert(std::is_same<T, precision::tf32>::value ? K == 8 : K == 16, "wmma: m16n16k8 for TF32, m16n16k16 for f16/bf16");
  metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup);
  float out[M * N];
  for (int r = 0; r < M; ++r)
    for (int col = 0; col < N; ++col) {
      float acc = c.x[r * N + col];
      for (int k = 0; k < K; ++k) acc += operand<T>(a.x[r * K + k]) * operand<T>(b.x[k * N + col]);
      out[r * N + col] = acc;
    }
  std::memcpy(d.x, out, sizeof out);
}

}  // namespace wmma
}  // namespace nvcuda
