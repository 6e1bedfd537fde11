// MLX affine-quantized matrices: matrix-vector products (qmv) and row dequantization.
//
// Format (crates/gdn-ops/src/ops/affine/packing.rs is the CPU reference this must match): a stacked
// matrix [E experts, R rows, K cols]. Each row is one little-endian bitstream of K `bits`-bit
// unsigned ints: element j occupies bits [j*bits, (j+1)*bits), bit n being bit n % 32 of word
// n / 32, so a row is K*bits/32 words. Groups of `group_size` consecutive elements share a
// scale and a bias: w = scale*q + bias. scales and biases are [E*R, K/group_size], row-major,
// in ScT (float, half or bfloat); they are converted straight to float, never through half,
// so bf16 scales outside the f16 range (1e-6, 3e5) keep their value.
//
// The host (crates/gdn-ops/src/metal/affine.rs) must only launch these kernels with
// bits in {2, 3, 4, 5, 6, 8}, group_size a multiple of 8 (MLX uses 32, 64, 128) and K a
// multiple of group_size; the kernels have no way to report a violation (an unsupported
// bit width writes NaN). With has_ids == 0 the ids buffer is never read, but bind one there
// (any buffer) so validation layers stay quiet. The bfloat entry points exist only where
// the compiler defines __HAVE_BFLOAT__ (MSL 3.1, macOS 14).
//
// Launch geometry (the host uses exactly this; kernels/emu/affine_harness.cpp emulates it):
//  * affine_qmv_{in}_{sc}: threadgroups (ceil(R/8), M, 1), threads per threadgroup
//    (32, 2, 1). Each of the two simdgroups computes 4 consecutive output rows.
//  * affine_qmv_swiglu_{in}_{sc}: as affine_qmv over the R/2 activations of a stacked
//    gate-and-up matrix (R = 2*Im rows per expert): threadgroups (ceil(R/2/8), M, 1),
//    threads (32, 2, 1); each simdgroup reads 4 gate and the 4 matching up rows and writes
//    4 consecutive activations of y [M, R/2].
//  * affine_qmv_pass_{in}_{sc}: the dense products (no ids, x_div 1) of M = 2..8 rows at
//    once: threadgroups (ceil(R/8), 1, 1), threads (32, 2, 1); each simdgroup computes its
//    4 output rows for all M rows of x, each row's bits what affine_qmv gives it alone.
//  * affine_dequant_{out}_{sc}: threadgroups (ceil(K/8/64), M, 1), threads per threadgroup
//    (64, 1, 1). Each thread writes 8 consecutive values of one output row.

#include <metal_stdlib>
using namespace metal;

#include "params/affine.h"

// The 8 quantized values of one row at columns [j0, j0 + 8), as floats (exact: q < 256).
struct Quants8 {
  float q[8];
};

// j0 is a multiple of 8, so the 8 values are 8*BITS bits starting at bit offset
// (j0*BITS) % 32, a multiple of gcd(8*BITS, 32): for every supported width they fit in the
// 64-bit window of two consecutive words (3 bits: offset <= 24, 24 bits; 5: <= 24, 40;
// 6: <= 16, 48). The second word is read only when the values reach into it, and then it
// is still part of this row: nothing past a row (or the buffer) is ever read.
template <uint BITS>
inline Quants8 load_quants8(const device uint* row, uint j0) {
  Quants8 r;
  if (BITS == 4) {
    // Fast path: the 8 nibbles are exactly one word, lowest nibble first.
    const uint w = row[j0 / 8];
    for (uint t = 0; t < 8; ++t) {
      r.q[t] = float((w >> (4 * t)) & 0xFu);
    }
  } else if (BITS == 8) {
    // Fast path: two words of four bytes each, lowest byte first.
    const uint w0 = row[j0 / 4];
    const uint w1 = row[j0 / 4 + 1];
    for (uint t = 0; t < 4; ++t) {
      r.q[t] = float((w0 >> (8 * t)) & 0xFFu);
      r.q[t + 4] = float((w1 >> (8 * t)) & 0xFFu);
    }
  } else {
    const uint mask = (1u << BITS) - 1u;
    const uint bit = j0 * BITS;
    const uint word = bit / 32;
    const uint shift = bit % 32;
    const uint lo = row[word];
    const uint hi = shift + 8 * BITS > 32 ? row[word + 1] : 0u;
    const ulong window = ((ulong(hi) << 32) | ulong(lo)) >> shift;
    for (uint t = 0; t < 8; ++t) {
      r.q[t] = float(uint(window >> (t * BITS)) & mask);
    }
  }
  return r;
}

