// Chunked gated-delta rule (Gated DeltaNet prefill) on tensor cores: the CUDA twin of
// kernels/gated_delta_chunk.metal (read its header for the maths), 64 tokens per chunk as
// matrix products; the token-by-token kernels/gated_delta.cu is the reference it must match.
//
// Per chunk, G_i = exp(gcum_i) with gcum the in-chunk cumsum of log g (only exp of
// differences gcum_i - gcum_j, j <= i, or of gcum_i itself: never a positive exponent):
//   -L[i,j] = -beta_i (k_i.k_j) G_i/G_j, j < i;   R = beta (V - G K S0^T)
//   V' = (I + L)^-1 R;   y = G Q S0^T + (Q K^T (.) G_i/G_j, j <= i) V'
//   S^T <- G_C S0^T + K^T (V' (.) G_C/G_j)
//
// ENTRY POINTS (extern "C"): gated_delta_chunk_<in>_<st>, <in> in {f32, f16, bf16} (InT of q,
// k, v, y), <st> in {f32, bf16} (StT of the state).
// SIGNATURE: (const InT* q [B,T,Hk,Dk], const InT* k [B,T,Hk,Dk], const InT* v [B,T,Hv,Dv],
//             const float* g [B,T,Hv] (decay in (0,1], not log), const float* beta [B,T,Hv],
//             StT* state [B,Hv,Dv,Dk] (in place), InT* y [B,T,Hv,Dv] (the chunks' tokens only),
//             const float* mask [B,T] (read only if has_mask), GdnChunkParams p (by value,
//             kernels/params/gated_delta_chunk.h)).
// LAUNCH: grid (Dv / 32, B * Hv, 1), block (128, 1, 1), dynamic shared memory
//   gdn_chunk_smem_floats(Dk) * 4 bytes (about 119 KB at Dk = 128: the host raises the
//   function's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first).
// HOST MUST CHECK: Dk % 16 == 0, 16 <= Dk <= 256, Dv % 32 == 0, Hv % Hk == 0,
//   chunks * 64 <= T, B * Hv <= 65535. The tail (T % 64 tokens) runs through the recurrence.
//
// DESIGN: a block owns one value head (b, hv) and 32 value columns through every chunk. The
// state block S^T [Dk, 32] stays in shared memory in f32 from the first chunk to the last (one
// read and one write of StT per call: a bf16 state is rounded once). Each chunk stages K and Q
// (64 x Dk) in f32, and every product runs on wmma m16n16k8 TF32 tensor cores with f32
// accumulation; an f32 operand is split (a = a_hi + a_lo in TF32, a*b ~ a_hi*b_hi + a_hi*b_lo
// + a_lo*b_hi) so that results keep f32 accuracy (1e-6 relative rather than TF32's 1e-3):
// the state, L, P and V' are f32 quantities whatever InT is, while f16/bf16 K and Q tiles are
// exact in TF32 and go in unsplit (2 products per step instead of 3, or 1 for K K^T, Q K^T). The triangular solve runs by 16-row
// blocks: a tensor-core product with the solved blocks above, then a 16-step substitution in
// the block, one thread per column.
//
// Compile for candle: nvcc -ptx -arch=sm_90 -O3 kernels/gated_delta_chunk.cu (sm_80+: TF32 wmma).
// The body (gdn_chunk::chunk_kernel) takes its thread and block indices and its shared memory as
// arguments, so that kernels/emu/gated_delta_chunk_cuda_harness.cpp can run it on the CPU
// (crates/gdn-ops/tests/gated_delta_chunk_cuda_emulation.rs).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <stdint.h>

#include <type_traits>

#include "params/gated_delta_chunk.h"

