// Streamed decode products for 4- and 8-bit MLX affine matrices on CUDA: the same sums as the
// wide kernels of kernels/affine.cu (`affine_wide_*`), bit for bit, with fewer instructions
// per weight and the weights' loads of the next steps in flight while a step is computed.
//
// Why. The wide kernel runs its grid in about one wave: every warp issues its loads, waits,
// then unpacks ~5 instructions per 4-bit value while nothing else is asked of the memory, so
// a 14 MB projection took ~12 µs against a ~3.5 µs copy floor on the H200 (ncu, issue 25).
// Here:
// - x is read once per block into shared memory as f32, each value pre-multiplied by the
//   power of two that undoes where its weight sits in the packed word, so that a weight is
//   unpacked in place: (word & mask) | 0x4B000000 is the float 2^23 + q * 2^(BITS m), the
//   subtraction of 2^23 leaves q * 2^(BITS m) exactly, and its product with x * 2^-(BITS m)
//   is exactly q * x: one LOP3, one FADD and one FFMA a value (one shift a word for its high
//   half), where the wide kernel spends a shift more and converts x per row group.
//   The shared layout is [values / 4][chunks] float4s: the lanes of a warp read consecutive
//   chunks' float4s, without bank conflicts. Each chunk's sum of x (for the biases) is summed
//   in the wide kernel's order.
// - A warp walks its row groups one after another (grid-stride: the host launches the blocks
//   the SMs hold at once), and the next row group's loads (a lane's S chunks of each of its
//   rows, with their scales and biases: a `Round`) are in flight while the current one is
//   summed.
// The lane -> chunk assignment, the per-chunk order of the sums and the shuffle reduction are
// the wide kernel's: the results are the same bits (the GPU harness checks that).
//
// ENTRY POINTS (extern "C"; <x>, <s> in {f32, f16, bf16}):
//   affine_stream_<kind>_b<BITS>_r<ROWS>_s<S>_<x>_<s>(packed, scales, biases, x, ids, y, p,
//                                                     experts, lpr)
//     The arguments and results of affine_wide_<kind>_b<BITS>_r<ROWS>_<x>_<s>; S (1, 2 or 4)
//     at least the chunks a lane takes of a row, ceil(cols / V / lpr).
//     block = kStreamWarps * 32 threads, dynamic shared memory = 4 * (cols + cols / V) bytes
//     (V = 128 / BITS values a chunk); grid = (any count >= 1, out_rows): block x takes the
//     row groups block x, block x + gridDim.x, ... of kStreamWarps * 32 / lpr each.
//     The host checks what it checks for the wide kernel, at most 4 chunks a lane, and groups
//     of a power-of-two count of chunks (crates/gdn-ops/src/ops/affine/stream.rs).
//   affine_stream_rows_b<BITS>_t<T>_s<S>_<x>_<s>(packed, scales, biases, x, y, p, lpr)  [module
//       affine_stream_rows.cu: opt-in (QWEN_GDN_DENSE_ROWS=one-pass), and 162 of the 324
//       entries, so a process that never runs them never JIT-compiles them]
//     Dense products of M = p.out_rows (2..8, at most T: 2, 4 or 8) activation rows,
//     x [M, cols] and y [M, rows]
//     (no ids, x_div 1), one weight row a row group: the bits of T launches of
//     affine_stream_products_* at one activation row each. Dynamic shared memory
//     M * 4 * (cols + cols / V) bytes (over 48 KB from M * cols > 11 904: the host raises the
//     kernel's limit); grid = (any count >= 1, 1).
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/affine_stream.cu

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/affine.h"
#include "cuda_convert.h"
#include "affine_row_group.h"

namespace affine_stream {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

constexpr uint32_t kStreamWarps = 4;

// (a & mask) | magic in one LOP3 (ptxas emits an AND and an OR for the C++ expression).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t mask, uint32_t magic) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(magic));
  return d;
#else  // the CPU emulation (kernels/emu)
  return (a & mask) | magic;
#endif
}