// One simdgroup's (up to) 4 rows r0.. of expert e against nt <= T consecutive output rows
// i.. (x row (i + t) / x_div each): the products of one output row (T = 1, affine_qmv) or of
// up to 8 dense rows at once (affine_qmv_pass), each weight word loaded and unpacked once for
// all of them. A row's sums are the same expressions in the same order whatever T: each
// row's output is the bits it gets alone.
template <typename InT, typename ScT, uint BITS, uint T>
inline void affine_qmv_rows(
    const device uint* w,
    const device ScT* scales,
    const device ScT* biases,
    const device InT* x,
    device InT* y,
    constant AffineParams& p,
    uint e,
    uint i,
    uint nt,
    uint r0,
    uint lane) {
  constexpr uint kRows = 4;          // QMV_ROWS_PER_SIMDGROUP on the host
  constexpr uint kPerLane = 8;       // consecutive columns per lane and step
  constexpr uint kStep = 32 * kPerLane;
  const uint K = p.cols;
  const uint R = p.rows;
  const uint wpr = K * BITS / 32;
  const uint gpr = K / p.group_size;
  // Same for all 32 lanes: the skipped rows (past R) are skipped by the whole simdgroup.
  const uint nrows = R - r0 < kRows ? R - r0 : kRows;
  const ulong row0 = ulong(e) * R + r0;

  float acc[T][kRows];
  for (uint t = 0; t < T; ++t) {
    for (uint rr = 0; rr < kRows; ++rr) {
      acc[t][rr] = 0.0f;
    }
  }
  for (uint j0 = lane * kPerLane; j0 < K; j0 += kStep) {
    float xv[T][kPerLane];
    float xsum[T];
    for (uint t = 0; t < T; ++t) {
      xsum[t] = 0.0f;
      if (t < nt) {
        const device InT* xr = x + ulong((i + t) / p.x_div) * K;
        for (uint c = 0; c < kPerLane; ++c) {
          xv[t][c] = float(xr[j0 + c]);
          xsum[t] += xv[t][c];
        }
      }
    }
    // group_size is a multiple of 8: the 8 columns lie in one group.
    const uint g = j0 / p.group_size;
    for (uint rr = 0; rr < kRows; ++rr) {
      if (rr < nrows) {
        const ulong row = row0 + rr;
        const Quants8 q = load_quants8<BITS>(w + row * wpr, j0);
        const ulong sb = row * gpr + g;
        const float s = float(scales[sb]), b = float(biases[sb]);
        for (uint t = 0; t < T; ++t) {
          if (t < nt) {
            float qx = 0.0f;
            for (uint c = 0; c < kPerLane; ++c) {
              qx += q.q[c] * xv[t][c];
            }
            // sum (s*q + b)*x over the group's columns = s*sum(q*x) + b*sum(x).
            acc[t][rr] += s * qx + b * xsum[t];
          }
        }
      }
    }
  }
  // All reductions first, then one store branch: no lane-dependent branch between two
  // simd_sums (one the compiler could duplicate the second call across).
  for (uint t = 0; t < T; ++t) {
    for (uint rr = 0; rr < kRows; ++rr) {
      if (t < nt && rr < nrows) {
        acc[t][rr] = simd_sum(acc[t][rr]);
      }
    }
  }
  if (lane == 0) {
    for (uint t = 0; t < T; ++t) {
      for (uint rr = 0; rr < kRows; ++rr) {
        if (t < nt && rr < nrows) {
          y[ulong(i + t) * R + r0 + rr] = static_cast<InT>(acc[t][rr]);
        }
      }
    }
  }
}