namespace gdn_chunk {

using namespace nvcuda;

constexpr int kChunk = 64;
constexpr int kBlockV = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;  // floats of padding per row: keeps 32-byte tile alignment, spreads banks
constexpr int kLdV = kBlockV + kPad;  // R / V', y staging and S^T rows
constexpr int kLdX = kChunk + kPad;   // -L, then the masked Q K^T
constexpr float kLogFloor = -80.0f;   // log g floor: g = 0 keeps a finite cumsum

__host__ __device__ constexpr int ld_k(int dk) { return dk + kPad; }

// Shared memory map, in floats.
struct Layout {
  int dk;
  __device__ int k() const { return 0; }                               // [64][ld_k]
  __device__ int q() const { return k() + kChunk * ld_k(dk); }        // [64][ld_k]
  __device__ int s() const { return q() + kChunk * ld_k(dk); }        // [Dk][kLdV]  S^T
  __device__ int v() const { return s() + dk * kLdV; }                // [64][kLdV]  R, V'
  __device__ int o() const { return v() + kChunk * kLdV; }            // [64][kLdV]  y
  __device__ int x() const { return o() + kChunk * kLdV; }            // [64][kLdX]
  __device__ int gates() const { return x() + kChunk * kLdX; }        // gcum, beta, keep
  __device__ int total() const { return gates() + 3 * kChunk; }
};

template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;
template <typename Layout_>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, Layout_>;
template <typename Layout_>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, Layout_>;

// x = hi + lo, both TF32: the three-product split keeps about 21 bits of each operand.
template <typename Frag>
__device__ __forceinline__ void split(Frag& hi, Frag& lo) {
#pragma unroll
  for (int i = 0; i < hi.num_elements; ++i) {
    const float x = hi.x[i];
    const float h = wmma::__float_to_tf32(x);
    hi.x[i] = h;
    lo.x[i] = wmma::__float_to_tf32(x - h);
  }
}

// acc += A[16 x kdim] * B[kdim x 16] from shared memory, in f32 accuracy: an operand that is
// not exact in TF32 (SplitA / SplitB) is split into hi + lo and the products hi*hi, hi*lo and
// lo*hi summed; one that is exact (f16 or bf16 activations widened to f32) is used as is.
// A at a (leading dimension lda) in layout LA, B at b (ldb) in layout LB; for row_major the
// element (r, c) is at p[r * ld + c], for col_major at p[c * ld + r].
template <typename LA, typename LB, bool SplitA, bool SplitB>
__device__ __forceinline__ void mma_f32(Acc& acc, const float* a, int lda, const float* b, int ldb, int kdim) {
  for (int kk = 0; kk < kdim; kk += 8) {
    FragA<LA> a_hi, a_lo;
    FragB<LB> b_hi, b_lo;
    const float* a_at = std::is_same<LA, wmma::row_major>::value ? a + kk : a + kk * lda;
    const float* b_at = std::is_same<LB, wmma::row_major>::value ? b + kk * ldb : b + kk;
    wmma::load_matrix_sync(a_hi, a_at, lda);
    wmma::load_matrix_sync(b_hi, b_at, ldb);
    if (SplitA) split(a_hi, a_lo);
    if (SplitB) split(b_hi, b_lo);
    if (SplitA) wmma::mma_sync(acc, a_lo, b_hi, acc);
    if (SplitB) wmma::mma_sync(acc, a_hi, b_lo, acc);
    wmma::mma_sync(acc, a_hi, b_hi, acc);
  }
}

// Lower 16x16 tiles (mi, mj), mj <= mi, of a 64x64 product: 10 of them.
__device__ __forceinline__ void lower_tile(int t, int& mi, int& mj) {
  mi = 0;
  while ((mi + 1) * (mi + 2) / 2 <= t) ++mi;
  mj = t - mi * (mi + 1) / 2;
}

template <typename InT, typename StT>
__device__ void chunk_kernel(const InT* __restrict__ q, const InT* __restrict__ k, const InT* __restrict__ v,
                             const float* __restrict__ g, const float* __restrict__ beta, StT* __restrict__ state,
                             InT* __restrict__ y, const float* __restrict__ mask, const GdnChunkParams p,
                             const int tid, const unsigned block_col, const unsigned block_head, float* smem) {
  const int dk = int(p.key_dim);
  const Layout lay{dk};
  float* ks = smem + lay.k();
  float* qs = smem + lay.q();
  float* ss = smem + lay.s();
  float* vs = smem + lay.v();
  float* os = smem + lay.o();
  float* xs = smem + lay.x();
  float* gcum = smem + lay.gates();
  float* betas = gcum + kChunk;
  float* keeps = betas + kChunk;
  const int ldk = ld_k(dk);

  const int warp = tid / 32;
  const int lane = tid % 32;
  const unsigned n = block_head;  // b * Hv + hv
  const unsigned b = n / p.value_heads;
  const unsigned hv = n % p.value_heads;
  const unsigned hk = hv / (p.value_heads / p.key_heads);
  const unsigned col0 = block_col * kBlockV;
  const size_t qk_pitch = size_t(p.key_heads) * dk;
  const size_t v_pitch = size_t(p.value_heads) * p.value_dim;
  const int key_tiles = dk / 16;
  // f16 and bf16 values are exact in TF32 (10-bit mantissa, 8-bit exponent): K and Q tiles of
  // such activations need no split; f32 ones, and every f32 intermediate (S, L, P, V'), do.
  constexpr bool kSplitIn = std::is_same<InT, float>::value;

  // S^T[key][col] = state[b, hv, col0 + col, key].
  StT* s_cols = state + (size_t(n) * p.value_dim + col0) * dk;
  for (int e = tid; e < kBlockV * dk; e += kThreads) {
    const int col = e / dk, key = e % dk;  // consecutive threads read consecutive keys
    ss[key * kLdV + col] = to_f32(s_cols[size_t(col) * dk + key]);
  }

  for (unsigned c = 0; c < p.chunks; ++c) {
    const size_t bt0 = size_t(b) * p.steps + size_t(c) * kChunk;
    const InT* k_chunk = k + (bt0 * p.key_heads + hk) * dk;
    const InT* q_chunk = q + (bt0 * p.key_heads + hk) * dk;
    for (int e = tid; e < kChunk * dk; e += kThreads) {
      const int i = e / dk, key = e % dk;
      ks[i * ldk + key] = to_f32(k_chunk[i * qk_pitch + key]);
      qs[i * ldk + key] = to_f32(q_chunk[i * qk_pitch + key]);
    }
    if (warp == 0) {
      // Two tokens per lane; the cumsum of log g by a warp scan of the pairs.
      float lg[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 2 * lane + h;
        const size_t bt = bt0 + i;
        const bool keep = p.has_mask == 0 || mask[bt] != 0.0f;
        const size_t at = bt * p.value_heads + hv;
        lg[h] = keep ? fmaxf(logf(g[at]), kLogFloor) : 0.0f;
        betas[i] = keep ? beta[at] : 0.0f;
        keeps[i] = keep ? 1.0f : 0.0f;
      }
      float sum = lg[0] + lg[1];
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const float up = __shfl_up_sync(0xffffffffu, sum, off);
        if (lane >= off) sum += up;
      }
      gcum[2 * lane + 1] = sum;
      gcum[2 * lane] = sum - lg[1];
    }
    __syncthreads();

    // K K^T (lower tiles) into xs; K S0^T into vs.
    for (int job = warp; job < 10 + 8; job += kWarps) {
      Acc acc;
      wmma::fill_fragment(acc, 0.0f);
      if (job < 10) {
        int mi, mj;
        lower_tile(job, mi, mj);
        mma_f32<wmma::row_major, wmma::col_major, kSplitIn, kSplitIn>(acc, ks + 16 * mi * ldk, ldk, ks + 16 * mj * ldk,
                                                                      ldk, dk);
        wmma::store_matrix_sync(xs + 16 * mi * kLdX + 16 * mj, acc, kLdX, wmma::mem_row_major);
      } else {
        const int mi = (job - 10) / 2, cj = (job - 10) % 2;
        mma_f32<wmma::row_major, wmma::row_major, kSplitIn, true>(acc, ks + 16 * mi * ldk, ldk, ss + 16 * cj, kLdV, dk);
        wmma::store_matrix_sync(vs + 16 * mi * kLdV + 16 * cj, acc, kLdV, wmma::mem_row_major);
      }
    }
    __syncthreads();
    for (int e = tid; e < kChunk * kChunk; e += kThreads) {
      const int i = e / kChunk, j = e % kChunk;
      if (j < i) xs[i * kLdX + j] *= -betas[i] * expf(gcum[i] - gcum[j]);
    }
    for (int e = tid; e < kChunk * kBlockV; e += kThreads) {
      const int i = e / kBlockV, col = e % kBlockV;
      const float vi = to_f32(v[(bt0 + i) * v_pitch + size_t(hv) * p.value_dim + col0 + col]);
      vs[i * kLdV + col] = betas[i] * (vi - expf(gcum[i]) * vs[i * kLdV + col]);
    }
    __syncthreads();

    // V' = (I + L)^-1 R: warp cj owns columns 16cj..16cj+15 (columns never mix).
    if (warp < kBlockV / 16) {
      const int cj = warp;
      for (int m = 0; m < kChunk / 16; ++m) {
        float* tile = vs + 16 * m * kLdV + 16 * cj;
        if (m > 0) {
          Acc acc;
          wmma::load_matrix_sync(acc, tile, kLdV, wmma::mem_row_major);
          // -L[m, 0..m) times the solved rows above.
          mma_f32<wmma::row_major, wmma::row_major, true, true>(acc, xs + 16 * m * kLdX, kLdX, vs + 16 * cj, kLdV, 16 * m);
          wmma::store_matrix_sync(tile, acc, kLdV, wmma::mem_row_major);
          __syncwarp();
        }
        if (lane < 16) {
          float* col = tile + lane;
          const float* l_rows = xs + 16 * m * kLdX + 16 * m;
          for (int r = 1; r < 16; ++r) {
            float s = col[r * kLdV];
            for (int j = 0; j < r; ++j) s += l_rows[r * kLdX + j] * col[j * kLdV];
            col[r * kLdV] = s;
          }
        }
        __syncwarp();
      }
    }
    __syncthreads();

    // Q K^T (lower tiles) into xs; Q S0^T into os.
    for (int job = warp; job < 10 + 8; job += kWarps) {
      Acc acc;
      wmma::fill_fragment(acc, 0.0f);
      if (job < 10) {
        int mi, mj;
        lower_tile(job, mi, mj);
        mma_f32<wmma::row_major, wmma::col_major, kSplitIn, kSplitIn>(acc, qs + 16 * mi * ldk, ldk, ks + 16 * mj * ldk,
                                                                      ldk, dk);
        wmma::store_matrix_sync(xs + 16 * mi * kLdX + 16 * mj, acc, kLdX, wmma::mem_row_major);
      } else {
        const int mi = (job - 10) / 2, cj = (job - 10) % 2;
        mma_f32<wmma::row_major, wmma::row_major, kSplitIn, true>(acc, qs + 16 * mi * ldk, ldk, ss + 16 * cj, kLdV, dk);
        wmma::store_matrix_sync(os + 16 * mi * kLdV + 16 * cj, acc, kLdV, wmma::mem_row_major);
      }
    }
    __syncthreads();
    for (int e = tid; e < kChunk * kChunk; e += kThreads) {
      const int i = e / kChunk, j = e % kChunk;
      if (j <= i) {
        xs[i * kLdX + j] *= expf(gcum[i] - gcum[j]);
      } else if (j / 16 == i / 16) {
        xs[i * kLdX + j] = 0.0f;
      }
    }
    for (int e = tid; e < kChunk * kBlockV; e += kThreads) {
      const int i = e / kBlockV;
      os[i * kLdV + e % kBlockV] *= expf(gcum[i]);
    }
    __syncthreads();

    // y = G Q S0^T + P V': 8 output tiles.
    for (int job = warp; job < 8; job += kWarps) {
      const int mi = job / 2, cj = job % 2;
      float* tile = os + 16 * mi * kLdV + 16 * cj;
      Acc acc;
      wmma::load_matrix_sync(acc, tile, kLdV, wmma::mem_row_major);
      mma_f32<wmma::row_major, wmma::row_major, true, true>(acc, xs + 16 * mi * kLdX, kLdX, vs + 16 * cj, kLdV,
                                                           16 * (mi + 1));
      wmma::store_matrix_sync(tile, acc, kLdV, wmma::mem_row_major);
    }
    __syncthreads();

    const float g_last = gcum[kChunk - 1];
    const float chunk_decay = expf(g_last);
    for (int e = tid; e < kChunk * kBlockV; e += kThreads) {
      const int i = e / kBlockV, col = e % kBlockV;
      const size_t at = (bt0 + i) * v_pitch + size_t(hv) * p.value_dim + col0 + col;
      y[at] = keeps[i] != 0.0f ? from_f32<InT>(os[i * kLdV + col]) : from_f32<InT>(0.0f);
      vs[i * kLdV + col] *= expf(g_last - gcum[i]);
    }
    for (int e = tid; e < dk * kBlockV; e += kThreads) {
      ss[(e / kBlockV) * kLdV + e % kBlockV] *= chunk_decay;
    }
    __syncthreads();

    // S^T += K^T V' (rows of V' already scaled by G_C / G_j).
    for (int job = warp; job < key_tiles * 2; job += kWarps) {
      const int ki = job / 2, cj = job % 2;
      float* tile = ss + 16 * ki * kLdV + 16 * cj;
      Acc acc;
      wmma::load_matrix_sync(acc, tile, kLdV, wmma::mem_row_major);
      // A = K^T [Dk x 64]: element (key, token) at ks[token * ldk + key], col-major.
      mma_f32<wmma::col_major, wmma::row_major, kSplitIn, true>(acc, ks + 16 * ki, ldk, vs + 16 * cj, kLdV, kChunk);
      wmma::store_matrix_sync(tile, acc, kLdV, wmma::mem_row_major);
    }
    __syncthreads();
  }