// q * 2^(BITS m) for the bits of `mask` (a value's place in the low 23 bits of a word).
__device__ __forceinline__ float unpack(uint32_t word, uint32_t mask) {
  return __uint_as_float(and_or(word, mask, 0x4B000000u)) - 8388608.0f;
}

// The power of two that value t of a chunk (t % (32 / BITS) its place in its word) is
// pre-multiplied by: the low half of a word is unpacked in place, the high half after one
// shift by 16.
template <uint32_t BITS>
__device__ __forceinline__ float place_factor(uint32_t t) {
  constexpr uint32_t HALF = 16 / BITS;
  return __uint_as_float((127u - BITS * (t % HALF)) << 23);
}

// A chunk's 128 / BITS values q * 2^(BITS m), in column order (the in-place unpacking).
template <uint32_t BITS>
__device__ __forceinline__ void unpack_chunk(const uint4 w, float* q) {
  constexpr uint32_t PER = 32 / BITS, HALF = PER / 2, MASK = (1u << BITS) - 1u;
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (uint32_t i = 0; i < 4; ++i) {
    const uint32_t lo = words[i], hi = words[i] >> 16;
#pragma unroll
    for (uint32_t k = 0; k < PER; ++k) q[i * PER + k] = unpack(k < HALF ? lo : hi, MASK << (BITS * (k % HALF)));
  }
}

// sum(q x) over a chunk of unpacked values, in the wide kernel's order (two chains: even and
// odd values), with xs pre-multiplied by place_factor. The one order of every streamed
// product: a row's sums are the same bits whichever kernel (one activation row or several)
// runs them.
template <uint32_t BITS>
__device__ __forceinline__ float unpacked_qx(const float* q, const float* xs) {
  constexpr uint32_t V = 128 / BITS;
  float a = 0.f, b = 0.f;
#pragma unroll
  for (uint32_t k = 0; k < V; k += 2) {
    a = fmaf(q[k], xs[k], a);
    b = fmaf(q[k + 1], xs[k + 1], b);
  }
  return a + b;
}

// sum(q x) over a chunk's four words (unpacked, then unpacked_qx).
template <uint32_t BITS>
__device__ __forceinline__ float chunk_qx(const uint4 w, const float* xs) {
  float q[128 / BITS];
  unpack_chunk<BITS>(w, q);
  return unpacked_qx<BITS>(q, xs);
}

// Chunk c of an x row into shared memory ([V / 4][chunks] float4s), pre-multiplied by
// place_factor, and the chunk's sum in the wide kernel's order (its load_x: values in column
// order) into sx[c].
template <uint32_t BITS, typename X>
__device__ __forceinline__ void stage_chunk(const X* __restrict__ xr, uint32_t c, uint32_t chunks,
                                            float4* xs4, float* sx) {
  constexpr uint32_t V = 128 / BITS, PER16 = 16 / sizeof(X);
  uint4 raw[V / PER16];  // the chunk's x in 16-byte loads
#pragma unroll
  for (uint32_t v = 0; v < V / PER16; ++v) raw[v] = *reinterpret_cast<const uint4*>(xr + c * V + v * PER16);
  const X* vals = reinterpret_cast<const X*>(raw);
  float sum = 0.f;
#pragma unroll
  for (uint32_t m = 0; m < V / 4; ++m) {
    float v4[4];
#pragma unroll
    for (uint32_t t = 0; t < 4; ++t) {
      const uint32_t at = 4 * m + t;  // value of the chunk
      v4[t] = to_f32(vals[at]);
      sum += v4[t];
      v4[t] *= place_factor<BITS>(at);
    }
    xs4[m * chunks + c] = make_float4(v4[0], v4[1], v4[2], v4[3]);
  }
  sx[c] = sum;
}

// The loads of one round: the S chunks of each of the row group's NR rows that this lane
// sums, with their scales and biases.
template <uint32_t NR, uint32_t S>
struct Round {
  uint4 w[S][NR];
  float s[S][NR], b[S][NR];
};