template <typename InT, typename ScT>
inline void affine_qmv_impl(
    const device uint* w,
    const device ScT* scales,
    const device ScT* biases,
    const device InT* x,
    const device uint* ids,
    device InT* y,
    constant AffineParams& p,
    uint3 tg,
    uint simdgroup,
    uint lane) {
  constexpr uint kRows = 4;        // QMV_ROWS_PER_SIMDGROUP on the host
  constexpr uint kSimdgroups = 2;  // QMV_SIMDGROUPS on the host
  const uint i = tg.y;
  const uint r0 = tg.x * (kRows * kSimdgroups) + simdgroup * kRows;
  // Both depend on the simdgroup only: whole simdgroups leave, so every simd_sum below
  // is reached by all 32 lanes.
  if (i >= p.out_rows || r0 >= p.rows) {
    return;
  }
  const uint e = p.has_ids != 0 ? ids[i] : 0u;
  switch (p.bits) {
    case 2: affine_qmv_rows<InT, ScT, 2, 1>(w, scales, biases, x, y, p, e, i, 1, r0, lane); break;
    case 3: affine_qmv_rows<InT, ScT, 3, 1>(w, scales, biases, x, y, p, e, i, 1, r0, lane); break;
    case 4: affine_qmv_rows<InT, ScT, 4, 1>(w, scales, biases, x, y, p, e, i, 1, r0, lane); break;
    case 5: affine_qmv_rows<InT, ScT, 5, 1>(w, scales, biases, x, y, p, e, i, 1, r0, lane); break;
    case 6: affine_qmv_rows<InT, ScT, 6, 1>(w, scales, biases, x, y, p, e, i, 1, r0, lane); break;
    case 8: affine_qmv_rows<InT, ScT, 8, 1>(w, scales, biases, x, y, p, e, i, 1, r0, lane); break;
    default:
      // Unsupported width (a host bug): make it loud rather than leave y unwritten.
      if (lane == 0) {
        for (uint rr = 0; rr < kRows && r0 + rr < p.rows; ++rr) {
          y[ulong(i) * p.rows + r0 + rr] = static_cast<InT>(NAN);
        }
      }
      break;
  }
}

// affine_qmv_pass: the dense products of p.out_rows = 2..8 rows (x [M, K], no ids, x_div 1)
// in one pass over the weights, the rows held for 2, 4 or 8 (the fewest registers that take
// them).
template <typename InT, typename ScT, uint T>
inline void affine_qmv_pass_rows(
    const device uint* w,
    const device ScT* scales,
    const device ScT* biases,
    const device InT* x,
    device InT* y,
    constant AffineParams& p,
    uint r0,
    uint lane) {
  const uint nt = p.out_rows;
  switch (p.bits) {
    case 2: affine_qmv_rows<InT, ScT, 2, T>(w, scales, biases, x, y, p, 0, 0, nt, r0, lane); break;
    case 3: affine_qmv_rows<InT, ScT, 3, T>(w, scales, biases, x, y, p, 0, 0, nt, r0, lane); break;
    case 4: affine_qmv_rows<InT, ScT, 4, T>(w, scales, biases, x, y, p, 0, 0, nt, r0, lane); break;
    case 5: affine_qmv_rows<InT, ScT, 5, T>(w, scales, biases, x, y, p, 0, 0, nt, r0, lane); break;
    case 6: affine_qmv_rows<InT, ScT, 6, T>(w, scales, biases, x, y, p, 0, 0, nt, r0, lane); break;
    case 8: affine_qmv_rows<InT, ScT, 8, T>(w, scales, biases, x, y, p, 0, 0, nt, r0, lane); break;
    default:
      if (lane == 0) {
        for (uint t = 0; t < nt; ++t) {
          for (uint rr = 0; rr < 4 && r0 + rr < p.rows; ++rr) {
            y[ulong(t) * p.rows + r0 + rr] = static_cast<InT>(NAN);
          }
        }
      }
      break;
  }
}

