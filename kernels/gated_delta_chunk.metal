// Chunked gated-delta rule (Gated DeltaNet prefill) on simdgroup matrices: the same maths as
// the token-by-token recurrence of kernels/gated_delta.metal, 64 tokens at a time as matrix
// products (the WY/UT form of fla's chunk_gated_delta_rule).
//
// Per token (the recurrence this must match): S <- g*S; delta = (v - S.k)*beta;
// S <- S + delta (x) k; y = S.q, with S the [Dv, Dk] state of one value head.
// Over a chunk of C = 64 tokens from state S0, with G_i = prod_{s<=i} g_s taken as
// exp(gcum_i), gcum the cumsum of log g inside the chunk (every factor below is
// exp(gcum_i - gcum_j) with j <= i, or exp(gcum_i), never exp of a positive number):
//   L[i,j]  = beta_i (k_i.k_j) G_i/G_j  for j < i            (A = I + L, unit lower)
//   R       = beta (V - G K S0^T)                            ([C, Dv])
//   V'      = A^-1 R   (forward substitution; V' row i is token i's delta)
//   y       = G Q S0^T + (Q K^T (.) G_i/G_j for j <= i) V'
//   S       = G_C S0 + V'^T (K (.) G_C/G_j)
// which is fla's U - W S^T with U = A^-1 beta V, W = A^-1 beta G K, folded into one solve.
//
// Layout: a threadgroup runs one value head b, hv and 32 value columns (kBlockV) through
// every chunk: 4 simdgroups, simdgroup s owning columns 8s..8s+7. Each keeps its part of the
// state transposed, S^T [Dk, 8], as Dk/8 simdgroup_float8x8 tiles in registers from the first
// chunk to the last: the state is read once and written once per call in StT, so a bf16
// state is rounded once per call. Every product a simdgroup makes (K S^T, Q S^T, K^T V') stays
// inside its own columns; K K^T and Q K^T (36 lower 8x8 tiles each) are shared through
// threadgroup memory. Activation tiles are loaded from device memory as InT matrices and
// multiplied by float ones (mixed operand types, as llama.cpp's Metal matmuls use); every
// accumulation is float.
//
// Dispatch: threadgroups (Dv / 32, 1, B * Hv), 128 threads each, kScratchFloats * 4 bytes of
// threadgroup memory at index 0. The host must ensure Dk % 8 == 0, Dk <= 256, Dv % 32 == 0,
// Hv % Hk == 0, chunks * 64 <= steps; the kernel cannot report a bad shape. It writes y for
// the tokens of its chunks only: the host runs the tail (steps % 64 tokens) through the
// recurrence. Where mask[b, t] == 0 (padding) the token neither decays nor writes the state
// (log g = 0, beta = 0) and y is 0. Without a mask buffer 7 is never read (bind any).
// simdgroup matrices need MSL 2.3 (macOS 11); the bfloat entry points exist only with
// __HAVE_BFLOAT__ (MSL 3.1, macOS 14).

#include <metal_stdlib>
using namespace metal;

#include "params/gated_delta_chunk.h"

// Sizes, and the threadgroup memory map in floats.
enum : uint {
  kChunk = 64,                    // tokens per chunk, as fla
  kRowTiles = kChunk / 8,         // 8x8 tiles down a chunk
  kLowerTiles = kRowTiles * (kRowTiles + 1) / 2,  // tiles (i, j) with j <= i
  kBlockV = 32,                   // value columns per threadgroup
  kSimdgroups = kBlockV / 8,      // one 8-column tile each
  kThreads = kSimdgroups * 32,
  kMaxKeyTiles = 32,              // Dk <= 256
  kOffGcum = 0,                   // [64] cumsum of log g in the chunk
  kOffBeta = kOffGcum + kChunk,   // [64] beta, 0 at padding
  kOffKeep = kOffBeta + kChunk,   // [64] 1, or 0 at padding
  kOffDiag = kOffKeep + kChunk,   // [8][8x8] diag(exp(gcum)) per row tile
  kOffX = kOffDiag + kRowTiles * 64,  // [64][64] -L, then the masked Q K^T; staging
  kOffV = kOffX + kChunk * kChunk,    // [64][32] R, then V'
  kScratchFloats = kOffV + kChunk * kBlockV,
};