template <uint32_t BITS, uint32_t ROWS, bool SWIGLU, uint32_t S, typename X, typename SC>
__device__ __forceinline__ void stream_body(const uint32_t* __restrict__ packed,
                                            const SC* __restrict__ scales,
                                            const SC* __restrict__ biases,
                                            const X* __restrict__ x,
                                            const uint32_t* __restrict__ ids, X* __restrict__ y,
                                            const AffineParams& p, uint32_t experts, uint32_t lpr,
                                            uint32_t tid, uint32_t block_x, uint32_t blocks_x,
                                            uint32_t i, float* shared) {
  constexpr uint32_t V = 128 / BITS;                 // values per 16-byte chunk
  constexpr uint32_t NR = SWIGLU ? 2 * ROWS : ROWS;  // rows read per row group
  if (i >= p.out_rows) return;                       // uniform over the block
  const uint32_t lane = tid % 32, warp = tid / 32;
  const uint32_t outputs = SWIGLU ? p.rows / 2 : p.rows;
  const uint32_t subs = 32 / lpr, sub = lane / lpr, l = lane % lpr;
  const uint32_t e = p.has_ids ? ids[i] : 0;
  const uint32_t first_wr = block_x * kStreamWarps + warp, wr_stride = blocks_x * kStreamWarps;
  // This warp's rounds (a row group per sub-warp each) and a round's first output.
  const uint32_t per_round = subs * ROWS;
  const uint32_t all_rounds = (outputs + per_round - 1) / per_round;
  const uint32_t rounds = first_wr < all_rounds ? (all_rounds - first_wr + wr_stride - 1) / wr_stride : 0;
  auto first_output = [&](uint32_t round) { return ((first_wr + round * wr_stride) * subs + sub) * ROWS; };
  if (e >= experts) {  // uniform over the block: no barrier or shuffle follows
    for (uint32_t round = 0; round < rounds; ++round) {
      const uint32_t o0 = first_output(round);
      for (uint32_t r = 0; r < ROWS; ++r) {
        if (l == 0 && o0 + r < outputs) y[(size_t)i * outputs + o0 + r] = from_f32<X>(__uint_as_float(0x7fc00000u));
      }
    }
    return;
  }
  const uint32_t words_per_row = p.cols * BITS / 32, groups = p.cols / p.group_size;
  const uint32_t chunks = p.cols / V;
  // Chunks a group holds: a power of two (the host checks), so a chunk's group is a shift.
  uint32_t group_shift = 0;
  while ((V << group_shift) < p.group_size) ++group_shift;
  float4* xs4 = reinterpret_cast<float4*>(shared);  // [V / 4][chunks]
  float* sx = shared + p.cols;                        // [chunks]

  auto load = [&](uint32_t round, Round<NR, S>& rd) {
    const uint32_t o0 = first_output(round);
#pragma unroll
    for (uint32_t r = 0; r < NR; ++r) {
      // Rows past the matrix read its last row (a valid address) and are never written.
      const uint32_t o = min(o0 + (r % ROWS), outputs - 1);
      const size_t row = (size_t)e * p.rows + (SWIGLU && r >= ROWS ? outputs + o : o);
      const uint4* wrow = reinterpret_cast<const uint4*>(packed + row * words_per_row);
      const SC* srow = scales + row * groups;
      const SC* brow = biases + row * groups;
#pragma unroll
      for (uint32_t k = 0; k < S; ++k) {
        const uint32_t c = l + k * lpr;
        if (c < chunks) {
          rd.w[k][r] = wrow[c];
          rd.s[k][r] = to_f32(srow[c >> group_shift]);
          rd.b[k][r] = to_f32(brow[c >> group_shift]);
        }
      }
    }
  };

  // The first round's loads are asked for before x is staged: they overlap it.
  Round<NR, S> cur, next;
  if (rounds > 0) load(0, cur);

  // x of this output row into shared memory, pre-multiplied; each chunk's sum in the wide
  // kernel's order (its load_x: values in column order).
  const X* xr = x + (size_t)(i / p.x_div) * p.cols;
  for (uint32_t c = tid; c < chunks; c += kStreamWarps * 32) stage_chunk<BITS>(xr, c, chunks, xs4, sx);
  __syncthreads();

  for (uint32_t round = 0; round < rounds; ++round) {  // uniform over the warp
    // The next round's loads are in flight while this one is summed.
    if (round + 1 < rounds) load(round + 1, next);
    float acc[NR];
#pragma unroll
    for (uint32_t r = 0; r < NR; ++r) acc[r] = 0.f;
#pragma unroll
    for (uint32_t k = 0; k < S; ++k) {
      const uint32_t c = l + k * lpr;
      if (c < chunks) {
        float xs[V];
#pragma unroll
        for (uint32_t m = 0; m < V / 4; ++m) {
          const float4 v = xs4[m * chunks + c];
          xs[4 * m] = v.x, xs[4 * m + 1] = v.y, xs[4 * m + 2] = v.z, xs[4 * m + 3] = v.w;
        }
        const float sum_x = sx[c];
#pragma unroll
        for (uint32_t r = 0; r < NR; ++r) {
          acc[r] = fmaf(cur.s[k][r], chunk_qx<BITS>(cur.w[k][r], xs), fmaf(cur.b[k][r], sum_x, acc[r]));
        }
      }
    }
    affine_row_group::reduce_and_write<ROWS, SWIGLU>(acc, lpr, l, y + (size_t)i * outputs,
                                                     first_output(round), outputs);
    cur = next;
  }
}