template <typename InT, typename ScT>
inline void affine_qmv_pass_impl(
    const device uint* w,
    const device ScT* scales,
    const device ScT* biases,
    const device InT* x,
    device InT* y,
    constant AffineParams& p,
    uint3 tg,
    uint simdgroup,
    uint lane) {
  constexpr uint kRows = 4;        // QMV_ROWS_PER_SIMDGROUP on the host
  constexpr uint kSimdgroups = 2;  // QMV_SIMDGROUPS on the host
  const uint r0 = tg.x * (kRows * kSimdgroups) + simdgroup * kRows;
  if (r0 >= p.rows || p.out_rows == 0 || p.out_rows > 8) {  // whole simdgroups leave
    return;
  }
  if (p.out_rows <= 2) {
    affine_qmv_pass_rows<InT, ScT, 2>(w, scales, biases, x, y, p, r0, lane);
  } else if (p.out_rows <= 4) {
    affine_qmv_pass_rows<InT, ScT, 4>(w, scales, biases, x, y, p, r0, lane);
  } else {
    affine_qmv_pass_rows<InT, ScT, 8>(w, scales, biases, x, y, p, r0, lane);
  }
}

// One simdgroup's (up to) 4 SwiGLU activations a0.. of output row i, with expert e of a
// stacked [E, 2*Im, K] matrix whose expert holds its gate rows 0..Im, then its up rows
// Im..2*Im (p.rows = 2*Im): g and u are rounded to InT as separate products would be, then
// act = InT(silu(g) * u) in f32.
template <typename InT, typename ScT, uint BITS>
inline void affine_qmv_swiglu_rows(
    const device uint* w,
    const device ScT* scales,
    const device ScT* biases,
    const device InT* x,
    device InT* y,
    constant AffineParams& p,
    uint e,
    uint i,
    uint a0,
    uint lane) {
  constexpr uint kRows = 4;          // QMV_ROWS_PER_SIMDGROUP on the host
  constexpr uint kPerLane = 8;       // consecutive columns per lane and step
  constexpr uint kStep = 32 * kPerLane;
  const uint K = p.cols;
  const uint im = p.rows / 2;
  const uint wpr = K * BITS / 32;
  const uint gpr = K / p.group_size;
  // Same for all 32 lanes: the skipped activations (past Im) are skipped by the whole
  // simdgroup.
  const uint nrows = im - a0 < kRows ? im - a0 : kRows;
  const ulong gate0 = ulong(e) * p.rows + a0;
  const ulong up0 = gate0 + im;
  const device InT* xr = x + ulong(i / p.x_div) * K;

  // acc[0..4): gate rows, acc[4..8): the matching up rows.
  float acc[2 * kRows];
  for (uint rr = 0; rr < 2 * kRows; ++rr) {
    acc[rr] = 0.0f;
  }
  for (uint j0 = lane * kPerLane; j0 < K; j0 += kStep) {
    float xv[kPerLane];
    float xsum = 0.0f;
    for (uint t = 0; t < kPerLane; ++t) {
      xv[t] = float(xr[j0 + t]);
      xsum += xv[t];
    }
    const uint g = j0 / p.group_size;
    for (uint rr = 0; rr < 2 * kRows; ++rr) {
      if (rr % kRows < nrows) {
        const ulong row = rr < kRows ? gate0 + rr : up0 + (rr - kRows);
        const Quants8 q = load_quants8<BITS>(w + row * wpr, j0);
        float qx = 0.0f;
        for (uint t = 0; t < kPerLane; ++t) {
          qx += q.q[t] * xv[t];
        }
        const ulong sb = row * gpr + g;
        acc[rr] += float(scales[sb]) * qx + float(biases[sb]) * xsum;
      }
    }
  }
  // All reductions first, then one store branch (as in affine_qmv_rows).
  for (uint rr = 0; rr < 2 * kRows; ++rr) {
    if (rr % kRows < nrows) {
      acc[rr] = simd_sum(acc[rr]);
    }
  }
  if (lane == 0) {
    for (uint rr = 0; rr < kRows; ++rr) {
      if (rr < nrows) {
        const float gate = float(static_cast<InT>(acc[rr]));
        const float up = float(static_cast<InT>(acc[rr + kRows]));
        y[ulong(i) * im + a0 + rr] = static_cast<InT>(gate / (1.0f + exp(-gate)) * up);
      }
    }
  }
}