// The body of every instantiation below.
template <typename InT, typename StT>
inline void gated_delta_chunk_impl(
    const device InT* q,
    const device InT* k,
    const device InT* v,
    const device float* g,
    const device float* beta,
    device StT* state,
    device InT* y,
    const device float* mask,
    constant GdnChunkParams& p,
    threadgroup float* scratch,
    uint3 group,
    uint tid,
    uint sg,
    uint lane) {
  // log g of a decay in (0, 1], floored so that g = 0 (or a denormal) keeps the cumsum
  // finite: e^-80 is 0 to every product it enters.
  constexpr float kLogFloor = -80.0f;

  const uint n = group.z;  // b * Hv + hv
  const uint b = n / p.value_heads;
  const uint hv = n % p.value_heads;
  // Consecutive value heads share a key head (HF repeat_interleave), as in the recurrence.
  const uint hk = hv / (p.value_heads / p.key_heads);
  const uint block_col = group.x * kBlockV;  // first value column of the threadgroup
  const uint col0 = block_col + sg * 8;      // first value column of this simdgroup
  const uint key_tiles = p.key_dim / 8;
  const ulong qk_pitch = ulong(p.key_heads) * p.key_dim;  // elements from token to token
  const ulong v_pitch = ulong(p.value_heads) * p.value_dim;

  threadgroup float* gcum = scratch + kOffGcum;
  threadgroup float* betas = scratch + kOffBeta;
  threadgroup float* keeps = scratch + kOffKeep;
  threadgroup float* diag = scratch + kOffDiag;
  threadgroup float* x = scratch + kOffX;
  threadgroup float* vp = scratch + kOffV;
  // This simdgroup's 512 floats of x, for staging state and output tiles.
  threadgroup float* own = x + sg * 512;

  // The state tiles S^T[8i.., col0..]: element (key r, column c) is state[b, hv, col0 + c,
  // 8i + r], converted through threadgroup memory (a matrix loads only its own type).
  device StT* s_cols = state + (ulong(n) * p.value_dim + col0) * p.key_dim;
  simdgroup_float8x8 st[kMaxKeyTiles];
  for (uint i = 0; i < kMaxKeyTiles; ++i) {
    if (i < key_tiles) {
      for (uint e = lane; e < 64; e += 32) {
        own[e] = float(s_cols[ulong(e % 8) * p.key_dim + 8 * i + e / 8]);
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
      simdgroup_load(st[i], own, 8);
      simdgroup_barrier(mem_flags::mem_threadgroup);
    }
  }

  for (uint c = 0; c < p.chunks; ++c) {
    const uint t0 = c * kChunk;
    const ulong bt0 = ulong(b) * p.steps + t0;  // (b, t0) as a token index
    const device InT* k_chunk = k + (bt0 * p.key_heads + hk) * p.key_dim;
    const device InT* q_chunk = q + (bt0 * p.key_heads + hk) * p.key_dim;

    // Gates: the first two simdgroups take a token each, cumsum by prefix sums.
    if (sg < 2) {
      const ulong bt = bt0 + tid;
      const bool keep = p.has_mask == 0 || mask[bt] != 0.0f;
      const ulong at = bt * p.value_heads + hv;
      const float lg = keep ? max(log(g[at]), kLogFloor) : 0.0f;
      gcum[tid] = simd_prefix_inclusive_sum(lg);
      betas[tid] = keep ? beta[at] : 0.0f;
      keeps[tid] = keep ? 1.0f : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 1) {
      gcum[tid] += gcum[31];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = tid; e < kRowTiles * 64; e += kThreads) {
      const uint r = (e / 8) % 8;
      diag[e] = r == e % 8 ? exp(gcum[(e / 64) * 8 + r]) : 0.0f;
    }

    // K K^T, lower tiles, into x; and K S0^T for this simdgroup's columns into vp.
    for (uint tile = sg; tile < kLowerTiles; tile += kSimdgroups) {
      uint mi = 0;
      while ((mi + 1) * (mi + 2) / 2 <= tile) {
        ++mi;
      }
      const uint mj = tile - mi * (mi + 1) / 2;
      simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      for (uint i = 0; i < kMaxKeyTiles; ++i) {
        if (i < key_tiles) {
          simdgroup_matrix<InT, 8, 8> ka, kb;
          simdgroup_load(ka, k_chunk + 8 * mi * qk_pitch + 8 * i, qk_pitch);
          simdgroup_load(kb, k_chunk + 8 * mj * qk_pitch + 8 * i, qk_pitch, ulong2(0), true);
          simdgroup_multiply_accumulate(acc, ka, kb, acc);
        }
      }
      simdgroup_store(acc, x + 8 * mi * kChunk + 8 * mj, kChunk);
    }
    for (uint m = 0; m < kRowTiles; ++m) {
      simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      for (uint i = 0; i < kMaxKeyTiles; ++i) {
        if (i < key_tiles) {
          simdgroup_matrix<InT, 8, 8> ka;
          simdgroup_load(ka, k_chunk + 8 * m * qk_pitch + 8 * i, qk_pitch);
          simdgroup_multiply_accumulate(acc, ka, st[i], acc);
        }
      }
      simdgroup_store(acc, vp + 8 * m * kBlockV + 8 * sg, kBlockV);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // x <- -L (negated, so that the products below subtract); vp <- R.
    for (uint e = tid; e < kChunk * kChunk; e += kThreads) {
      const uint i = e / kChunk, j = e % kChunk;
      if (j < i) {
        x[e] *= -betas[i] * exp(gcum[i] - gcum[j]);
      }
    }
    for (uint e = tid; e < kChunk * kBlockV; e += kThreads) {
      const uint i = e / kBlockV;
      const float vi = float(v[(bt0 + i) * v_pitch + ulong(hv) * p.value_dim + block_col + e % kBlockV]);
      vp[e] = betas[i] * (vi - exp(gcum[i]) * vp[e]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // V' = A^-1 R, this simdgroup's columns, by row tiles: subtract the solved tiles above
    // (matrix products), then solve the unit lower 8x8 diagonal block row by row.
    for (uint m = 0; m < kRowTiles; ++m) {
      threadgroup float* tile = vp + 8 * m * kBlockV + 8 * sg;
      simdgroup_float8x8 acc;
      simdgroup_load(acc, tile, kBlockV);
      for (uint j = 0; j < m; ++j) {
        simdgroup_float8x8 l, u;
        simdgroup_load(l, x + 8 * m * kChunk + 8 * j, kChunk);
        simdgroup_load(u, vp + 8 * j * kBlockV + 8 * sg, kBlockV);
        simdgroup_multiply_accumulate(acc, l, u, acc);
      }
      simdgroup_store(acc, tile, kBlockV);
      simdgroup_barrier(mem_flags::mem_threadgroup);
      if (lane < 8) {
        threadgroup float* col = tile + lane;
        const threadgroup float* l_rows = x + 8 * m * kChunk + 8 * m;
        for (uint r = 1; r < 8; ++r) {
          float s = col[r * kBlockV];
          for (uint j = 0; j < r; ++j) {
            s += l_rows[r * kChunk + j] * col[j * kBlockV];
          }
          col[r * kBlockV] = s;
        }
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
    }
    // Every simdgroup is done with L before x takes Q K^T.
    threadgroup_barrier(mem_flags::mem_threadgroup);

    for (uint tile = sg; tile < kLowerTiles; tile += kSimdgroups) {
      uint mi = 0;
      while ((mi + 1) * (mi + 2) / 2 <= tile) {
        ++mi;
      }
      const uint mj = tile - mi * (mi + 1) / 2;
      simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      for (uint i = 0; i < kMaxKeyTiles; ++i) {
        if (i < key_tiles) {
          simdgroup_matrix<InT, 8, 8> qa, kb;
          simdgroup_load(qa, q_chunk + 8 * mi * qk_pitch + 8 * i, qk_pitch);
          simdgroup_load(kb, k_chunk + 8 * mj * qk_pitch + 8 * i, qk_pitch, ulong2(0), true);
          simdgroup_multiply_accumulate(acc, qa, kb, acc);
        }
      }
      simdgroup_store(acc, x + 8 * mi * kChunk + 8 * mj, kChunk);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // Causal (j <= i) decay; the upper half of the diagonal tiles is cleared, the tiles above
    // them are never read.
    for (uint e = tid; e < kChunk * kChunk; e += kThreads) {
      const uint i = e / kChunk, j = e % kChunk;
      if (j <= i) {
        x[e] *= exp(gcum[i] - gcum[j]);
      } else if (j / 8 == i / 8) {
        x[e] = 0.0f;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // y = diag(G) Q S0^T + P V', kept in registers until x is free.
    simdgroup_float8x8 out[kRowTiles];
    for (uint m = 0; m < kRowTiles; ++m) {
      simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      for (uint i = 0; i < kMaxKeyTiles; ++i) {
        if (i < key_tiles) {
          simdgroup_matrix<InT, 8, 8> qa;
          simdgroup_load(qa, q_chunk + 8 * m * qk_pitch + 8 * i, qk_pitch);
          simdgroup_multiply_accumulate(acc, qa, st[i], acc);
        }
      }
      simdgroup_float8x8 d;
      simdgroup_load(d, diag + 64 * m, 8);
      simdgroup_multiply(out[m], d, acc);
      for (uint j = 0; j <= m; ++j) {
        simdgroup_float8x8 pt, u;
        simdgroup_load(pt, x + 8 * m * kChunk + 8 * j, kChunk);
        simdgroup_load(u, vp + 8 * j * kBlockV + 8 * sg, kBlockV);
        simdgroup_multiply_accumulate(out[m], pt, u, out[m]);
      }
    }

    // S <- G_C S0 + V'^T (K G_C/G_j): scale V' rows (own columns), then K^T V' per key tile.
    simdgroup_barrier(mem_flags::mem_threadgroup);
    const float g_last = gcum[kChunk - 1];
    for (uint e = lane; e < kChunk * 8; e += 32) {
      const uint i = e / 8;
      vp[i * kBlockV + 8 * sg + e % 8] *= exp(g_last - gcum[i]);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    const simdgroup_float8x8 chunk_decay(exp(g_last));  // diagonal
    for (uint i = 0; i < kMaxKeyTiles; ++i) {
      if (i < key_tiles) {
        simdgroup_multiply(st[i], chunk_decay, st[i]);
        for (uint m = 0; m < kRowTiles; ++m) {
          simdgroup_matrix<InT, 8, 8> kt;
          simdgroup_float8x8 u;
          simdgroup_load(kt, k_chunk + 8 * m * qk_pitch + 8 * i, qk_pitch, ulong2(0), true);
          simdgroup_load(u, vp + 8 * m * kBlockV + 8 * sg, kBlockV);
          simdgroup_multiply_accumulate(st[i], kt, u, st[i]);
        }
      }
    }

    // y through this simdgroup's part of x, once no simdgroup reads Q K^T any more.
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint m = 0; m < kRowTiles; ++m) {
      simdgroup_store(out[m], own + 64 * m, 8);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = lane; e < kChunk * 8; e += 32) {
      const uint i = e / 8;
      const ulong at = (bt0 + i) * v_pitch + ulong(hv) * p.value_dim + col0 + e % 8;
      y[at] = keeps[i] != 0.0f ? static_cast<InT>(own[e]) : InT(0.0f);
    }
    // The next chunk's gates and products overwrite what this one still reads.
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  // The only rounding of the state in the call: StT, never InT.
  for (uint i = 0; i < kMaxKeyTiles; ++i) {
    if (i < key_tiles) {
      simdgroup_store(st[i], own, 8);
      simdgroup_barrier(mem_flags::mem_threadgroup);
      for (uint e = lane; e < 64; e += 32) {
        s_cols[ulong(e % 8) * p.key_dim + 8 * i + e / 8] = static_cast<StT>(own[e]);
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
    }
  }
}

// Entry points gated_delta_chunk_{InT}_{StT}, plain kernels forwarding to the template (see
// kernels/gated_delta.metal for why not explicit instantiations).
#define GDN_CHUNK_KERNEL(name, InT, StT)                                            \
  [[kernel]] void name(                                                             \
      const device InT* q [[buffer(0)]],      /* [B, T, Hk, Dk] */                  \
      const device InT* k [[buffer(1)]],      /* [B, T, Hk, Dk] */                  \
      const device InT* v [[buffer(2)]],      /* [B, T, Hv, Dv] */                  \
      const device float* g [[buffer(3)]],    /* [B, T, Hv], in (0, 1] */           \
      const device float* beta [[buffer(4)]], /* [B, T, Hv] */                      \
      device StT* state [[buffer(5)]],        /* [B, Hv, Dv, Dk], in place */       \
      device InT* y [[buffer(6)]],            /* [B, T, Hv, Dv], chunks' tokens */  \
      const device float* mask [[buffer(7)]], /* [B, T], read if has_mask */        \
      constant GdnChunkParams& p [[buffer(8)]],                                     \
      threadgroup float* scratch [[threadgroup(0)]], /* kScratchFloats */           \
      uint3 group [[threadgroup_position_in_grid]],                                 \
      uint tid [[thread_index_in_threadgroup]],                                     \
      uint sg [[simdgroup_index_in_threadgroup]],                                   \
      uint lane [[thread_index_in_simdgroup]]) {                                    \
    gated_delta_chunk_impl<InT, StT>(q, k, v, g, beta, state, y, mask, p, scratch,  \
                                     group, tid, sg, lane);                         \
  }

GDN_CHUNK_KERNEL(gated_delta_chunk_f32_f32, float, float)
GDN_CHUNK_KERNEL(gated_delta_chunk_f16_f32, half, float)

#if defined(__HAVE_BFLOAT__)
GDN_CHUNK_KERNEL(gated_delta_chunk_f32_bf16, float, bfloat)
GDN_CHUNK_KERNEL(gated_delta_chunk_f16_bf16, half, bfloat)
GDN_CHUNK_KERNEL(gated_delta_chunk_bf16_f32, bfloat, float)
GDN_CHUNK_KERNEL(gated_delta_chunk_bf16_bf16, bfloat, bfloat)
#endif
