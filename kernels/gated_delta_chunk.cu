// Chunked gated-delta rule (Gated DeltaNet prefill) on tensor cores, as three passes of which
// only the second walks the chunks in sequence; the token-by-token kernels/gated_delta.cu is
// the reference it must match (the maths: kernels/gated_delta_chunk.metal's header).
//
// Per chunk of 64 tokens, G_i = exp(gcum_i) with gcum the in-chunk cumsum of log g (only exp of
// differences gcum_i - gcum_j, j <= i, or of gcum_i itself: never a positive exponent), h_c the
// state S^T [Dk, Dv] before chunk c:
//   L[i,j] = beta_i (k_i.k_j) G_i/G_j, j < i;   A = (I + L)^-1
//   w = A diag(beta G) K   [64, Dk];   u = A diag(beta) V   [64, Dv]
//   v_new = u - w h_c;   h_{c+1} = G_64 h_c + K^T (v_new (.) G_64/G_j)
//   y = G (.) (Q h_c) + (Q K^T (.) G_i/G_j, j <= i) v_new
// Pass 1 (gated_delta_chunk_prep_<in>, grid chunks x B*Hv): the gate cumsum, A (the diagonal
//   16x16 blocks by forward substitution, the others by tensor-core products), w and u.
// Pass 2 (gated_delta_chunk_state_<in>_<st>, grid Dv/32 x B*Hv): the only sequential part: per
//   chunk, h_c stored, v_new = u - w h_c (written over u), the state advanced. The state stays
//   in the warps' f32 accumulator fragments from the first chunk to the last: StT is read once
//   and written once per call (a bf16 state is rounded once). The next chunk's inputs are
//   copied asynchronously while a chunk computes.
// Pass 3 (gated_delta_chunk_out_<in>, grid chunks x B*Hv): y from h_c and v_new.
//
// ENTRY POINTS (extern "C"), <in> in {f32, f16, bf16} (InT of q, k, v, y), <st> in {f32, bf16}:
//   gated_delta_chunk_prep_<in>(const InT* k, const InT* v, const float* g, const float* beta,
//       const float* mask, float* gcum, float* w, float* u, GdnChunkParams p)
//   gated_delta_chunk_state_<in>_<st>(const InT* k, const float* gcum, const float* w,
//       float* u (in: u, out: v_new), float* h, StT* state (in place), GdnChunkParams p)
//   gated_delta_chunk_out_<in>(const InT* q, const InT* k, const float* gcum, const float* h,
//       const float* v_new, const float* mask, InT* y (the chunks' tokens only), GdnChunkParams p)
// Tensors: q, k [B,T,Hk,Dk]; v, y [B,T,Hv,Dv]; g (decay in (0,1], not log), beta [B,T,Hv];
// state [B,Hv,Dv,Dk]; mask [B,T] (read only if has_mask); GdnChunkParams by value
// (kernels/params/gated_delta_chunk.h). Scratch, f32, with n = b*Hv + hv and C = chunks, every
// element written before it is read: gcum [n][C*64], w [n][C][64][Dk], u [n][C][64][Dv],
// h [n][C][Dk][Dv]; 32-byte aligned (wmma loads and stores them directly).
// LAUNCH: blocks of 256 threads (kThreads); dynamic shared memory prep_smem_floats(Dk, Dv),
//   state_smem_floats(Dk, sizeof(InT)), out_smem_floats(Dk) floats (over 48 KB: the host raises
//   each function's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first; the state pass takes
//   up to 227 KB, an sm_90 block's most). The three run in order on one stream.
// HOST MUST CHECK: Dk % 16 == 0, 16 <= Dk <= 256, Dv % 32 == 0, Dv <= 256, Hv % Hk == 0,
//   1 <= chunks, chunks * 64 <= T, B * Hv <= 65535. The tail (T % 64 tokens) runs through the
//   recurrence. Where mask[b, t] == 0 (padding) the token neither decays nor writes the state
//   (log g = 0, beta = 0) and y is 0.
//
// Every product runs on wmma m16n16k8 TF32 tensor cores with f32 accumulation; an f32 operand
// is split (a = a_hi + a_lo in TF32, a*b ~ a_hi*b_hi + a_hi*b_lo + a_lo*b_hi) so that results
// keep f32 accuracy (1e-6 relative rather than TF32's 1e-3): A, w, u, h, v_new and the decayed
// products are f32 quantities whatever InT is, while f16/bf16 K and Q tiles are exact in TF32
// and go in unsplit.
//
// Compile for candle: nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/gated_delta_chunk.cu (sm_80+ for
// the instructions; the state pass's shared memory, 185 KB at Dk = 128, needs an sm_90 block).
// The bodies (gdn_chunk::{prep,state,out}_kernel) take their thread and block indices and their
// shared memory as arguments, so that kernels/emu/gated_delta_chunk_cuda_harness.cpp can run
// them on the CPU (crates/gdn-ops/tests/gated_delta_chunk_cuda_emulation.rs).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>
#include <mma.h>
#include <stdint.h>

#include <type_traits>

#include "params/gated_delta_chunk.h"
#include "cuda_convert.h"