template <typename InT, typename ScT>
inline void affine_qmv_swiglu_impl(
    const device uint* w,
    const device ScT* scales,
    const device ScT* biases,
    const device InT* x,
    const device uint* ids,
    device InT* y,
    constant AffineParams& p,
    uint3 tg,
    uint simdgroup,
    uint lane) {
  constexpr uint kRows = 4;        // QMV_ROWS_PER_SIMDGROUP on the host
  constexpr uint kSimdgroups = 2;  // QMV_SIMDGROUPS on the host
  const uint i = tg.y;
  const uint a0 = tg.x * (kRows * kSimdgroups) + simdgroup * kRows;
  // Both depend on the simdgroup only: whole simdgroups leave.
  if (i >= p.out_rows || a0 >= p.rows / 2) {
    return;
  }
  const uint e = p.has_ids != 0 ? ids[i] : 0u;
  switch (p.bits) {
    case 2: affine_qmv_swiglu_rows<InT, ScT, 2>(w, scales, biases, x, y, p, e, i, a0, lane); break;
    case 3: affine_qmv_swiglu_rows<InT, ScT, 3>(w, scales, biases, x, y, p, e, i, a0, lane); break;
    case 4: affine_qmv_swiglu_rows<InT, ScT, 4>(w, scales, biases, x, y, p, e, i, a0, lane); break;
    case 5: affine_qmv_swiglu_rows<InT, ScT, 5>(w, scales, biases, x, y, p, e, i, a0, lane); break;
    case 6: affine_qmv_swiglu_rows<InT, ScT, 6>(w, scales, biases, x, y, p, e, i, a0, lane); break;
    case 8: affine_qmv_swiglu_rows<InT, ScT, 8>(w, scales, biases, x, y, p, e, i, a0, lane); break;
    default:
      if (lane == 0) {
        for (uint rr = 0; rr < kRows && a0 + rr < p.rows / 2; ++rr) {
          y[ulong(i) * (p.rows / 2) + a0 + rr] = static_cast<InT>(NAN);
        }
      }
      break;
  }
}

template <typename OutT, typename ScT, uint BITS>
inline void affine_dequant_8(
    const device uint* w,
    const device ScT* scales,
    const device ScT* biases,
    device OutT* out,
    constant AffineParams& p,
    uint src,
    uint j0) {
  const uint K = p.cols;
  const ulong row = src;
  const Quants8 q = load_quants8<BITS>(w + row * (K * BITS / 32), j0);
  const ulong sb = row * (K / p.group_size) + j0 / p.group_size;
  const float s = float(scales[sb]);
  const float b = float(biases[sb]);
  for (uint t = 0; t < 8; ++t) {
    // The reference's s*q + b: a multiply, then an add. The Metal compiler may fuse them
    // into one fma. With half or bfloat scales that changes nothing (s*q has at most
    // 11 + 8 significant bits, exact in f32); with float scales it can move the f32 value
    // by one ulp before the rounding to OutT. The CPU emulation is built with
    // -ffp-contract=off and checked bit for bit.
    out[t] = static_cast<OutT>(s * q.q[t] + b);
  }
}

template <typename OutT, typename ScT>
inline void affine_dequant_impl(
    const device uint* w,
    const device ScT* scales,
    const device ScT* biases,
    const device uint* ids,
    device OutT* out,
    constant AffineParams& p,
    uint3 pos) {
  constexpr uint kPerThread = 8;  // DEQUANT_VALUES_PER_THREAD on the host
  const uint j0 = pos.x * kPerThread;
  const uint i = pos.y;
  if (i >= p.out_rows || j0 >= p.cols) {
    return;
  }
  const uint src = p.has_ids != 0 ? ids[i] : i;
  device OutT* o = out + ulong(i) * p.cols + j0;
  if (src >= p.rows) {
    // A row id past the stacked matrix: NaN, rather than a read out of bounds.
    for (uint t = 0; t < kPerThread; ++t) {
      o[t] = static_cast<OutT>(NAN);
    }
    return;
  }
  switch (p.bits) {
    case 2: affine_dequant_8<OutT, ScT, 2>(w, scales, biases, o, p, src, j0); break;
    case 3: affine_dequant_8<OutT, ScT, 3>(w, scales, biases, o, p, src, j0); break;
    case 4: affine_dequant_8<OutT, ScT, 4>(w, scales, biases, o, p, src, j0); break;
    case 5: affine_dequant_8<OutT, ScT, 5>(w, scales, biases, o, p, src, j0); break;
    case 6: affine_dequant_8<OutT, ScT, 6>(w, scales, biases, o, p, src, j0); break;
    case 8: affine_dequant_8<OutT, ScT, 8>(w, scales, biases, o, p, src, j0); break;
    default:
      for (uint t = 0; t < kPerThread; ++t) {
        o[t] = static_cast<OutT>(NAN);
      }
      break;
  }
}