// The products of nt = p.out_rows <= T activation rows (2..8, a verify pass's or a batched
// step's dense products; T in {2, 4, 8} holds them) in one pass over the weights: each lane's chunk is loaded and unpacked once and
// summed against the T rows of x staged in shared memory ([T][V / 4][chunks] float4s, then
// [T][chunks] sums), where stream_body at one activation row a block redoes the loads (from
// L2) and the unpacking per row. One weight row a row group (the round's loads and the
// unpacked chunk stay in registers whatever T). A row's sums are stream_body's, term for
// term: the same lanes' chunks, unpacked_qx's order, the same shuffle tree, so each row's
// output is the bits it gets alone. Dense products only (no ids, x row t for output row t).
// T is a capacity (2, 4 or 8), not the count: three instantiations instead of seven, a few
// idle accumulators at most.
template <uint32_t BITS, uint32_t T, uint32_t S, typename X, typename SC>
__device__ __forceinline__ void rows_body(const uint32_t* __restrict__ packed,
                                          const SC* __restrict__ scales,
                                          const SC* __restrict__ biases,
                                          const X* __restrict__ x, X* __restrict__ y,
                                          const AffineParams& p, uint32_t lpr, uint32_t tid,
                                          uint32_t block_x, uint32_t blocks_x, float* shared) {
  constexpr uint32_t V = 128 / BITS;
  const uint32_t lane = tid % 32, warp = tid / 32;
  const uint32_t outputs = p.rows, nt = min(p.out_rows, T);
  const uint32_t subs = 32 / lpr, sub = lane / lpr, l = lane % lpr;
  const uint32_t first_wr = block_x * kStreamWarps + warp, wr_stride = blocks_x * kStreamWarps;
  const uint32_t all_rounds = (outputs + subs - 1) / subs;
  const uint32_t rounds = first_wr < all_rounds ? (all_rounds - first_wr + wr_stride - 1) / wr_stride : 0;
  auto first_output = [&](uint32_t round) { return (first_wr + round * wr_stride) * subs + sub; };
  const uint32_t words_per_row = p.cols * BITS / 32, groups = p.cols / p.group_size;
  const uint32_t chunks = p.cols / V;
  uint32_t group_shift = 0;
  while ((V << group_shift) < p.group_size) ++group_shift;
  float4* xs4 = reinterpret_cast<float4*>(shared);  // [nt][V / 4][chunks]
  float* sx = shared + nt * p.cols;                   // [nt][chunks]

  auto load = [&](uint32_t round, Round<1, S>& rd) {
    // Rows past the matrix read its last row (a valid address) and are never written.
    const uint32_t o = min(first_output(round), outputs - 1);
    const uint4* wrow = reinterpret_cast<const uint4*>(packed + (size_t)o * words_per_row);
    const SC* srow = scales + (size_t)o * groups;
    const SC* brow = biases + (size_t)o * groups;
#pragma unroll
    for (uint32_t k = 0; k < S; ++k) {
      const uint32_t c = l + k * lpr;
      if (c < chunks) {
        rd.w[k][0] = wrow[c];
        rd.s[k][0] = to_f32(srow[c >> group_shift]);
        rd.b[k][0] = to_f32(brow[c >> group_shift]);
      }
    }
  };

  Round<1, S> cur, next;
  if (rounds > 0) load(0, cur);
  for (uint32_t at = tid; at < nt * chunks; at += kStreamWarps * 32) {
    const uint32_t t = at / chunks, c = at % chunks;
    stage_chunk<BITS>(x + (size_t)t * p.cols, c, chunks, xs4 + t * (V / 4) * chunks, sx + t * chunks);
  }
  __syncthreads();

  for (uint32_t round = 0; round < rounds; ++round) {  // uniform over the warp
    if (round + 1 < rounds) load(round + 1, next);
    float acc[T];
#pragma unroll
    for (uint32_t t = 0; t < T; ++t) acc[t] = 0.f;
#pragma unroll
    for (uint32_t k = 0; k < S; ++k) {
      const uint32_t c = l + k * lpr;
      if (c < chunks) {
        float q[V];
        unpack_chunk<BITS>(cur.w[k][0], q);
#pragma unroll
        for (uint32_t t = 0; t < T; ++t) {
          if (t >= nt) break;  // uniform over the block
          const float4* xt = xs4 + t * (V / 4) * chunks;
          float xs[V];
#pragma unroll
          for (uint32_t m = 0; m < V / 4; ++m) {
            const float4 v = xt[m * chunks + c];
            xs[4 * m] = v.x, xs[4 * m + 1] = v.y, xs[4 * m + 2] = v.z, xs[4 * m + 3] = v.w;
          }
          acc[t] = fmaf(cur.s[k][0], unpacked_qx<BITS>(q, xs), fmaf(cur.b[k][0], sx[t * chunks + c], acc[t]));
        }
      }
    }
#pragma unroll
    for (uint32_t t = 0; t < T; ++t) {
      if (t >= nt) break;
      float one[1] = {acc[t]};
      affine_row_group::reduce_and_write<1, false>(one, lpr, l, y + (size_t)t * outputs, first_output(round),
                                                   outputs);
    }
    cur = next;
  }
}

}  // namespace affine_stream

