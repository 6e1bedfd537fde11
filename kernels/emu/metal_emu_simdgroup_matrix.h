// Metal's simdgroup matrices (MSL 2.3+, <metal_simdgroup_matrix>) for metal_emu.h:
// simdgroup_matrix<T, 8, 8> (simdgroup_float8x8, simdgroup_half8x8, simdgroup_bfloat8x8),
// make_filled_simdgroup_matrix, the diagonal constructor, simdgroup_load / simdgroup_store
// (device or threadgroup memory, elements_per_row, matrix_origin, transpose_matrix),
// simdgroup_multiply_accumulate and simdgroup_multiply.
//
// What is faithful, and why:
//  * On the GPU a matrix is spread over the 32 lanes (2 elements each); here every lane holds
//    the whole matrix. Every operation is a rendezvous of the 32 lanes (metal_emu_simd.h), so
//    a lane that skips one or reaches it from elsewhere aborts, as for simd_sum. Loads read
//    and stores write memory once all lanes have arrived, as the lockstep hardware does, so a
//    lane's later plain store cannot leak into another lane's load.
//  * The lanes must agree: the same address, elements_per_row, origin and transpose flag for
//    a load or a store, and bit-identical operands for a store or a product (a matrix built
//    from lane-dependent values is garbage on the GPU, and aborts here).
//  * Element types follow the source: load and store take a pointer to the matrix's own
//    element type (a float matrix from a bfloat pointer does not compile), while the operands
//    of a product may differ in type, as Metal compilers accept (llama.cpp multiplies half by
//    float). Products are summed in float in k order and rounded once to the destination's
//    type; the GPU's order of summation is not documented, which the kernels' tests allow for.
//  * Only 8x8 matrices, the one shape Apple GPUs provide.
// Included by metal_emu.h only.
#pragma once

// MSL's ulong2 as simdgroup_load/store take it: ulong2(0) and ulong2(x, y). (A clang vector
// type cannot be built from two scalars with that syntax in C++.)
struct ulong2 {
  unsigned long x, y;
  explicit ulong2(unsigned long both) : x(both), y(both) {}
  ulong2(unsigned long x_, unsigned long y_) : x(x_), y(y_) {}
};

namespace metal {

// Cols x Rows, element [row][col], as MSL names the parameters.
template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "Apple GPUs have only 8x8 simdgroup matrices");
  T e[Rows][Cols];

  simdgroup_matrix() = default;
  // MSL: a diagonal matrix holding `diagonal` on its diagonal, 0 elsewhere.
  explicit simdgroup_matrix(T diagonal) {
    for (int r = 0; r < Rows; ++r)
      for (int c = 0; c < Cols; ++c) e[r][c] = r == c ? diagonal : T(0.0f);
  }
};

typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
#if defined(__HAVE_BFLOAT__)
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
#endif

template <class T, int Cols, int Rows>
simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, Cols, Rows> m;
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Cols; ++c) m.e[r][c] = value;
  return m;
}

}  // namespace metal

