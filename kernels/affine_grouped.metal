// Grouped quantized matmul (MLX's gather_qmm, sorted case) on simdgroup matrices: the expert
// products of a MoE prefill chunk in ONE dispatch.
//
// y[p] = x[p] . W_e^T for every row p of expert e, where x [P, K] holds the rows sorted by
// expert (expert e's rows are a contiguous range) and W_e is expert e of a stacked MLX affine
// matrix [E, R, K] (the format of kernels/affine.metal: rows of little-endian `bits`-bit
// codes, w = scale*q + bias per group of `group_size` columns, scales and biases in ScT).
//
// Numerics, as the composed path it replaces (dequantize into the activation dtype, then a
// matmul): every weight is computed in float as s*q + b and rounded once to InT in
// threadgroup memory; x stays InT; the products accumulate in float (simdgroup matrices); y
// is rounded once to InT.
//
// Schedule: the host builds a list of tiles (params/affine_grouped_metal.h GroupedTile), each a run
// of at most kTileM = 32 rows of one expert, from the experts' row offsets; an expert with no
// rows has no tile. Threadgroup (n, t) computes the [rows of tile t] x [kTileN = 32 output
// columns from 32n] block of y. Four simdgroups, 2 x 2, each own a 16 x 16 quarter of it as
// four simdgroup_float8x8 accumulators. Per step of kTileK = 32 columns of K:
//  * the x tile [32, 32] InT is copied to threadgroup memory (rows past the tile: 0);
//  * the weight tile [32 output rows, 32 columns] is dequantized into threadgroup memory as
//    InT (rows past R: 0). group_size is a multiple of 32, so the step lies in one group:
//    one scale and one bias per row;
//  * each simdgroup multiplies its two 8-row x tiles by its two 8-row weight tiles, the
//    latter loaded transposed (Wᵀ), 4 times (8 columns of K each). x tiles past the tile's
//    rows are skipped, so the products pad an expert's rows to a multiple of 8, not 32.
// The float accumulators are stored to threadgroup memory and written to y with bounds
// checks (only the tile's rows, only columns below R), converted to InT.
//
// Dispatch (crates/gdn-ops/src/ops/affine_grouped/metal.rs; kernels/emu/
// affine_grouped_harness.cpp emulates exactly this): threadgroups (ceil(R / 32), tiles, 1),
// 128 threads each, kScratchBytes of threadgroup memory at index 0. The host must ensure
// bits in {2, 3, 4, 5, 6, 8}, group_size a multiple of 32, K a multiple of group_size, and
// tiles that lie inside x with expert < E and at most 32 rows; a tile that does not is
// skipped (its rows of y stay unwritten), since the kernel cannot report it.
//
// Split-K (issue 29: one matrix times 9-64 rows of a batched decode step, E = 1; as the CUDA
// twin kernels/affine_grouped.cu): with p.slice_cols > 0 the columns are cut into slices of
// slice_cols (whole 64-column steps of the CUDA kernel: ops/affine_grouped/slicing.rs, the
// same cut on both backends), threadgroup z the slice; the entries affine_grouped_split_<x>_<s>
// write each threadgroup's float output tile into partial [slices, P, R] (slice z at z * P * R)
// instead of y, and affine_split_sum_<x> adds the slices in order 0, 1, .. into y in InT (the
// same bits every run: no float atomics). Dispatch: threadgroups (ceil(R / 32), tiles, slices)
// as above; the sum: threadgroups (ceil(P * R / kSumThreads), 1, 1) of kSumThreads threads.
// A slice starts at a multiple of 64 columns, so each 32-column step still lies in one group.
//
// simdgroup matrices need MSL 2.3 (macOS 11); the bfloat entry points exist only with
// __HAVE_BFLOAT__ (MSL 3.1, macOS 14).

#include <metal_stdlib>
using namespace metal;

#include "params/affine_grouped_metal.h"