#define AFFINE_STREAM_ENTRY(KIND, SWIGLU, BITS, ROWS, STEPS, XN, XT, SN, ST)                    \
  extern "C" __global__ void __launch_bounds__(affine_stream::kStreamWarps * 32)               \
      affine_stream_##KIND##_b##BITS##_r##ROWS##_s##STEPS##_##XN##_##SN(                        \
          const uint32_t* packed, const ST* scales, const ST* biases, const XT* x,             \
          const uint32_t* ids, XT* y, const AffineParams p, const uint32_t experts,            \
          const uint32_t lpr) {                                                                 \
    extern __shared__ float4 stream_shared[];                                                   \
    affine_stream::stream_body<BITS, ROWS, SWIGLU, STEPS, XT, ST>(                              \
        packed, scales, biases, x, ids, y, p, experts, lpr, threadIdx.x, blockIdx.x,            \
        gridDim.x, blockIdx.y, reinterpret_cast<float*>(stream_shared));                        \
  }

#define AFFINE_STREAM_FOR_STEPS(KIND, SWIGLU, BITS, ROWS, XN, XT, SN, ST) \
  AFFINE_STREAM_ENTRY(KIND, SWIGLU, BITS, ROWS, 1, XN, XT, SN, ST)        \
  AFFINE_STREAM_ENTRY(KIND, SWIGLU, BITS, ROWS, 2, XN, XT, SN, ST)        \
  AFFINE_STREAM_ENTRY(KIND, SWIGLU, BITS, ROWS, 4, XN, XT, SN, ST)