namespace metal_emu {

// One lane's part in a matrix operation, handed to the rendezvous by address (the lane's
// fiber stack lives until the rendezvous resolves).
struct MatrixJob {
  const char* name;
  // Load/store: the memory's element 0 of the matrix (origin applied) and its row pitch.
  // Every lane must pass the same.
  std::uintptr_t memory;
  unsigned long elements_per_row;
  bool transpose;
  // The lane's matrices: for a load `d` only; for a store `a` only; for a product all.
  void* d;
  std::size_t d_bytes;
  const void* a;
  const void* b;
  const void* c;
  std::size_t a_bytes, b_bytes, c_bytes;
  void (*apply)(MatrixJob* lane);  // the lane's work, run in the resolver
};

inline void same_operand(SimdCall* lanes, const void* MatrixJob::*which, std::size_t bytes, const char* what) {
  const MatrixJob* first = operand<const MatrixJob*>(lanes[0]);
  for (int i = 1; i < kSimdWidth; ++i) {
    const MatrixJob* job = operand<const MatrixJob*>(lanes[i]);
    if (std::memcmp(first->*which, job->*which, bytes) != 0) {
      fail("%s: lane %d holds a different %s than lane 0; a simdgroup matrix is one value shared by the "
           "32 lanes",
           first->name, i, what);
    }
  }
}

// The resolver of every matrix operation: check what the lanes must agree on, then do it.
inline void resolve_matrix(SimdCall* lanes) {
  const MatrixJob* first = operand<const MatrixJob*>(lanes[0]);
  for (int i = 1; i < kSimdWidth; ++i) {
    const MatrixJob* job = operand<const MatrixJob*>(lanes[i]);
    if (job->memory != first->memory || job->elements_per_row != first->elements_per_row ||
        job->transpose != first->transpose) {
      fail("%s: lane %d passed address %#lx, elements_per_row %lu, transpose %d but lane 0 passed %#lx, %lu, %d; "
           "Metal requires the same in every lane",
           first->name, i, (unsigned long)job->memory, job->elements_per_row, int(job->transpose),
           (unsigned long)first->memory, first->elements_per_row, int(first->transpose));
    }
  }
  if (first->a != nullptr) same_operand(lanes, &MatrixJob::a, first->a_bytes, "operand a");
  if (first->b != nullptr) same_operand(lanes, &MatrixJob::b, first->b_bytes, "operand b");
  if (first->c != nullptr) same_operand(lanes, &MatrixJob::c, first->c_bytes, "operand c");
  // The lanes agree on everything the result depends on: compute it once (lane 0's) and hand
  // every other lane a copy; a store writes memory once.
  MatrixJob* lane0 = operand<MatrixJob*>(lanes[0]);
  lane0->apply(lane0);
  if (lane0->d != nullptr) {
    for (int i = 1; i < kSimdWidth; ++i) std::memcpy(operand<MatrixJob*>(lanes[i])->d, lane0->d, lane0->d_bytes);
  }
}

inline void matrix_rendezvous(MatrixJob& job, Site site) {
  MatrixJob* p = &job;
  simd_collective<bool>(job.name, &resolve_matrix, p, 0, site);
}

// Element (r, c) of the matrix at `memory` lies at memory[r * pitch + c], or at
// memory[c * pitch + r] when transposed.
inline std::size_t matrix_offset(int r, int c, unsigned long pitch, bool transpose) {
  return transpose ? std::size_t(c) * pitch + r : std::size_t(r) * pitch + c;
}

template <class T, int Cols, int Rows, class Ptr>
void load(metal::simdgroup_matrix<T, Cols, Rows>& d, Ptr src, unsigned long elements_per_row, ulong2 origin,
          bool transpose, Site site) {
  if (elements_per_row < (transpose ? unsigned(Rows) : unsigned(Cols))) {
    fail("simdgroup_load: elements_per_row %lu is shorter than a row of the matrix", elements_per_row);
  }
  // The origin is (column, row) of the matrix as stored.
  Ptr start = src + std::size_t(origin.y) * elements_per_row + origin.x;
  MatrixJob job{};
  job.name = "simdgroup_load";
  job.memory = (std::uintptr_t)(const void*)start;
  job.elements_per_row = elements_per_row;
  job.transpose = transpose;
  job.d = &d;
  job.d_bytes = sizeof(d);
  job.apply = [](MatrixJob* j) {
    auto* m = static_cast<metal::simdgroup_matrix<T, Cols, Rows>*>(j->d);
    Ptr mem = (Ptr)j->memory;
    for (int r = 0; r < Rows; ++r)
      for (int c = 0; c < Cols; ++c) m->e[r][c] = mem[matrix_offset(r, c, j->elements_per_row, j->transpose)];
  };
  matrix_rendezvous(job, site);
}

template <class T, int Cols, int Rows, class Ptr>
void store(const metal::simdgroup_matrix<T, Cols, Rows>& a, Ptr dst, unsigned long elements_per_row, ulong2 origin,
           bool transpose, Site site) {
  if (elements_per_row < (transpose ? unsigned(Rows) : unsigned(Cols))) {
    fail("simdgroup_store: elements_per_row %lu is shorter than a row of the matrix", elements_per_row);
  }
  Ptr start = dst + std::size_t(origin.y) * elements_per_row + origin.x;
  MatrixJob job{};
  job.name = "simdgroup_store";
  job.memory = (std::uintptr_t)(const void*)start;
  job.elements_per_row = elements_per_row;
  job.transpose = transpose;
  job.a = &a;
  job.a_bytes = sizeof(a);
  job.apply = [](MatrixJob* j) {
    auto* m = static_cast<const metal::simdgroup_matrix<T, Cols, Rows>*>(j->a);
    Ptr mem = (Ptr)j->memory;
    for (int r = 0; r < Rows; ++r)
      for (int c = 0; c < Cols; ++c) mem[matrix_offset(r, c, j->elements_per_row, j->transpose)] = m->e[r][c];
  };
  matrix_rendezvous(job, site);
}

// d = a * b (+ c): float sums in k order, one rounding to D's type.
template <class D, class A, class B, class C, bool Accumulate>
void product(metal::simdgroup_matrix<D, 8, 8>& d, const metal::simdgroup_matrix<A, 8, 8>& a,
             const metal::simdgroup_matrix<B, 8, 8>& b, const metal::simdgroup_matrix<C, 8, 8>* c, const char* name,
             Site site) {
  MatrixJob job{};
  job.name = name;
  job.d = &d;
  job.d_bytes = sizeof(d);
  job.a = &a;
  job.a_bytes = sizeof(a);
  job.b = &b;
  job.b_bytes = sizeof(b);
  job.c = c;
  job.c_bytes = sizeof(*c);
  job.apply = [](MatrixJob* j) {
    const auto& ma = *static_cast<const metal::simdgroup_matrix<A, 8, 8>*>(j->a);
    const auto& mb = *static_cast<const metal::simdgroup_matrix<B, 8, 8>*>(j->b);
    const auto* mc = static_cast<const metal::simdgroup_matrix<C, 8, 8>*>(j->c);
    metal::simdgroup_matrix<D, 8, 8> out;
    for (int r = 0; r < 8; ++r)
      for (int col = 0; col < 8; ++col) {
        float acc = Accumulate ? float(mc->e[r][col]) : 0.0f;
        for (int k = 0; k < 8; ++k) acc += float(ma.e[r][k]) * float(mb.e[k][col]);
        out.e[r][col] = D(acc);
      }
    // d may alias a, b or c (d = a*b + d is the usual form): written only once all is read.
    *static_cast<metal::simdgroup_matrix<D, 8, 8>*>(j->d) = out;
  };
  matrix_rendezvous(job, site);
}

}  // namespace metal_emu