// The entry points, named as the host looks them up: affine_qmv_{InT}_{ScT} and
// affine_dequant_{OutT}_{ScT}. Plain kernels that forward to the templates, rather than
// explicit instantiations carrying [[host_name]]: clang outside Metal rejects attributes on
// explicit instantiations, and this way the CPU emulation compiles exactly these tokens and
// calls each kernel by its host name.
#define AFFINE_QMV(name, InT, ScT)                                                 \
  [[kernel]] void name(                                                            \
      const device uint* w [[buffer(0)]],      /* [E*R, K*bits/32] */              \
      const device ScT* scales [[buffer(1)]],  /* [E*R, K/group_size] */           \
      const device ScT* biases [[buffer(2)]],  /* [E*R, K/group_size] */           \
      const device InT* x [[buffer(3)]],       /* [X, K] */                        \
      const device uint* ids [[buffer(4)]],    /* [M], read if has_ids */          \
      device InT* y [[buffer(5)]],             /* [M, R] */                        \
      constant AffineParams& p [[buffer(6)]],                                      \
      uint3 tg [[threadgroup_position_in_grid]],                                   \
      uint simdgroup [[simdgroup_index_in_threadgroup]],                           \
      uint lane [[thread_index_in_simdgroup]]) {                                   \
    affine_qmv_impl<InT, ScT>(w, scales, biases, x, ids, y, p, tg, simdgroup,      \
                              lane);                                               \
  }

// y [M, R/2]: the SwiGLU activations of the gate (rows 0..R/2) and up (rows R/2..R) halves
// of each expert.
#define AFFINE_QMV_SWIGLU(name, InT, ScT)                                          \
  [[kernel]] void name(                                                            \
      const device uint* w [[buffer(0)]],      /* [E*R, K*bits/32] */              \
      const device ScT* scales [[buffer(1)]],  /* [E*R, K/group_size] */           \
      const device ScT* biases [[buffer(2)]],  /* [E*R, K/group_size] */           \
      const device InT* x [[buffer(3)]],       /* [X, K] */                        \
      const device uint* ids [[buffer(4)]],    /* [M], read if has_ids */          \
      device InT* y [[buffer(5)]],             /* [M, R/2] */                      \
      constant AffineParams& p [[buffer(6)]],                                      \
      uint3 tg [[threadgroup_position_in_grid]],                                   \
      uint simdgroup [[simdgroup_index_in_threadgroup]],                           \
      uint lane [[thread_index_in_simdgroup]]) {                                   \
    affine_qmv_swiglu_impl<InT, ScT>(w, scales, biases, x, ids, y, p, tg,          \
                                     simdgroup, lane);                             \
  }

// y [M, R]: the dense products of M = 2..8 rows of x in one pass over the weights.
#define AFFINE_QMV_PASS(name, InT, ScT)                                            \
  [[kernel]] void name(                                                            \
      const device uint* w [[buffer(0)]],      /* [R, K*bits/32] */                \
      const device ScT* scales [[buffer(1)]],  /* [R, K/group_size] */             \
      const device ScT* biases [[buffer(2)]],  /* [R, K/group_size] */             \
      const device InT* x [[buffer(3)]],       /* [M, K] */                        \
      device InT* y [[buffer(4)]],             /* [M, R] */                        \
      constant AffineParams& p [[buffer(5)]],                                      \
      uint3 tg [[threadgroup_position_in_grid]],                                   \
      uint simdgroup [[simdgroup_index_in_threadgroup]],                           \
      uint lane [[thread_index_in_simdgroup]]) {                                   \
    affine_qmv_pass_impl<InT, ScT>(w, scales, biases, x, y, p, tg, simdgroup,      \
                                   lane);                                          \
  }