// Per bit width: the products at 1 and 2 rows a group, the SwiGLU at 1.
#define AFFINE_STREAM_FOR_BITS(BITS, XN, XT, SN, ST)                    \
  AFFINE_STREAM_FOR_STEPS(products, false, BITS, 1, XN, XT, SN, ST)     \
  AFFINE_STREAM_FOR_STEPS(products, false, BITS, 2, XN, XT, SN, ST)     \
  AFFINE_STREAM_FOR_STEPS(swiglu, true, BITS, 1, XN, XT, SN, ST)

#define AFFINE_STREAM_ROWS_ENTRY(BITS, T, STEPS, XN, XT, SN, ST)                                  \
  extern "C" __global__ void __launch_bounds__(affine_stream::kStreamWarps * 32)               \
      affine_stream_rows_b##BITS##_t##T##_s##STEPS##_##XN##_##SN(                               \
          const uint32_t* packed, const ST* scales, const ST* biases, const XT* x, XT* y,      \
          const AffineParams p, const uint32_t lpr) {                                          \
    extern __shared__ float4 stream_shared[];                                                   \
    affine_stream::rows_body<BITS, T, STEPS, XT, ST>(packed, scales, biases, x, y, p, lpr,      \
                                                     threadIdx.x, blockIdx.x, gridDim.x,         \
                                                     reinterpret_cast<float*>(stream_shared));   \
  }

#define AFFINE_STREAM_ROWS_FOR_STEPS(BITS, T, XN, XT, SN, ST) \
  AFFINE_STREAM_ROWS_ENTRY(BITS, T, 1, XN, XT, SN, ST)        \
  AFFINE_STREAM_ROWS_ENTRY(BITS, T, 2, XN, XT, SN, ST)        \
  AFFINE_STREAM_ROWS_ENTRY(BITS, T, 4, XN, XT, SN, ST)

// The products of 2..8 activation rows a pass (rows_body), held for 2, 4 or 8.
#define AFFINE_STREAM_ROWS_FOR_BITS(BITS, XN, XT, SN, ST) \
  AFFINE_STREAM_ROWS_FOR_STEPS(BITS, 2, XN, XT, SN, ST)   \
  AFFINE_STREAM_ROWS_FOR_STEPS(BITS, 4, XN, XT, SN, ST)   \
  AFFINE_STREAM_ROWS_FOR_STEPS(BITS, 8, XN, XT, SN, ST)

#define AFFINE_STREAM_FOR_TYPES(XN, XT, SN, ST) \
  AFFINE_STREAM_FOR_BITS(4, XN, XT, SN, ST) AFFINE_STREAM_FOR_BITS(8, XN, XT, SN, ST)

#define AFFINE_STREAM_ROWS_FOR_TYPES(XN, XT, SN, ST) \
  AFFINE_STREAM_ROWS_FOR_BITS(4, XN, XT, SN, ST) AFFINE_STREAM_ROWS_FOR_BITS(8, XN, XT, SN, ST)

// The driver JIT-compiles a PTX module whole at its first load (~54 s for this one with the
// row entries in it, on a fresh H200): the one-pass row entries are emitted by
// affine_stream_rows.cu instead, which defines AFFINE_STREAM_NO_ENTRY_POINTS.
#ifndef AFFINE_STREAM_NO_ENTRY_POINTS
CUDA_FOR_FLOAT_TYPE_PAIRS(AFFINE_STREAM_FOR_TYPES)
#endif