namespace metal {

// The trailing Site argument is filled in at the kernel's call, as for simd_sum.
#define METAL_EMU_MATRIX_MEMORY(space)                                                                           \
  template <class T, int Cols, int Rows>                                                                         \
  void simdgroup_load(simdgroup_matrix<T, Cols, Rows>& d, const space T* src, ulong elements_per_row = Cols,     \
                      ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false,                           \
                      metal_emu::Site site = metal_emu::Site::here()) {                                          \
    metal_emu::load(d, src, elements_per_row, matrix_origin, transpose_matrix, site);                           \
  }                                                                                                              \
  template <class T, int Cols, int Rows>                                                                         \
  void simdgroup_store(const simdgroup_matrix<T, Cols, Rows>& a, space T* dst, ulong elements_per_row = Cols,    \
                       ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false,                          \
                       metal_emu::Site site = metal_emu::Site::here()) {                                         \
    metal_emu::store(a, dst, elements_per_row, matrix_origin, transpose_matrix, site);                          \
  }

METAL_EMU_MATRIX_MEMORY(device)
METAL_EMU_MATRIX_MEMORY(threadgroup)

#undef METAL_EMU_MATRIX_MEMORY

template <class D, class A, class B, class C>
void simdgroup_multiply_accumulate(simdgroup_matrix<D, 8, 8>& d, const simdgroup_matrix<A, 8, 8>& a,
                                   const simdgroup_matrix<B, 8, 8>& b, const simdgroup_matrix<C, 8, 8>& c,
                                   metal_emu::Site site = metal_emu::Site::here()) {
  metal_emu::product<D, A, B, C, true>(d, a, b, &c, "simdgroup_multiply_accumulate", site);
}

template <class D, class A, class B>
void simdgroup_multiply(simdgroup_matrix<D, 8, 8>& d, const simdgroup_matrix<A, 8, 8>& a,
                        const simdgroup_matrix<B, 8, 8>& b, metal_emu::Site site = metal_emu::Site::here()) {
  metal_emu::product<D, A, B, D, false>(d, a, b, nullptr, "simdgroup_multiply", site);
}

}  // namespace metal