enum : uint {
  kTileM = 32,  // rows of x per tile (GROUPED_TILE_ROWS on the host)
  kTileN = 32,  // output columns (weight rows) per threadgroup (GROUPED_TILE_COLS)
  kTileK = 32,  // columns of K per step
  kThreads = 128,
  kValuesPerThread = kTileM * kTileK / kThreads,  // 8: one packed run per thread
  // Threadgroup memory: the float output tile first, then the x and weight tiles in InT
  // (sized for float, the widest InT). 12 KiB, under every Apple GPU's 32 KiB.
  kOutFloats = kTileM * kTileN,
  kStageValues = kTileM * kTileK,
  kScratchBytes = kOutFloats * 4 + 2 * kStageValues * 4,
  kSumThreads = 256,  // threads per threadgroup of affine_split_sum_* (SPLIT_SUM_THREADS)
};

// The 8 codes of one row at columns [j0, j0 + 8) (j0 a multiple of 8), as floats. As
// kernels/affine.metal's load_quants8: the 8*BITS bits start at a bit offset that keeps them
// inside two consecutive words of the row, and the second word is read only when they reach
// into it, so nothing past the row is read.
struct Codes8 {
  float q[8];
};

template <uint BITS>
inline Codes8 grouped_codes8(const device uint* row, uint j0) {
  Codes8 r;
  if (BITS == 4) {
    const uint w = row[j0 / 8];
    for (uint t = 0; t < 8; ++t) {
      r.q[t] = float((w >> (4 * t)) & 0xFu);
    }
  } else if (BITS == 8) {
    const uint w0 = row[j0 / 4];
    const uint w1 = row[j0 / 4 + 1];
    for (uint t = 0; t < 4; ++t) {
      r.q[t] = float((w0 >> (8 * t)) & 0xFFu);
      r.q[t + 4] = float((w1 >> (8 * t)) & 0xFFu);
    }
  } else {
    const uint mask = (1u << BITS) - 1u;
    const uint bit = j0 * BITS;
    const uint shift = bit % 32;
    const uint lo = row[bit / 32];
    const uint hi = shift + 8 * BITS > 32 ? row[bit / 32 + 1] : 0u;
    const ulong window = ((ulong(hi) << 32) | ulong(lo)) >> shift;
    for (uint t = 0; t < 8; ++t) {
      r.q[t] = float(uint(window >> (t * BITS)) & mask);
    }
  }
  return r;
}