#define AFFINE_DEQUANT(name, OutT, ScT)                                            \
  [[kernel]] void name(                                                            \
      const device uint* w [[buffer(0)]],      /* [E*R, K*bits/32] */              \
      const device ScT* scales [[buffer(1)]],  /* [E*R, K/group_size] */           \
      const device ScT* biases [[buffer(2)]],  /* [E*R, K/group_size] */           \
      const device uint* ids [[buffer(3)]],    /* [M] rows of E*R, if has_ids */   \
      device OutT* out [[buffer(4)]],          /* [M, K] */                        \
      constant AffineParams& p [[buffer(5)]],                                      \
      uint3 pos [[thread_position_in_grid]]) {                                     \
    affine_dequant_impl<OutT, ScT>(w, scales, biases, ids, out, p, pos);           \
  }

AFFINE_QMV(affine_qmv_f32_f32, float, float)
AFFINE_QMV(affine_qmv_f32_f16, float, half)
AFFINE_QMV(affine_qmv_f16_f32, half, float)
AFFINE_QMV(affine_qmv_f16_f16, half, half)

AFFINE_DEQUANT(affine_dequant_f32_f32, float, float)
AFFINE_DEQUANT(affine_dequant_f32_f16, float, half)
AFFINE_DEQUANT(affine_dequant_f16_f32, half, float)
AFFINE_DEQUANT(affine_dequant_f16_f16, half, half)

// bfloat exists from MSL 3.1 (macOS 14); the compiler then defines __HAVE_BFLOAT__, as
// candle's own shaders test. Without it the library still builds, minus these entry points.
#if defined(__HAVE_BFLOAT__)
AFFINE_QMV(affine_qmv_f32_bf16, float, bfloat)
AFFINE_QMV(affine_qmv_f16_bf16, half, bfloat)
AFFINE_QMV(affine_qmv_bf16_f32, bfloat, float)
AFFINE_QMV(affine_qmv_bf16_f16, bfloat, half)
AFFINE_QMV(affine_qmv_bf16_bf16, bfloat, bfloat)

AFFINE_DEQUANT(affine_dequant_f32_bf16, float, bfloat)
AFFINE_DEQUANT(affine_dequant_f16_bf16, half, bfloat)
AFFINE_DEQUANT(affine_dequant_bf16_f32, bfloat, float)
AFFINE_DEQUANT(affine_dequant_bf16_f16, bfloat, half)
AFFINE_DEQUANT(affine_dequant_bf16_bf16, bfloat, bfloat)
#endif

AFFINE_QMV_SWIGLU(affine_qmv_swiglu_f32_f32, float, float)
AFFINE_QMV_SWIGLU(affine_qmv_swiglu_f32_f16, float, half)
AFFINE_QMV_SWIGLU(affine_qmv_swiglu_f16_f32, half, float)
AFFINE_QMV_SWIGLU(affine_qmv_swiglu_f16_f16, half, half)
#if defined(__HAVE_BFLOAT__)
AFFINE_QMV_SWIGLU(affine_qmv_swiglu_f32_bf16, float, bfloat)
AFFINE_QMV_SWIGLU(affine_qmv_swiglu_f16_bf16, half, bfloat)
AFFINE_QMV_SWIGLU(affine_qmv_swiglu_bf16_f32, bfloat, float)
AFFINE_QMV_SWIGLU(affine_qmv_swiglu_bf16_f16, bfloat, half)
AFFINE_QMV_SWIGLU(affine_qmv_swiglu_bf16_bf16, bfloat, bfloat)
#endif

AFFINE_QMV_PASS(affine_qmv_pass_f32_f32, float, float)
AFFINE_QMV_PASS(affine_qmv_pass_f32_f16, float, half)
AFFINE_QMV_PASS(affine_qmv_pass_f16_f32, half, float)
AFFINE_QMV_PASS(affine_qmv_pass_f16_f16, half, half)
#if defined(__HAVE_BFLOAT__)
AFFINE_QMV_PASS(affine_qmv_pass_f32_bf16, float, bfloat)
AFFINE_QMV_PASS(affine_qmv_pass_f16_bf16, half, bfloat)
AFFINE_QMV_PASS(affine_qmv_pass_bf16_f32, bfloat, float)
AFFINE_QMV_PASS(affine_qmv_pass_bf16_f16, bfloat, half)
AFFINE_QMV_PASS(affine_qmv_pass_bf16_bf16, bfloat, bfloat)
#endif