namespace gdn_chunk {

using namespace nvcuda;

constexpr int kChunk = 64;
constexpr int kBlockV = 32;  // value columns per block of the state pass; y's column slab
constexpr int kWarps = 8;  // the state pass gives each warp one 16x16 tile of v_new
constexpr int kThreads = kWarps * 32;
constexpr int kDiagBlocks = kChunk / 16;  // A's diagonal 16x16 blocks, one warp each
constexpr int kPad = 8;               // floats of padding per row: keeps 32-byte tile alignment, spreads banks
constexpr int kLdV = kBlockV + kPad;  // 32-column slabs: the state block, v_new, y staging
constexpr int kLdX = kChunk + kPad;   // 64x64 matrices: -L, A, P
constexpr int kLdT = 16 + kPad;       // one 16x16 tile of scratch per warp
constexpr float kLogFloor = -80.0f;   // log g floor: g = 0 keeps a finite cumsum

__host__ __device__ constexpr int ld_rows(int d) { return d + kPad; }
__host__ __device__ constexpr int max_int(int a, int b) { return a > b ? a : b; }

// Shared memory of each pass, in floats (the host mirrors these).
__host__ __device__ constexpr int prep_smem_floats(int dk, int dv) {
  // K [64][Dk+8], V [64][Dv+8], -L then A diag(beta G), A then A diag(beta), scratch tiles, gates.
  return kChunk * ld_rows(dk) + kChunk * ld_rows(dv) + 2 * kChunk * kLdX + kDiagBlocks * 16 * kLdT + 3 * kChunk;
}
// The state pass copies the next chunk's w, K, u and gates while it computes on this one (two
// buffers of each) where that fits in an H100's 227 KB, i.e. up to Dk = 128; above, one buffer.
__host__ __device__ constexpr int state_buffers(int dk) { return dk <= 128 ? 2 : 1; }
// K as the state pass holds it: f32 activations are copied straight into the f32 rows the
// products read (one per buffer); 16-bit ones into raw rows [64][Dk] per buffer, widened into
// one f32 copy per chunk.
__host__ __device__ constexpr int state_k_floats(int dk, int in_bytes) {
  return in_bytes == 4 ? state_buffers(dk) * kChunk * ld_rows(dk)
                       : kChunk * ld_rows(dk) + state_buffers(dk) * kChunk * dk * in_bytes / 4;
}
__host__ __device__ constexpr int state_smem_floats(int dk, int in_bytes) {
  // h [Dk][40], w [64][Dk+8] per buffer, K, v_new [64][40], u [64][32] and gcum per buffer.
  return dk * kLdV + state_buffers(dk) * kChunk * ld_rows(dk) + state_k_floats(dk, in_bytes) + kChunk * kLdV +
         state_buffers(dk) * (kChunk * kBlockV + kChunk);
}
__host__ __device__ constexpr int out_slab_floats(int dk) {
  // K [64][Dk+8] until P is formed, then an h slab [Dk][40] and a v_new slab [64][40].
  return max_int(kChunk * ld_rows(dk), (dk + kChunk) * kLdV);
}
__host__ __device__ constexpr int out_smem_floats(int dk) {
  // Q [64][Dk+8], the slab region, P [64][72], y staging [64][40], gcum and keep.
  return kChunk * ld_rows(dk) + out_slab_floats(dk) + kChunk * kLdX + kChunk * kLdV + 2 * kChunk;
}

using cuda_convert::from_f32;
using cuda_convert::to_f32;

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;
template <typename Layout_>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, Layout_>;
template <typename Layout_>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, Layout_>;
using Row = wmma::row_major;
using Col = wmma::col_major;

// x = hi + lo: hi is x rounded to TF32 (to nearest, ties away from zero, as cvt.rna.tf32 for
// the finite values here, in two integer operations where ptxas expands cvt.rna into five);
// lo = x - hi is exact (Sterbenz), and the tensor cores read only its TF32 bits (dropping
// 2^-11 of lo, ~2^-22 of x). The three-product split keeps about 21 bits of each operand.
template <typename Frag>
__device__ __forceinline__ void split(Frag& hi, Frag& lo) {
#pragma unroll
  for (int i = 0; i < hi.num_elements; ++i) {
    const float x = hi.x[i];
    const float h = __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
    hi.x[i] = h;
    lo.x[i] = x - h;
  }
}

// A TF32 operand tile from shared memory. wmma::load_matrix_sync takes a generic pointer and
// nvcc emits a generic load (64-bit address arithmetic per element, longer latency); the
// .shared form of the same wmma.load is what the tile is. The emulator has only the former.
template <typename Use, typename Layout>
__device__ __forceinline__ void load_shared(wmma::fragment<Use, 16, 16, 8, wmma::precision::tf32, Layout>& f,
                                            const float* p, int ld) {
#if defined(__CUDA_ARCH__)
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(p));
  unsigned r0, r1, r2, r3;
  constexpr bool kA = std::is_same<Use, wmma::matrix_a>::value, kRow = std::is_same<Layout, Row>::value;
  if constexpr (kA && kRow) {
    asm volatile("wmma.load.a.sync.aligned.row.m16n16k8.shared.tf32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(at), "r"(ld) : "memory");
  } else if constexpr (kA) {
    asm volatile("wmma.load.a.sync.aligned.col.m16n16k8.shared.tf32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(at), "r"(ld) : "memory");
  } else if constexpr (kRow) {
    asm volatile("wmma.load.b.sync.aligned.row.m16n16k8.shared.tf32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(at), "r"(ld) : "memory");
  } else {
    asm volatile("wmma.load.b.sync.aligned.col.m16n16k8.shared.tf32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(at), "r"(ld) : "memory");
  }
  static_assert(sizeof(f.x) == 4 * sizeof(float), "a TF32 m16n16k8 operand is four registers per lane");
  f.x[0] = __uint_as_float(r0);
  f.x[1] = __uint_as_float(r1);
  f.x[2] = __uint_as_float(r2);
  f.x[3] = __uint_as_float(r3);
#else
  wmma::load_matrix_sync(f, p, ld);
#endif
}

// acc += A[16 x kdim] * B[kdim x 16] (shared memory, 32-byte aligned), in f32
// accuracy: an operand that is not exact in TF32 (SplitA / SplitB) is split into hi + lo and
// the products hi*hi, hi*lo and lo*hi summed; one that is exact (f16 or bf16 activations
// widened to f32) is used as is. A at a (leading dimension lda) in layout LA, B at b (ldb) in
// layout LB; for row_major the element (r, c) is at p[r * ld + c], for col_major at p[c * ld + r].
// The small hi*lo and lo*hi products go to accumulators of their own, added at the end: three
// independent chains of tensor-core operations instead of one three times as long.
template <typename LA, typename LB, bool SplitA, bool SplitB>
__device__ __forceinline__ void mma_f32(Acc& acc, const float* a, int lda, const float* b, int ldb, int kdim) {
  Acc lo_a, lo_b;
  if constexpr (SplitA) wmma::fill_fragment(lo_a, 0.0f);
  if constexpr (SplitB) wmma::fill_fragment(lo_b, 0.0f);
  for (int kk = 0; kk < kdim; kk += 8) {
    FragA<LA> a_hi, a_lo;
    FragB<LB> b_hi, b_lo;
    const float* a_at = std::is_same<LA, Row>::value ? a + kk : a + kk * lda;
    const float* b_at = std::is_same<LB, Row>::value ? b + kk * ldb : b + kk;
    load_shared(a_hi, a_at, lda);
    load_shared(b_hi, b_at, ldb);
    if constexpr (SplitA) split(a_hi, a_lo);
    if constexpr (SplitB) split(b_hi, b_lo);
    if constexpr (SplitA) wmma::mma_sync(lo_a, a_lo, b_hi, lo_a);
    if constexpr (SplitB) wmma::mma_sync(lo_b, a_hi, b_lo, lo_b);
    wmma::mma_sync(acc, a_hi, b_hi, acc);
  }
#pragma unroll
  for (int i = 0; i < acc.num_elements; ++i) {
    if constexpr (SplitA) acc.x[i] += lo_a.x[i];
    if constexpr (SplitB) acc.x[i] += lo_b.x[i];
  }
}

// Lower 16x16 tiles (mi, mj), mj <= mi, of a 64x64 product: 10 of them.
__device__ __forceinline__ void lower_tile(int t, int& mi, int& mj) {
  mi = 0;
  while ((mi + 1) * (mi + 2) / 2 <= t) ++mi;
  mj = t - mi * (mi + 1) / 2;
}

// The (row, column) of the elements e = start, start + stride, ... of a row-major block with
// `cols` columns, the two divisions by a runtime `cols` done once (one per element costs ~20
// instructions).
struct RowWalk {
  int row, col;
  const int cols, step_rows, step_cols;
  __device__ RowWalk(int start, int stride, int cols_)
      : row(start / cols_), col(start % cols_), cols(cols_), step_rows(stride / cols_), step_cols(stride % cols_) {}
  __device__ void next() {
    row += step_rows;
    col += step_cols;
    if (col >= cols) {
      col -= cols;
      ++row;
    }
  }
};

// Where one (value head, chunk) finds its rows.
struct Head {
  unsigned n, b, hv, hk;
  __device__ Head(const GdnChunkParams& p, unsigned head) : n(head) {
    b = n / p.value_heads;
    hv = n % p.value_heads;
    hk = hv / (p.value_heads / p.key_heads);
  }
};

// rows[i * ld + col] = to_f32(src[i * pitch + col]) for a [rows x cols] block, by the whole block.
template <typename InT>
__device__ __forceinline__ void stage(float* rows, int ld, const InT* src, size_t pitch, int n_rows, int cols,
                                      int tid) {
  for (RowWalk at(tid, kThreads, cols); at.row < n_rows; at.next()) {
    rows[at.row * ld + at.col] = to_f32(src[at.row * pitch + at.col]);
  }
}

// The decay mask of a 64x64 product in xs, by the whole block: entry (i, j) on or below the
// diagonal (strictly below when kStrict) times row_scale(i) * exp(gcum[i] - gcum[j]); the rest
// of the diagonal 16x16 tiles cleared (the tiles above them are never read).
template <bool kStrict, typename RowScale>
__device__ __forceinline__ void decay_mask(float* xs, const float* gcum, int tid, RowScale row_scale) {
  for (int e = tid; e < kChunk * kChunk; e += kThreads) {
    const int i = e / kChunk, j = e % kChunk;
    if (kStrict ? j < i : j <= i) {
      xs[i * kLdX + j] *= row_scale(i) * expf(gcum[i] - gcum[j]);
    } else if (j / 16 == i / 16) {
      xs[i * kLdX + j] = 0.0f;
    }
  }
}

// f16 and bf16 values are exact in TF32 (10-bit mantissa, 8-bit exponent): K, Q and V tiles of
// such activations need no split; f32 ones do.
template <typename InT>
constexpr bool kSplitIn = std::is_same<InT, float>::value;

// The lower 16x16 tiles of a b^T into xs, a and b 64 rows of dk columns (pitch ldk) each, by
// the block's warps (no barrier).
template <typename InT>
__device__ __forceinline__ void lower_product(float* xs, const float* a, const float* b, int ldk, int dk, int warp) {
  for (int job = warp; job < 10; job += kWarps) {
    int mi, mj;
    lower_tile(job, mi, mj);
    Acc acc;
    wmma::fill_fragment(acc, 0.0f);
    mma_f32<Row, Col, kSplitIn<InT>, kSplitIn<InT>>(acc, a + 16 * mi * ldk, ldk, b + 16 * mj * ldk, ldk, dk);
    wmma::store_matrix_sync(xs + 16 * mi * kLdX + 16 * mj, acc, kLdX, wmma::mem_row_major);
  }
}

// ---- Pass 1: per (chunk, value head), all in parallel: gcum, A, w, u -----------------------
template <typename InT>
__device__ __forceinline__ void prep_kernel(const InT* __restrict__ k, const InT* __restrict__ v, const float* __restrict__ g,
                            const float* __restrict__ beta, const float* __restrict__ mask,
                            float* __restrict__ gcum_out, float* __restrict__ w_out, float* __restrict__ u_out,
                            const GdnChunkParams p, const int tid, const unsigned chunk, const unsigned head,
                            float* smem) {
  const int dk = int(p.key_dim), dv = int(p.value_dim);
  const int ldk = ld_rows(dk), ldv = ld_rows(dv);
  float* ks = smem;
  float* vs = ks + kChunk * ldk;
  float* xs = vs + kChunk * ldv;    // -L, then A diag(beta G)
  float* as = xs + kChunk * kLdX;   // A, then A diag(beta)
  float* scratch = as + kChunk * kLdX;
  float* gcum = scratch + kDiagBlocks * 16 * kLdT;
  float* betas = gcum + kChunk;
  float* gexp = betas + kChunk;

  const int warp = tid / 32, lane = tid % 32;
  const Head hd(p, head);
  const size_t bt0 = size_t(hd.b) * p.steps + size_t(chunk) * kChunk;
  const size_t nc = size_t(hd.n) * p.chunks + chunk;
  stage(ks, ldk, k + (bt0 * p.key_heads + hd.hk) * dk, size_t(p.key_heads) * dk, kChunk, dk, tid);
  stage(vs, ldv, v + (bt0 * p.value_heads + hd.hv) * dv, size_t(p.value_heads) * dv, kChunk, dv, tid);
  if (warp == 0) {
    // Two tokens per lane; the cumsum of log g by a warp scan of the pairs.
    float lg[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 2 * lane + h;
      const size_t bt = bt0 + i;
      const bool keep = p.has_mask == 0 || mask[bt] != 0.0f;
      const size_t at = bt * p.value_heads + hd.hv;
      lg[h] = keep ? fmaxf(logf(g[at]), kLogFloor) : 0.0f;
      betas[i] = keep ? beta[at] : 0.0f;
    }
    float sum = lg[0] + lg[1];
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const float up = __shfl_up_sync(0xffffffffu, sum, off);
      if (lane >= off) sum += up;
    }
    const float before = sum - lg[1];
    gcum[2 * lane] = before;
    gcum[2 * lane + 1] = sum;
    gexp[2 * lane] = expf(before);
    gexp[2 * lane + 1] = expf(sum);
    float* gcum_row = gcum_out + size_t(hd.n) * p.chunks * kChunk + size_t(chunk) * kChunk;
    gcum_row[2 * lane] = before;
    gcum_row[2 * lane + 1] = sum;
  }
  __syncthreads();

  // K K^T, lower tiles.
  lower_product<InT>(xs, ks, ks, ldk, dk, warp);
  __syncthreads();
  // -L; the upper part of the diagonal tiles cleared.
  decay_mask<true>(xs, gcum, tid, [&](int i) { return -betas[i]; });
  __syncthreads();

  // A's diagonal blocks, (I + L_mm)^-1: warp m, lane c < 16 owns column c (forward substitution).
  if (warp < kDiagBlocks && lane < 16) {
    const int m = warp, c = lane;
    const float* l_rows = xs + 16 * m * kLdX + 16 * m;
    float* col = as + 16 * m * kLdX + 16 * m + c;
    for (int r = 0; r < 16; ++r) {
      float s = r == c ? 1.0f : 0.0f;
      for (int j = c; j < r; ++j) s += l_rows[r * kLdX + j] * col[j * kLdX];
      col[r * kLdX] = s;
    }
  }
  __syncthreads();
  // The blocks below: A[m][j] = A[m][m] (sum_{j <= l < m} -L[m][l] A[l][j]); column block j by
  // warp j, top to bottom.
  if (warp < 3) {
    const int j = warp;
    float* tmp = scratch + warp * 16 * kLdT;
    for (int m = j + 1; m < 4; ++m) {
      Acc acc;
      wmma::fill_fragment(acc, 0.0f);
      mma_f32<Row, Row, true, true>(acc, xs + 16 * m * kLdX + 16 * j, kLdX, as + 16 * j * kLdX + 16 * j, kLdX,
                                    16 * (m - j));
      wmma::store_matrix_sync(tmp, acc, kLdT, wmma::mem_row_major);
      __syncwarp();
      wmma::fill_fragment(acc, 0.0f);
      mma_f32<Row, Row, true, true>(acc, as + 16 * m * kLdX + 16 * m, kLdX, tmp, kLdT, 16);
      wmma::store_matrix_sync(as + 16 * m * kLdX + 16 * j, acc, kLdX, wmma::mem_row_major);
      __syncwarp();
    }
  }
  __syncthreads();
  // A diag(beta G) over -L, A diag(beta) in place; zero above the diagonal.
  for (int e = tid; e < kChunk * kChunk; e += kThreads) {
    const int i = e / kChunk, j = e % kChunk;
    const float a = j <= i ? as[i * kLdX + j] * betas[j] : 0.0f;
    as[i * kLdX + j] = a;
    xs[i * kLdX + j] = a * gexp[j];
  }
  __syncthreads();

  // w = A diag(beta G) K and u = A diag(beta) V: row block mi, column tile t (A lower: k < 16 (mi + 1)).
  const int key_tiles = dk / 16, tiles = key_tiles + dv / 16;
  for (int job = warp; job < 4 * tiles; job += kWarps) {
    const int mi = job / tiles, t = job % tiles;
    Acc acc;
    wmma::fill_fragment(acc, 0.0f);
    if (t < key_tiles) {
      mma_f32<Row, Row, true, kSplitIn<InT>>(acc, xs + 16 * mi * kLdX, kLdX, ks + 16 * t, ldk, 16 * (mi + 1));
      wmma::store_matrix_sync(w_out + (nc * kChunk + 16 * mi) * dk + 16 * t, acc, dk, wmma::mem_row_major);
    } else {
      const int tv = t - key_tiles;
      mma_f32<Row, Row, true, kSplitIn<InT>>(acc, as + 16 * mi * kLdX, kLdX, vs + 16 * tv, ldv, 16 * (mi + 1));
      wmma::store_matrix_sync(u_out + (nc * kChunk + 16 * mi) * dv + 16 * tv, acc, dv, wmma::mem_row_major);
    }
  }
}

// ---- Pass 2: per (value head, 32 value columns), chunks in sequence: h_c, v_new, the state --
// The h^T block [Dk x 32] lives in the warps' accumulator fragments from the first chunk to the
// last (warp w owns its 16x16 tiles w, w + 8, ...); per chunk it goes to shared memory once, as
// the operand of w h_c, and to h for pass 3. The next chunk's w, K, u and gates are copied
// asynchronously (cp.async) while this chunk computes, so the chain waits on the tensor cores,
// not on global memory.
constexpr int kMaxStateTiles = (256 / 16) * (kBlockV / 16) / kWarps;  // h tiles per warp at Dk = 256
static_assert(kWarps == (kChunk / 16) * (kBlockV / 16), "one v_new tile per warp");

// Where the state pass's shared memory parts lie (state_smem_floats).
template <typename InT>
struct StateSmem {
  static constexpr bool kWideIn = sizeof(InT) == 4;
  int buffers, ldk, dk;
  float *hs, *ws, *ks, *kraw, *vs, *us, *gcum;
  __device__ StateSmem(float* smem, int dk_) : buffers(state_buffers(dk_)), ldk(ld_rows(dk_)), dk(dk_) {
    hs = smem;
    ws = hs + dk * kLdV;
    ks = ws + buffers * kChunk * ldk;
    kraw = ks + (kWideIn ? buffers : 1) * kChunk * ldk;
    vs = ks + state_k_floats(dk, int(sizeof(InT)));
    us = vs + kChunk * kLdV;
    gcum = us + buffers * kChunk * kBlockV;
  }
  __device__ float* w(int b) const { return ws + b * kChunk * ldk; }
  // Where the copies of K land: f32 rows the products read, or raw 16-bit rows.
  __device__ InT* k_landing(int b) const {
    return kWideIn ? reinterpret_cast<InT*>(ks + b * kChunk * ldk) : reinterpret_cast<InT*>(kraw) + b * kChunk * dk;
  }
  __device__ int k_landing_ld() const { return kWideIn ? ldk : dk; }
  __device__ float* k_f32(int b) const { return kWideIn ? ks + b * kChunk * ldk : ks; }
  __device__ float* u(int b) const { return us + b * kChunk * kBlockV; }
  __device__ float* g(int b) const { return gcum + b * kChunk; }
};

// Issues the asynchronous copies of chunk c's w rows, K rows, u slab and gates into buffer b,
// as one batch (each thread waits for its own copies; a barrier then publishes them).
template <typename InT>
__device__ __forceinline__ void stage_state_chunk(const StateSmem<InT>& sm, const InT* __restrict__ k,
                                                  const float* __restrict__ gcum_in, const float* __restrict__ w_in,
                                                  const float* __restrict__ uv, const GdnChunkParams& p,
                                                  const Head& hd, unsigned col0, unsigned c, int b, bool k_aligned,
                                                  int tid) {
  const int dk = sm.dk, dv = int(p.value_dim);
  const size_t nc = size_t(hd.n) * p.chunks + c;
  const size_t bt0 = size_t(hd.b) * p.steps + size_t(c) * kChunk;
  const int w_vecs = dk / 4;
  const float* w_src = w_in + nc * kChunk * dk;
  float* w_dst = sm.w(b);
  for (RowWalk at(tid, kThreads, w_vecs); at.row < kChunk; at.next()) {
    __pipeline_memcpy_async(w_dst + at.row * sm.ldk + 4 * at.col, w_src + size_t(at.row) * dk + 4 * at.col, 16);
  }
  const InT* k_src = k + (bt0 * p.key_heads + hd.hk) * dk;
  const size_t k_pitch = size_t(p.key_heads) * dk;
  InT* k_dst = sm.k_landing(b);
  const int k_ld = sm.k_landing_ld();
  if (k_aligned) {
    constexpr int per = 16 / int(sizeof(InT));
    const int k_vecs = dk / per;
    for (RowWalk at(tid, kThreads, k_vecs); at.row < kChunk; at.next()) {
      __pipeline_memcpy_async(k_dst + at.row * k_ld + per * at.col, k_src + at.row * k_pitch + per * at.col, 16);
    }
  } else {
    // A K view that is not 16-byte aligned: plain loads (the barrier after the wait publishes them too).
    for (RowWalk at(tid, kThreads, dk); at.row < kChunk; at.next()) {
      k_dst[at.row * k_ld + at.col] = k_src[at.row * k_pitch + at.col];
    }
  }
  constexpr int u_vecs = kBlockV / 4;
  const float* u_src = uv + nc * kChunk * dv + col0;
  float* u_dst = sm.u(b);
  for (int e = tid; e < kChunk * u_vecs; e += kThreads) {
    const int i = e / u_vecs, at = 4 * (e % u_vecs);
    __pipeline_memcpy_async(u_dst + i * kBlockV + at, u_src + size_t(i) * dv + at, 16);
  }
  if (tid < kChunk / 4) __pipeline_memcpy_async(sm.g(b) + 4 * tid, gcum_in + nc * kChunk + 4 * tid, 16);
  __pipeline_commit();
}

template <typename InT, typename StT>
__device__ __forceinline__ void state_kernel(const InT* __restrict__ k, const float* __restrict__ gcum_in,
                             const float* __restrict__ w_in, float* __restrict__ uv, float* __restrict__ h_out,
                             StT* __restrict__ state, const GdnChunkParams p, const int tid, const unsigned block_col,
                             const unsigned head, float* smem) {
  const int dk = int(p.key_dim), dv = int(p.value_dim);
  const StateSmem<InT> sm(smem, dk);
  const int warp = tid / 32, lane = tid % 32;
  const Head hd(p, head);
  const unsigned col0 = block_col * kBlockV;
  const int h_tiles = (dk / 16) * (kBlockV / 16);
  const bool k_aligned = reinterpret_cast<uintptr_t>(k) % 16 == 0;
  const bool ahead = sm.buffers == 2;

  if (ahead) stage_state_chunk(sm, k, gcum_in, w_in, uv, p, hd, col0, 0, 0, k_aligned, tid);
  // hs[key][col] = state[b, hv, col0 + col, key], then into the fragments.
  StT* s_cols = state + (size_t(hd.n) * dv + col0) * dk;
  for (int e = tid; e < kBlockV * dk; e += kThreads) {
    const int col = e / dk, key = e % dk;  // consecutive threads read consecutive keys
    sm.hs[key * kLdV + col] = to_f32(s_cols[size_t(col) * dk + key]);
  }
  __syncthreads();
  Acc h[kMaxStateTiles];
#pragma unroll
  for (int s = 0; s < kMaxStateTiles; ++s) {
    const int t = warp + s * kWarps;
    if (t < h_tiles) wmma::load_matrix_sync(h[s], sm.hs + 16 * (t / 2) * kLdV + 16 * (t % 2), kLdV, wmma::mem_row_major);
  }

  // This warp's v_new tile.
  const int mi = warp / 2, cj = warp % 2;
  for (unsigned c = 0; c < p.chunks; ++c) {
    const int buf = ahead ? int(c & 1u) : 0;
    const size_t nc = size_t(hd.n) * p.chunks + c;
    if (!ahead) stage_state_chunk(sm, k, gcum_in, w_in, uv, p, hd, col0, c, 0, k_aligned, tid);
    __pipeline_wait_prior(0);
    __syncthreads();  // chunk c's copies are in; every thread is done with chunk c - 1
    if (ahead && c + 1 < p.chunks) {
      stage_state_chunk(sm, k, gcum_in, w_in, uv, p, hd, col0, c + 1, buf ^ 1, k_aligned, tid);
    }
    if constexpr (!StateSmem<InT>::kWideIn) {
      const InT* raw = sm.k_landing(buf);
      // Eight elements (16 bytes) per step.
      for (RowWalk at(tid, kThreads, dk / 8); at.row < kChunk; at.next()) {
        const InT* from = raw + at.row * dk + 8 * at.col;
        float* to = sm.ks + at.row * sm.ldk + 8 * at.col;
#pragma unroll
        for (int j = 0; j < 8; ++j) to[j] = to_f32(from[j]);
      }
    }
    // h_c: for pass 3, and as the operand of w h_c.
    float* h_c = h_out + nc * dk * dv + col0;
#pragma unroll
    for (int s = 0; s < kMaxStateTiles; ++s) {
      const int t = warp + s * kWarps;
      if (t < h_tiles) {
        const int ki = t / 2, cc = t % 2;
        wmma::store_matrix_sync(sm.hs + 16 * ki * kLdV + 16 * cc, h[s], kLdV, wmma::mem_row_major);
        wmma::store_matrix_sync(h_c + size_t(16 * ki) * dv + 16 * cc, h[s], dv, wmma::mem_row_major);
      }
    }
    __syncthreads();

    // v_new = u - w h_c, stored over u for pass 3 and, decayed to the chunk's end, for the update.
    const float* gc = sm.g(buf);
    const float g_last = gc[kChunk - 1];
    {
      Acc wh, vn;
      wmma::fill_fragment(wh, 0.0f);
      mma_f32<Row, Row, true, true>(wh, sm.w(buf) + 16 * mi * sm.ldk, sm.ldk, sm.hs + 16 * cj, kLdV, dk);
      wmma::load_matrix_sync(vn, sm.u(buf) + 16 * mi * kBlockV + 16 * cj, kBlockV, wmma::mem_row_major);
#pragma unroll
      for (int i = 0; i < vn.num_elements; ++i) vn.x[i] -= wh.x[i];
      wmma::store_matrix_sync(uv + (nc * kChunk + 16 * mi) * dv + col0 + 16 * cj, vn, dv, wmma::mem_row_major);
      float* tile = sm.vs + 16 * mi * kLdV + 16 * cj;
      wmma::store_matrix_sync(tile, vn, kLdV, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 16 * 16; e += 32) {
        const int r = e / 16;
        tile[r * kLdV + e % 16] *= expf(g_last - gc[16 * mi + r]);
      }
    }
    __syncthreads();

    // h = G_64 h + K^T v_new (rows already decayed).
    const float chunk_decay = expf(g_last);
    const float* ks = sm.k_f32(buf);
#pragma unroll
    for (int s = 0; s < kMaxStateTiles; ++s) {
      const int t = warp + s * kWarps;
      if (t < h_tiles) {
        const int ki = t / 2, cc = t % 2;
#pragma unroll
        for (int i = 0; i < h[s].num_elements; ++i) h[s].x[i] *= chunk_decay;
        // A = K^T [Dk x 64]: element (key, token) at ks[token * ldk + key], col-major.
        mma_f32<Col, Row, kSplitIn<InT>, true>(h[s], ks + 16 * ki, sm.ldk, sm.vs + 16 * cc, kLdV, kChunk);
      }
    }
    // One buffer: the next chunk's copies land where this one's are still read.
    if (!ahead) __syncthreads();
  }

  // The only rounding of the state in the call.
#pragma unroll
  for (int s = 0; s < kMaxStateTiles; ++s) {
    const int t = warp + s * kWarps;
    if (t < h_tiles) wmma::store_matrix_sync(sm.hs + 16 * (t / 2) * kLdV + 16 * (t % 2), h[s], kLdV, wmma::mem_row_major);
  }
  __syncthreads();
  for (int e = tid; e < kBlockV * dk; e += kThreads) {
    const int col = e / dk, key = e % dk;
    s_cols[size_t(col) * dk + key] = from_f32<StT>(sm.hs[key * kLdV + col]);
  }
}

// ---- Pass 3: per (chunk, value head), all in parallel: y -----------------------------------
constexpr int kOutSlabH = 128 * kBlockV / kThreads;     // h slab elements per thread held ahead (Dk <= 128)
constexpr int kOutSlabV = kChunk * kBlockV / kThreads;  // v_new slab elements per thread
static_assert(kOutSlabV * kThreads == kChunk * kBlockV, "whole v_new slabs");

// This thread's part of the h_c [Dk][32] slab at column col0 (up to key 128), into registers.
__device__ __forceinline__ void load_slab(float (&h_next)[kOutSlabH], const float* __restrict__ h_c, int dk, int dv,
                                          int col0, int tid) {
#pragma unroll
  for (int j = 0; j < kOutSlabH; ++j) {
    const int e = tid + j * kThreads;
    if (e < dk * kBlockV) h_next[j] = h_c[(e / kBlockV) * dv + col0 + e % kBlockV];  // < 2^16: int
  }
}

// The registers of load_slab into the shared slabs (rows of kLdV); the v_new slab and h rows
// past key 128 are loaded here (more registers held ahead would spill: the pass keeps two
// blocks per SM at 128 registers).
__device__ __forceinline__ void store_slab(float* hsl, float* vsl, const float (&h_next)[kOutSlabH],
                                           const float* __restrict__ h_c, const float* __restrict__ v_c, int dk,
                                           int dv, int col0, int tid) {
#pragma unroll
  for (int j = 0; j < kOutSlabH; ++j) {
    const int e = tid + j * kThreads;
    if (e < dk * kBlockV) hsl[(e / kBlockV) * kLdV + e % kBlockV] = h_next[j];
  }
  for (int e = tid + kOutSlabH * kThreads; e < dk * kBlockV; e += kThreads) {
    hsl[(e / kBlockV) * kLdV + e % kBlockV] = h_c[size_t(e / kBlockV) * dv + col0 + e % kBlockV];
  }
#pragma unroll
  for (int j = 0; j < kOutSlabV; ++j) {
    const int e = tid + j * kThreads;
    vsl[(e / kBlockV) * kLdV + e % kBlockV] = v_c[(e / kBlockV) * dv + col0 + e % kBlockV];
  }
}
template <typename InT>
__device__ __forceinline__ void out_kernel(const InT* __restrict__ q, const InT* __restrict__ k, const float* __restrict__ gcum_in,
                           const float* __restrict__ h_in, const float* __restrict__ v_new,
                           const float* __restrict__ mask, InT* __restrict__ y, const GdnChunkParams p, const int tid,
                           const unsigned chunk, const unsigned head, float* smem) {
  const int dk = int(p.key_dim), dv = int(p.value_dim);
  const int ldk = ld_rows(dk);
  float* qs = smem;
  float* ks = qs + kChunk * ldk;  // then the slabs:
  float* hsl = ks;                // h_c [Dk][40]
  float* vsl = hsl + dk * kLdV;   // v_new [64][40]
  float* xs = ks + out_slab_floats(dk);
  float* os = xs + kChunk * kLdX;
  float* gcum = os + kChunk * kLdV;
  float* keeps = gcum + kChunk;

  const int warp = tid / 32, lane = tid % 32;
  const Head hd(p, head);
  const size_t bt0 = size_t(hd.b) * p.steps + size_t(chunk) * kChunk;
  const size_t nc = size_t(hd.n) * p.chunks + chunk;
  const size_t qk_pitch = size_t(p.key_heads) * dk;
  stage(qs, ldk, q + (bt0 * p.key_heads + hd.hk) * dk, qk_pitch, kChunk, dk, tid);
  stage(ks, ldk, k + (bt0 * p.key_heads + hd.hk) * dk, qk_pitch, kChunk, dk, tid);
  if (tid < kChunk) {
    gcum[tid] = gcum_in[nc * kChunk + tid];
    keeps[tid] = p.has_mask == 0 || mask[bt0 + tid] != 0.0f ? 1.0f : 0.0f;
  }
  // The h_c slabs of 32 value columns (16 KB, twice v_new's) go through registers: the next
  // slab's loads are in flight while the tensor cores work on this one (and the first one's
  // while P is formed).
  const float* h_c = h_in + nc * dk * dv;
  const float* v_c = v_new + nc * kChunk * dv;
  float h_next[kOutSlabH];
  load_slab(h_next, h_c, dk, dv, 0, tid);
  __syncthreads();

  // P = Q K^T (.) G_i/G_j, j <= i.
  lower_product<InT>(xs, qs, ks, ldk, dk, warp);
  __syncthreads();
  decay_mask<false>(xs, gcum, tid, [](int) { return 1.0f; });
  // K is not read again: its room takes the slabs.
  __syncthreads();

  for (int col0 = 0; col0 < dv; col0 += kBlockV) {
    store_slab(hsl, vsl, h_next, h_c, v_c, dk, dv, col0, tid);
    __syncthreads();
    if (col0 + kBlockV < dv) load_slab(h_next, h_c, dk, dv, col0 + kBlockV, tid);
    // y = G (.) (Q h_c) + P v_new: 8 tiles, each warp scaling its own rows.
    for (int job = warp; job < 8; job += kWarps) {
      const int mi = job / 2, cj = job % 2;
      float* tile = os + 16 * mi * kLdV + 16 * cj;
      Acc acc;
      wmma::fill_fragment(acc, 0.0f);
      mma_f32<Row, Row, kSplitIn<InT>, true>(acc, qs + 16 * mi * ldk, ldk, hsl + 16 * cj, kLdV, dk);
      wmma::store_matrix_sync(tile, acc, kLdV, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 16 * 16; e += 32) {
        const int r = e / 16;
        tile[r * kLdV + e % 16] *= expf(gcum[16 * mi + r]);
      }
      __syncwarp();
      wmma::load_matrix_sync(acc, tile, kLdV, wmma::mem_row_major);
      mma_f32<Row, Row, true, true>(acc, xs + 16 * mi * kLdX, kLdX, vsl + 16 * cj, kLdV, 16 * (mi + 1));
      wmma::store_matrix_sync(tile, acc, kLdV, wmma::mem_row_major);
    }
    __syncthreads();
    const size_t v_pitch = size_t(p.value_heads) * dv;
    for (int e = tid; e < kChunk * kBlockV; e += kThreads) {
      const int i = e / kBlockV, col = e % kBlockV;
      const size_t at = (bt0 + i) * v_pitch + size_t(hd.hv) * dv + col0 + col;
      y[at] = keeps[i] != 0.0f ? from_f32<InT>(os[i * kLdV + col]) : from_f32<InT>(0.0f);
    }
    // The next store_slab writes only what this slab's products have read (the barrier above),
    // and the next products write os only after the barrier that follows it.
  }
}

}  // namespace gdn_chunk

#define GDN_CHUNK_PREP_ENTRY(name, InT)                                                                          \
  extern "C" __global__ void __launch_bounds__(gdn_chunk::kThreads)                                              \
      name(const InT* k, const InT* v, const float* g, const float* beta, const float* mask, float* gcum,       \
           float* w, float* u, const GdnChunkParams p) {                                                         \
    extern __shared__ __align__(128) float gdn_chunk_smem[];                                                     \
    gdn_chunk::prep_kernel<InT>(k, v, g, beta, mask, gcum, w, u, p, threadIdx.x, blockIdx.x, blockIdx.y,        \
                                gdn_chunk_smem);                                                                 \
  }

#define GDN_CHUNK_STATE_ENTRY(name, InT, StT)                                                                    \
  extern "C" __global__ void __launch_bounds__(gdn_chunk::kThreads)                                              \
      name(const InT* k, const float* gcum, const float* w, float* u, float* h, StT* state,                      \
           const GdnChunkParams p) {                                                                             \
    extern __shared__ __align__(128) float gdn_chunk_smem[];                                                     \
    gdn_chunk::state_kernel<InT, StT>(k, gcum, w, u, h, state, p, threadIdx.x, blockIdx.x, blockIdx.y,          \
                                      gdn_chunk_smem);                                                           \
  }

#define GDN_CHUNK_OUT_ENTRY(name, InT)                                                                           \
  extern "C" __global__ void __launch_bounds__(gdn_chunk::kThreads, 2)                                           \
      name(const InT* q, const InT* k, const float* gcum, const float* h, const float* v_new, const float* mask, \
           InT* y, const GdnChunkParams p) {                                                                     \
    extern __shared__ __align__(128) float gdn_chunk_smem[];                                                     \
    gdn_chunk::out_kernel<InT>(q, k, gcum, h, v_new, mask, y, p, threadIdx.x, blockIdx.x, blockIdx.y,           \
                               gdn_chunk_smem);                                                                  \
  }

GDN_CHUNK_PREP_ENTRY(gated_delta_chunk_prep_f32, float)
GDN_CHUNK_PREP_ENTRY(gated_delta_chunk_prep_f16, __half)
GDN_CHUNK_PREP_ENTRY(gated_delta_chunk_prep_bf16, __nv_bfloat16)
GDN_CHUNK_STATE_ENTRY(gated_delta_chunk_state_f32_f32, float, float)
GDN_CHUNK_STATE_ENTRY(gated_delta_chunk_state_f32_bf16, float, __nv_bfloat16)
GDN_CHUNK_STATE_ENTRY(gated_delta_chunk_state_f16_f32, __half, float)
GDN_CHUNK_STATE_ENTRY(gated_delta_chunk_state_f16_bf16, __half, __nv_bfloat16)
GDN_CHUNK_STATE_ENTRY(gated_delta_chunk_state_bf16_f32, __nv_bfloat16, float)
GDN_CHUNK_STATE_ENTRY(gated_delta_chunk_state_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
GDN_CHUNK_OUT_ENTRY(gated_delta_chunk_out_f32, float)
GDN_CHUNK_OUT_ENTRY(gated_delta_chunk_out_f16, __half)
GDN_CHUNK_OUT_ENTRY(gated_delta_chunk_out_bf16, __nv_bfloat16)