// OutT: InT (y, the products) or float (a split-K slice's partial sums over columns
// [k_begin, k_end)).
template <typename InT, typename ScT, typename OutT, uint BITS>
inline void affine_grouped_tile(
    const device uint* w,
    const device ScT* scales,
    const device ScT* biases,
    const device InT* x,
    device OutT* y,
    constant AffineGroupedParams& p,
    GroupedTile tile,
    threadgroup float* scratch,
    uint n0,
    uint k_begin,
    uint k_end,
    uint tid,
    uint sg) {
  const uint K = p.cols;
  const uint R = p.rows;
  const uint wpr = K * BITS / 32;
  const uint gpr = K / p.group_size;
  const uint m_count = tile.row_end - tile.row_begin;

  threadgroup float* out_tile = scratch;
  threadgroup InT* xs = (threadgroup InT*)(scratch + kOutFloats);
  threadgroup InT* ws = xs + kStageValues;

  // What this thread copies and dequantizes: row `r` of each staged tile, 8 columns from c8.
  const uint r = tid / (kTileK / kValuesPerThread);
  const uint c8 = (tid % (kTileK / kValuesPerThread)) * kValuesPerThread;
  const bool x_live = r < m_count;
  const device InT* x_row = x + ulong(tile.row_begin + (x_live ? r : 0)) * K;
  const bool w_live = n0 + r < R;
  const ulong w_row = ulong(tile.expert) * R + (w_live ? n0 + r : 0);
  const device uint* w_words = w + w_row * wpr;

  // This simdgroup's 16 x 16 quarter: rows 16*sm.., columns 16*sn...
  const uint sm = sg / 2;
  const uint sn = sg % 2;
  // Its 8-row blocks that hold rows of the tile: 0, 1 or 2.
  const uint first_row = 16 * sm;
  const uint live_blocks = m_count <= first_row ? 0u : min(2u, (m_count - first_row + 7) / 8);
  simdgroup_float8x8 acc[2][2];
  for (uint i = 0; i < 2; ++i) {
    for (uint j = 0; j < 2; ++j) {
      acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
  }

  for (uint k0 = k_begin; k0 < k_end; k0 += kTileK) {
    // Stage: the x tile as it is, the weight tile dequantized (both zero outside).
    for (uint t = 0; t < kValuesPerThread; ++t) {
      xs[r * kTileK + c8 + t] = x_live ? x_row[k0 + c8 + t] : InT(0.0f);
    }
    if (w_live) {
      const Codes8 q = grouped_codes8<BITS>(w_words, k0 + c8);
      const ulong sb = w_row * gpr + k0 / p.group_size;
      const float s = float(scales[sb]);
      const float b = float(biases[sb]);
      for (uint t = 0; t < kValuesPerThread; ++t) {
        ws[r * kTileK + c8 + t] = static_cast<InT>(s * q.q[t] + b);
      }
    } else {
      for (uint t = 0; t < kValuesPerThread; ++t) {
        ws[r * kTileK + c8 + t] = InT(0.0f);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // 8-row blocks of x past the tile's rows hold only zeros: the simdgroup skips them
    // (live_blocks is the same in all its lanes), so an expert's rows are padded to a
    // multiple of 8 in the products, not of 32.
    for (uint kk = 0; live_blocks > 0 && kk < kTileK; kk += 8) {
      simdgroup_matrix<InT, 8, 8> a[2];
      simdgroup_matrix<InT, 8, 8> bt[2];
      // Constant trip counts with a uniform test inside, so that unrolled, every matrix
      // index is a constant and the matrices stay in registers.
      for (uint i = 0; i < 2; ++i) {
        if (i < live_blocks) {
          simdgroup_load(a[i], xs + (16 * sm + 8 * i) * kTileK + kk, kTileK);
        }
      }
      for (uint j = 0; j < 2; ++j) {
        // Weight rows as columns: element (k, n) of the loaded matrix is W[n][k].
        simdgroup_load(bt[j], ws + (16 * sn + 8 * j) * kTileK + kk, kTileK, ulong2(0), true);
      }
      for (uint i = 0; i < 2; ++i) {
        if (i < live_blocks) {
          for (uint j = 0; j < 2; ++j) {
            simdgroup_multiply_accumulate(acc[i][j], a[i], bt[j], acc[i][j]);
          }
        }
      }
    }
    // The next step overwrites the staged tiles.
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  for (uint i = 0; i < 2; ++i) {
    for (uint j = 0; j < 2; ++j) {
      simdgroup_store(acc[i][j], out_tile + (16 * sm + 8 * i) * kTileN + 16 * sn + 8 * j, kTileN);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (x_live) {
    device OutT* y_row = y + ulong(tile.row_begin + r) * R;
    for (uint t = 0; t < kValuesPerThread; ++t) {
      const uint n = n0 + c8 + t;
      if (n < R) {
        y_row[n] = static_cast<OutT>(out_tile[r * kTileN + c8 + t]);
      }
    }
  }
}

template <typename InT, typename ScT, typename OutT>
inline void affine_grouped_impl(
    const device uint* w,
    const device ScT* scales,
    const device ScT* biases,
    const device InT* x,
    const device GroupedTile* tiles,
    device OutT* y,
    constant AffineGroupedParams& p,
    threadgroup float* scratch,
    uint3 group,
    uint tid,
    uint sg) {
  const uint n0 = group.x * kTileN;
  if (group.y >= p.tiles || n0 >= p.rows) {
    return;  // the whole threadgroup: no barrier is left waiting
  }
  // The columns this threadgroup walks: all of them, or split-K slice group.z's (whose plane
  // of the partial sums it writes).
  uint k_begin = 0;
  uint k_end = p.cols;
  if (p.slice_cols > 0) {
    k_begin = group.z * p.slice_cols;
    if (k_begin >= p.cols) {
      return;  // no such slice (the host dispatches none)
    }
    k_end = min(p.cols, k_begin + p.slice_cols);
    y += ulong(group.z) * p.x_rows * p.rows;
  }
  GroupedTile tile;
  tile.expert = tiles[group.y].expert;
  tile.row_begin = tiles[group.y].row_begin;
  tile.row_end = tiles[group.y].row_end;
  // A host bug, not input: skip the tile (uniform over the threadgroup) rather than read or
  // write out of bounds.
  if (tile.expert >= p.experts || tile.row_end > p.x_rows || tile.row_end <= tile.row_begin ||
      tile.row_end - tile.row_begin > kTileM) {
    return;
  }
  switch (p.bits) {
    case 2: affine_grouped_tile<InT, ScT, OutT, 2>(w, scales, biases, x, y, p, tile, scratch, n0, k_begin, k_end, tid, sg); break;
    case 3: affine_grouped_tile<InT, ScT, OutT, 3>(w, scales, biases, x, y, p, tile, scratch, n0, k_begin, k_end, tid, sg); break;
    case 4: affine_grouped_tile<InT, ScT, OutT, 4>(w, scales, biases, x, y, p, tile, scratch, n0, k_begin, k_end, tid, sg); break;
    case 5: affine_grouped_tile<InT, ScT, OutT, 5>(w, scales, biases, x, y, p, tile, scratch, n0, k_begin, k_end, tid, sg); break;
    case 6: affine_grouped_tile<InT, ScT, OutT, 6>(w, scales, biases, x, y, p, tile, scratch, n0, k_begin, k_end, tid, sg); break;
    case 8: affine_grouped_tile<InT, ScT, OutT, 8>(w, scales, biases, x, y, p, tile, scratch, n0, k_begin, k_end, tid, sg); break;
    default: break;  // unsupported width: a host bug, y left unwritten
  }
}

// Entry points affine_grouped_qmm_{InT}_{ScT}, plain kernels forwarding to the template (as in
// kernels/affine.metal, so the emulation calls each by its host name).
#define AFFINE_GROUPED_QMM(name, InT, ScT)                                         \
  [[kernel]] void name(                                                            \
      const device uint* w [[buffer(0)]],      /* [E*R, K*bits/32] */              \
      const device ScT* scales [[buffer(1)]],  /* [E*R, K/group_size] */           \
      const device ScT* biases [[buffer(2)]],  /* [E*R, K/group_size] */           \
      const device InT* x [[buffer(3)]],       /* [P, K], rows sorted by expert */ \
      const device GroupedTile* tiles [[buffer(4)]], /* [tiles] */                 \
      device InT* y [[buffer(5)]],             /* [P, R] */                        \
      constant AffineGroupedParams& p [[buffer(6)]],                               \
      threadgroup float* scratch [[threadgroup(0)]],                               \
      uint3 group [[threadgroup_position_in_grid]],                                \
      uint tid [[thread_index_in_threadgroup]],                                    \
      uint sg [[simdgroup_index_in_threadgroup]]) {                                \
    affine_grouped_impl<InT, ScT, InT>(w, scales, biases, x, tiles, y, p, scratch, \
                                       group, tid, sg);                            \
  }

// Split-K entry points affine_grouped_split_{InT}_{ScT}: the same body, each threadgroup's
// float partial sums into partial (threadgroup z: the slice; p.slice_cols > 0).
#define AFFINE_GROUPED_SPLIT(name, InT, ScT)                                       \
  [[kernel]] void name(                                                            \
      const device uint* w [[buffer(0)]],      /* [R, K*bits/32] */                \
      const device ScT* scales [[buffer(1)]],  /* [R, K/group_size] */             \
      const device ScT* biases [[buffer(2)]],  /* [R, K/group_size] */             \
      const device InT* x [[buffer(3)]],       /* [P, K] */                        \
      const device GroupedTile* tiles [[buffer(4)]], /* [tiles] */                 \
      device float* partial [[buffer(5)]],     /* [slices, P, R] */                \
      constant AffineGroupedParams& p [[buffer(6)]],                               \
      threadgroup float* scratch [[threadgroup(0)]],                               \
      uint3 group [[threadgroup_position_in_grid]],                                \
      uint tid [[thread_index_in_threadgroup]],                                    \
      uint sg [[simdgroup_index_in_threadgroup]]) {                                \
    affine_grouped_impl<InT, ScT, float>(w, scales, biases, x, tiles, partial, p,  \
                                         scratch, group, tid, sg);                 \
  }

// Split-K's second dispatch: y[i] = InT(partial[0][i] + partial[1][i] + ...), the slices in
// order, so that the sum's bits do not depend on which threadgroup finished first.
template <typename InT>
inline void affine_split_sum_impl(
    const device float* partial, device InT* y, constant AffineSplitSumParams& p, uint i) {
  if (i >= p.n) {
    return;
  }
  float sum = partial[i];
  for (uint s = 1; s < p.slices; ++s) {
    sum += partial[ulong(s) * p.n + i];
  }
  y[i] = static_cast<InT>(sum);
}

#define AFFINE_SPLIT_SUM(name, InT)                                                \
  [[kernel]] void name(                                                            \
      const device float* partial [[buffer(0)]], /* [slices, n] */                 \
      device InT* y [[buffer(1)]],               /* [n] */                         \
      constant AffineSplitSumParams& p [[buffer(2)]],                              \
      uint i [[thread_position_in_grid]]) {                                        \
    affine_split_sum_impl<InT>(partial, y, p, i);                                  \
  }

AFFINE_GROUPED_QMM(affine_grouped_qmm_f32_f32, float, float)
AFFINE_GROUPED_QMM(affine_grouped_qmm_f32_f16, float, half)
AFFINE_GROUPED_QMM(affine_grouped_qmm_f16_f32, half, float)
AFFINE_GROUPED_QMM(affine_grouped_qmm_f16_f16, half, half)
#if defined(__HAVE_BFLOAT__)
AFFINE_GROUPED_QMM(affine_grouped_qmm_f32_bf16, float, bfloat)
AFFINE_GROUPED_QMM(affine_grouped_qmm_f16_bf16, half, bfloat)
AFFINE_GROUPED_QMM(affine_grouped_qmm_bf16_f32, bfloat, float)
AFFINE_GROUPED_QMM(affine_grouped_qmm_bf16_f16, bfloat, half)
AFFINE_GROUPED_QMM(affine_grouped_qmm_bf16_bf16, bfloat, bfloat)
#endif

AFFINE_GROUPED_SPLIT(affine_grouped_split_f32_f32, float, float)
AFFINE_GROUPED_SPLIT(affine_grouped_split_f32_f16, float, half)
AFFINE_GROUPED_SPLIT(affine_grouped_split_f16_f32, half, float)
AFFINE_GROUPED_SPLIT(affine_grouped_split_f16_f16, half, half)
AFFINE_SPLIT_SUM(affine_split_sum_f32, float)
AFFINE_SPLIT_SUM(affine_split_sum_f16, half)
#if defined(__HAVE_BFLOAT__)
AFFINE_GROUPED_SPLIT(affine_grouped_split_f32_bf16, float, bfloat)
AFFINE_GROUPED_SPLIT(affine_grouped_split_f16_bf16, half, bfloat)
AFFINE_GROUPED_SPLIT(affine_grouped_split_bf16_f32, bfloat, float)
AFFINE_GROUPED_SPLIT(affine_grouped_split_bf16_f16, bfloat, half)
AFFINE_GROUPED_SPLIT(affine_grouped_split_bf16_bf16, bfloat, bfloat)
AFFINE_SPLIT_SUM(affine_split_sum_bf16, bfloat)
#endif