  // The only rounding of the state in the call.
  for (int e = tid; e < kBlockV * dk; e += kThreads) {
    const int col = e / dk, key = e % dk;
    s_cols[size_t(col) * dk + key] = from_f32<StT>(ss[key * kLdV + col]);
  }
}

}  // namespace gdn_chunk

// The floats of dynamic shared memory a launch needs (the host mirrors it).
__host__ __device__ constexpr int gdn_chunk_smem_floats(int dk) {
  return 2 * gdn_chunk::kChunk * gdn_chunk::ld_k(dk) + dk * gdn_chunk::kLdV + 2 * gdn_chunk::kChunk * gdn_chunk::kLdV +
         gdn_chunk::kChunk * gdn_chunk::kLdX + 3 * gdn_chunk::kChunk;
}

#define GDN_CHUNK_ENTRY(name, InT, StT)                                                                          \
  extern "C" __global__ void __launch_bounds__(gdn_chunk::kThreads)                                              \
      name(const InT* q, const InT* k, const InT* v, const float* g, const float* beta, StT* state, InT* y,     \
           const float* mask, const GdnChunkParams p) {                                                          \
    extern __shared__ __align__(128) float gdn_chunk_smem[];                                                     \
    gdn_chunk::chunk_kernel<InT, StT>(q, k, v, g, beta, state, y, mask, p, threadIdx.x, blockIdx.x, blockIdx.y,  \
                                      gdn_chunk_smem);                                                           \
  }

GDN_CHUNK_ENTRY(gated_delta_chunk_f32_f32, float, float)
GDN_CHUNK_ENTRY(gated_delta_chunk_f32_bf16, float, __nv_bfloat16)
GDN_CHUNK_ENTRY(gated_delta_chunk_f16_f32, __half, float)
GDN_CHUNK_ENTRY(gated_delta_chunk_f16_bf16, __half, __nv_bfloat16)
GDN_CHUNK_ENTRY(gated_delta_chunk_bf16_f32, __nv_bfloat16, float)
GDN_CHUNK_ENTRY(gated_delta_chunk_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
