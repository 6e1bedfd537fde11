// Chunked gated-delta rule (Gated DeltaNet prefill) on simdgroup matrices: the same maths as
// the token-by-token recurrence of kernels/gated_delta.metal, 64 tokens at a time as matrix
// products (the WY/UT form of fla's chunk_gated_delta_rule), as three passes of which only the
// second walks the chunks in sequence (the split of kernels/gated_delta_chunk.cu).
//
// Per token (the recurrence this must match): S <- g*S; delta = (v - S.k)*beta;
// S <- S + delta (x) k; y = S.q, with S the [Dv, Dk] state of one value head.
// Over a chunk of C = 64 tokens from state S0 (h = S0^T, [Dk, Dv]), with G_i = prod_{s<=i} g_s
// taken as exp(gcum_i), gcum the cumsum of log g inside the chunk (every factor below is
// exp(gcum_i - gcum_j) with j <= i, or exp(gcum_i), never exp of a positive number):
//   L[i,j]  = beta_i (k_i.k_j) G_i/G_j  for j < i            (A = I + L, unit lower)
//   W       = A^-1 diag(beta G) K,  U = A^-1 diag(beta) V     (forward substitution)
//   V'      = U - W h                                        (row i: token i's delta)
//   y       = G Q h + (Q K^T (.) G_i/G_j for j <= i) V'
//   h'      = G_C h + K^T (V' (.) G_C/G_j)
//
// Pass 1, gated_delta_chunk_prep_<in>: threadgroups (chunks, 1, B * Hv), all in parallel: the
//   gates (gcum to device memory), -L in threadgroup memory, then -W and U by forward
//   substitution, 8 columns per simdgroup at a time, to device memory in f32 (W negated, so
//   that pass 2 adds a product).
// Pass 2, gated_delta_chunk_state_<in>_<st>: threadgroups (Dv / 32, 1, B * Hv), the chunks in
//   sequence: simdgroup s owns value columns 8s..8s+7 and keeps its part of h as Dk/8
//   simdgroup_float8x8 tiles in registers from the first chunk to the last (the state is read
//   once and written once per call in StT: a bf16 state is rounded once per call). Per chunk:
//   h stored to device memory for pass 3, V' = U + (-W) h written over U, h advanced.
// Pass 3, gated_delta_chunk_out_<in>: threadgroups (chunks, 1, B * Hv), all in parallel: Q K^T
//   (36 lower 8x8 tiles) with the causal decay in threadgroup memory, then y by 32-column
//   slabs, each simdgroup 8 columns.
// Activation tiles are loaded from device memory as InT matrices and multiplied by float ones
// (mixed operand types, as llama.cpp's Metal matmuls use); every accumulation is float.
//
// Buffers: q, k [B,T,Hk,Dk]; v, y [B,T,Hv,Dv] (InT); g (decay in (0,1], not log), beta
// [B,T,Hv]; state [B,Hv,Dv,Dk] (StT, in place); mask [B,T] (read only if has_mask: bind any
// otherwise). Scratch in f32, n = b * Hv + hv, C = chunks, each element written by one pass
// before a later one reads it: gcum [n][C*64], w [n][C][64][Dk], u [n][C][64][Dv],
// h [n][C][Dk][Dv]. Threadgroup memory at index 0: kPrepFloats, kStateFloats, kOutFloats
// floats (all under Metal's 32 KB). The host must ensure Dk % 8 == 0, Dk <= 256,
// Dv % 32 == 0, Hv % Hk == 0, 1 <= chunks, chunks * 64 <= steps; the kernels cannot report a
// bad shape. y is written for the tokens of the chunks only: the host runs the tail (steps % 64
// tokens) through the recurrence. Where mask[b, t] == 0 (padding) the token neither decays nor
// writes the state (log g = 0, beta = 0) and y is 0.
// simdgroup matrices need MSL 2.3 (macOS 11); the bfloat entry points exist only with
// __HAVE_BFLOAT__ (MSL 3.1, macOS 14).

#include <metal_stdlib>
using namespace metal;

#include "params/gated_delta_chunk.h"

enum : uint {
  kChunk = 64,                    // tokens per chunk, as fla
  kRowTiles = kChunk / 8,         // 8x8 tiles down a chunk
  kLowerTiles = kRowTiles * (kRowTiles + 1) / 2,  // tiles (i, j) with j <= i
  kBlockV = 32,                   // value columns per threadgroup of pass 2, per slab of pass 3
  kSimdgroups = kBlockV / 8,      // one 8-column tile each
  kThreads = kSimdgroups * 32,
  kMaxKeyTiles = 32,              // Dk <= 256
  kOwn = 8 * kChunk,              // one simdgroup's staging: a 64x8 column block
  // Pass 1: gcum, beta, G; -L [64][64]; a 64x8 right-hand side per simdgroup.
  kPrepGcum = 0,
  kPrepBeta = kPrepGcum + kChunk,
  kPrepG = kPrepBeta + kChunk,
  kPrepX = kPrepG + kChunk,
  kPrepRhs = kPrepX + kChunk * kChunk,
  kPrepFloats = kPrepRhs + kSimdgroups * kOwn,
  // Pass 2: gcum; V' [64][32] decayed to the chunk's end; a 64x8 staging per simdgroup.
  kStateGcum = 0,
  kStateV = kStateGcum + kChunk,
  kStateOwn = kStateV + kChunk * kBlockV,
  kStateFloats = kStateOwn + kSimdgroups * kOwn,
  // Pass 3: gcum, keep; diag(exp(gcum)) per row tile; P [64][64]; a 64x8 staging per simdgroup.
  kOutGcum = 0,
  kOutKeep = kOutGcum + kChunk,
  kOutDiag = kOutKeep + kChunk,
  kOutX = kOutDiag + kRowTiles * 64,
  kOutOwn = kOutX + kChunk * kChunk,
  kOutFloats = kOutOwn + kSimdgroups * kOwn,
};

// Where one value head (and chunk) finds its rows.
struct ChunkHead {
  uint n, b, hv, hk;
};

inline ChunkHead chunk_head(constant GdnChunkParams& p, uint n) {
  ChunkHead h;
  h.n = n;  // b * Hv + hv
  h.b = n / p.value_heads;
  h.hv = n % p.value_heads;
  // Consecutive value heads share a key head (HF repeat_interleave), as in the recurrence.
  h.hk = h.hv / (p.value_heads / p.key_heads);
  return h;
}

// x[i][j] for the 36 lower 8x8 tiles: rows of a (8mi..) times rows of b (8mj..) transposed,
// over Dk; a and b are InT rows of pitch `pitch`.
template <typename InT>
inline void lower_products(threadgroup float* x, const device InT* a, const device InT* b, ulong pitch,
                           uint key_tiles, uint sg) {
  for (uint tile = sg; tile < kLowerTiles; tile += kSimdgroups) {
    // The lower tile `tile`: (mi, mj), mj <= mi.
    uint mi = 0;
    while ((mi + 1) * (mi + 2) / 2 <= tile) {
      ++mi;
    }
    const uint mj = tile - mi * (mi + 1) / 2;
    simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint i = 0; i < kMaxKeyTiles; ++i) {
      if (i < key_tiles) {
        simdgroup_matrix<InT, 8, 8> ta, tb;
        simdgroup_load(ta, a + 8 * mi * pitch + 8 * i, pitch);
        simdgroup_load(tb, b + 8 * mj * pitch + 8 * i, pitch, ulong2(0), true);
        simdgroup_multiply_accumulate(acc, ta, tb, acc);
      }
    }
    simdgroup_store(acc, x + 8 * mi * kChunk + 8 * mj, kChunk);
  }
}

// ---- Pass 1 ---------------------------------------------------------------------------------
template <typename InT>
inline void gated_delta_chunk_prep_impl(
    const device InT* k,
    const device InT* v,
    const device float* g,
    const device float* beta,
    const device float* mask,
    device float* gcum_out,
    device float* w_out,
    device float* u_out,
    constant GdnChunkParams& p,
    threadgroup float* scratch,
    uint3 group,
    uint tid,
    uint sg,
    uint lane) {
  const ChunkHead hd = chunk_head(p, group.z);
  const uint chunk = group.x;
  const uint dk = p.key_dim, dv = p.value_dim;
  const ulong bt0 = ulong(hd.b) * p.steps + ulong(chunk) * kChunk;  // (b, t0) as a token index
  const ulong nc = ulong(hd.n) * p.chunks + chunk;
  const ulong qk_pitch = ulong(p.key_heads) * dk;
  const ulong v_pitch = ulong(p.value_heads) * dv;
  const device InT* k_chunk = k + (bt0 * p.key_heads + hd.hk) * dk;
  threadgroup float* gcum = scratch + kPrepGcum;
  threadgroup float* betas = scratch + kPrepBeta;
  threadgroup float* gexp = scratch + kPrepG;
  threadgroup float* x = scratch + kPrepX;
  threadgroup float* rhs = scratch + kPrepRhs + sg * kOwn;
  // log g of a decay in (0, 1], floored so that g = 0 (or a denormal) keeps the cumsum
  // finite: e^-80 is 0 to every product it enters.
  constexpr float kLogFloor = -80.0f;

  // Gates: the first two simdgroups take a token each, cumsum by prefix sums.
  if (sg < 2) {
    const ulong bt = bt0 + tid;
    const bool keep = p.has_mask == 0 || mask[bt] != 0.0f;
    const ulong at = bt * p.value_heads + hd.hv;
    const float lg = keep ? max(log(g[at]), kLogFloor) : 0.0f;
    gcum[tid] = simd_prefix_inclusive_sum(lg);
    betas[tid] = keep ? beta[at] : 0.0f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 1) {
    gcum[tid] += gcum[31];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid < kChunk) {
    gexp[tid] = exp(gcum[tid]);
    gcum_out[nc * kChunk + tid] = gcum[tid];
  }

  lower_products(x, k_chunk, k_chunk, qk_pitch, dk / 8, sg);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  // x <- -L (negated, so that the products below subtract).
  for (uint e = tid; e < kChunk * kChunk; e += kThreads) {
    const uint i = e / kChunk, j = e % kChunk;
    if (j < i) {
      x[e] *= -betas[i] * exp(gcum[i] - gcum[j]);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // [-W | U] = A^-1 [-diag(beta G) K | diag(beta) V], 8 columns per simdgroup at a time.
  const uint key_cols = dk / 8, cols = key_cols + dv / 8;
  for (uint ct = sg; ct < cols; ct += kSimdgroups) {
    const bool is_w = ct < key_cols;
    for (uint e = lane; e < kOwn; e += 32) {
      const uint i = e / 8, c = e % 8;
      rhs[e] = is_w ? -betas[i] * gexp[i] * float(k_chunk[i * qk_pitch + 8 * ct + c])
                    : betas[i] * float(v[(bt0 + i) * v_pitch + ulong(hd.hv) * dv + 8 * (ct - key_cols) + c]);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    // By row tiles: subtract the solved tiles above (matrix products), then solve the unit
    // lower 8x8 diagonal block row by row.
    for (uint m = 0; m < kRowTiles; ++m) {
      threadgroup float* tile = rhs + 64 * m;
      simdgroup_float8x8 acc;
      simdgroup_load(acc, tile, 8);
      for (uint j = 0; j < m; ++j) {
        simdgroup_float8x8 l, solved;
        simdgroup_load(l, x + 8 * m * kChunk + 8 * j, kChunk);
        simdgroup_load(solved, rhs + 64 * j, 8);
        simdgroup_multiply_accumulate(acc, l, solved, acc);
      }
      simdgroup_store(acc, tile, 8);
      simdgroup_barrier(mem_flags::mem_threadgroup);
      if (lane < 8) {
        threadgroup float* col = tile + lane;
        const threadgroup float* l_rows = x + 8 * m * kChunk + 8 * m;
        for (uint r = 1; r < 8; ++r) {
          float s = col[r * 8];
          for (uint j = 0; j < r; ++j) {
            s += l_rows[r * kChunk + j] * col[j * 8];
          }
          col[r * 8] = s;
        }
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (uint e = lane; e < kOwn; e += 32) {
      const uint i = e / 8, c = e % 8;
      if (is_w) {
        w_out[(nc * kChunk + i) * dk + 8 * ct + c] = rhs[e];
      } else {
        u_out[(nc * kChunk + i) * dv + 8 * (ct - key_cols) + c] = rhs[e];
      }
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
  }
}

// ---- Pass 2 ---------------------------------------------------------------------------------
template <typename InT, typename StT>
inline void gated_delta_chunk_state_impl(
    const device InT* k,
    const device float* gcum_in,
    const device float* w_neg,
    device float* uv,
    device float* h_out,
    device StT* state,
    constant GdnChunkParams& p,
    threadgroup float* scratch,
    uint3 group,
    uint tid,
    uint sg,
    uint lane) {
  const ChunkHead hd = chunk_head(p, group.z);
  const uint dk = p.key_dim, dv = p.value_dim;
  const uint col0 = group.x * kBlockV + sg * 8;  // first value column of this simdgroup
  const uint key_tiles = dk / 8;
  const ulong qk_pitch = ulong(p.key_heads) * dk;
  threadgroup float* gcum = scratch + kStateGcum;
  threadgroup float* vp = scratch + kStateV;
  threadgroup float* own = scratch + kStateOwn + sg * kOwn;

  // The state tiles h[8i.., col0..]: element (key r, column c) is state[b, hv, col0 + c,
  // 8i + r], converted through threadgroup memory (a matrix loads only its own type).
  device StT* s_cols = state + (ulong(hd.n) * dv + col0) * dk;
  simdgroup_float8x8 st[kMaxKeyTiles];
  for (uint i = 0; i < kMaxKeyTiles; ++i) {
    if (i < key_tiles) {
      for (uint e = lane; e < 64; e += 32) {
        own[e] = float(s_cols[ulong(e % 8) * dk + 8 * i + e / 8]);
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
      simdgroup_load(st[i], own, 8);
      simdgroup_barrier(mem_flags::mem_threadgroup);
    }
  }

  for (uint c = 0; c < p.chunks; ++c) {
    const ulong bt0 = ulong(hd.b) * p.steps + ulong(c) * kChunk;
    const ulong nc = ulong(hd.n) * p.chunks + c;
    const device InT* k_chunk = k + (bt0 * p.key_heads + hd.hk) * dk;
    if (tid < kChunk) {
      gcum[tid] = gcum_in[nc * kChunk + tid];
    }
    // h before this chunk, for pass 3.
    device float* h_c = h_out + nc * dk * dv + col0;
    for (uint i = 0; i < kMaxKeyTiles; ++i) {
      if (i < key_tiles) {
        simdgroup_store(st[i], h_c + 8 * i * ulong(dv), dv);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // V' = U + (-W) h, over U, and into vp for the state update.
    device float* u_c = uv + nc * kChunk * dv + col0;
    const device float* w_c = w_neg + nc * kChunk * dk;
    for (uint m = 0; m < kRowTiles; ++m) {
      simdgroup_float8x8 acc;
      simdgroup_load(acc, u_c + 8 * m * ulong(dv), dv);
      for (uint i = 0; i < kMaxKeyTiles; ++i) {
        if (i < key_tiles) {
          simdgroup_float8x8 wt;
          simdgroup_load(wt, w_c + 8 * m * ulong(dk) + 8 * i, dk);
          simdgroup_multiply_accumulate(acc, wt, st[i], acc);
        }
      }
      simdgroup_store(acc, u_c + 8 * m * ulong(dv), dv);
      simdgroup_store(acc, vp + 8 * m * kBlockV + 8 * sg, kBlockV);
    }

    // h <- G_C h + K^T (V' G_C/G_j): scale V' rows (own columns), then K^T V' per key tile.
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
          simdgroup_float8x8 vt;
          simdgroup_load(kt, k_chunk + 8 * m * qk_pitch + 8 * i, qk_pitch, ulong2(0), true);
          simdgroup_load(vt, vp + 8 * m * kBlockV + 8 * sg, kBlockV);
          simdgroup_multiply_accumulate(st[i], kt, vt, st[i]);
        }
      }
    }
    // The next chunk's gates overwrite what this one still reads.
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  // The only rounding of the state in the call: StT, never InT.
  for (uint i = 0; i < kMaxKeyTiles; ++i) {
    if (i < key_tiles) {
      simdgroup_store(st[i], own, 8);
      simdgroup_barrier(mem_flags::mem_threadgroup);
      for (uint e = lane; e < 64; e += 32) {
        s_cols[ulong(e % 8) * dk + 8 * i + e / 8] = static_cast<StT>(own[e]);
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
    }
  }
}

// ---- Pass 3 ---------------------------------------------------------------------------------
template <typename InT>
inline void gated_delta_chunk_out_impl(
    const device InT* q,
    const device InT* k,
    const device float* gcum_in,
    const device float* h_in,
    const device float* v_new,
    const device float* mask,
    device InT* y,
    constant GdnChunkParams& p,
    threadgroup float* scratch,
    uint3 group,
    uint tid,
    uint sg,
    uint lane) {
  const ChunkHead hd = chunk_head(p, group.z);
  const uint chunk = group.x;
  const uint dk = p.key_dim, dv = p.value_dim;
  const uint key_tiles = dk / 8;
  const ulong bt0 = ulong(hd.b) * p.steps + ulong(chunk) * kChunk;
  const ulong nc = ulong(hd.n) * p.chunks + chunk;
  const ulong qk_pitch = ulong(p.key_heads) * dk;
  const ulong v_pitch = ulong(p.value_heads) * dv;
  const device InT* k_chunk = k + (bt0 * p.key_heads + hd.hk) * dk;
  const device InT* q_chunk = q + (bt0 * p.key_heads + hd.hk) * dk;
  threadgroup float* gcum = scratch + kOutGcum;
  threadgroup float* keeps = scratch + kOutKeep;
  threadgroup float* diag = scratch + kOutDiag;
  threadgroup float* x = scratch + kOutX;
  threadgroup float* own = scratch + kOutOwn + sg * kOwn;

  if (tid < kChunk) {
    gcum[tid] = gcum_in[nc * kChunk + tid];
    keeps[tid] = p.has_mask == 0 || mask[bt0 + tid] != 0.0f ? 1.0f : 0.0f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint e = tid; e < kRowTiles * 64; e += kThreads) {
    const uint r = (e / 8) % 8;
    diag[e] = r == e % 8 ? exp(gcum[(e / 64) * 8 + r]) : 0.0f;
  }
  lower_products(x, q_chunk, k_chunk, qk_pitch, key_tiles, sg);
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

  // y = diag(G) Q h + P V', by 32-column slabs, this simdgroup's 8 columns of each.
  const device float* h_c = h_in + nc * dk * dv;
  const device float* v_c = v_new + nc * kChunk * dv;
  for (uint slab = 0; slab < dv; slab += kBlockV) {
    const uint col0 = slab + 8 * sg;
    for (uint m = 0; m < kRowTiles; ++m) {
      simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      for (uint i = 0; i < kMaxKeyTiles; ++i) {
        if (i < key_tiles) {
          simdgroup_matrix<InT, 8, 8> qa;
          simdgroup_float8x8 ht;
          simdgroup_load(qa, q_chunk + 8 * m * qk_pitch + 8 * i, qk_pitch);
          simdgroup_load(ht, h_c + 8 * i * ulong(dv) + col0, dv);
          simdgroup_multiply_accumulate(acc, qa, ht, acc);
        }
      }
      simdgroup_float8x8 d, out;
      simdgroup_load(d, diag + 64 * m, 8);
      simdgroup_multiply(out, d, acc);
      for (uint j = 0; j <= m; ++j) {
        simdgroup_float8x8 pt, vt;
        simdgroup_load(pt, x + 8 * m * kChunk + 8 * j, kChunk);
        simdgroup_load(vt, v_c + 8 * j * ulong(dv) + col0, dv);
        simdgroup_multiply_accumulate(out, pt, vt, out);
      }
      simdgroup_store(out, own + 64 * m, 8);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = lane; e < kChunk * 8; e += 32) {
      const uint i = e / 8;
      const ulong at = (bt0 + i) * v_pitch + ulong(hd.hv) * dv + col0 + e % 8;
      y[at] = keeps[i] != 0.0f ? static_cast<InT>(own[e]) : InT(0.0f);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
  }
}

// Entry points, plain kernels forwarding to the templates (see kernels/gated_delta.metal for
// why not explicit instantiations).
#define GDN_CHUNK_PREP_KERNEL(name, InT)                                              \
  [[kernel]] void name(                                                               \
      const device InT* k [[buffer(0)]],        /* [B, T, Hk, Dk] */                  \
      const device InT* v [[buffer(1)]],        /* [B, T, Hv, Dv] */                  \
      const device float* g [[buffer(2)]],      /* [B, T, Hv], in (0, 1] */           \
      const device float* beta [[buffer(3)]],   /* [B, T, Hv] */                      \
      const device float* mask [[buffer(4)]],   /* [B, T], read if has_mask */        \
      device float* gcum [[buffer(5)]],         /* [n][C * 64] */                     \
      device float* w [[buffer(6)]],            /* [n][C][64][Dk], negated */         \
      device float* u [[buffer(7)]],            /* [n][C][64][Dv] */                  \
      constant GdnChunkParams& p [[buffer(8)]],                                       \
      threadgroup float* scratch [[threadgroup(0)]], /* kPrepFloats */                \
      uint3 group [[threadgroup_position_in_grid]],                                   \
      uint tid [[thread_index_in_threadgroup]],                                       \
      uint sg [[simdgroup_index_in_threadgroup]],                                     \
      uint lane [[thread_index_in_simdgroup]]) {                                      \
    gated_delta_chunk_prep_impl<InT>(k, v, g, beta, mask, gcum, w, u, p, scratch,     \
                                     group, tid, sg, lane);                           \
  }

#define GDN_CHUNK_STATE_KERNEL(name, InT, StT)                                        \
  [[kernel]] void name(                                                               \
      const device InT* k [[buffer(0)]],        /* [B, T, Hk, Dk] */                  \
      const device float* gcum [[buffer(1)]],   /* from pass 1 */                     \
      const device float* w [[buffer(2)]],      /* from pass 1 */                     \
      device float* u [[buffer(3)]],            /* U in, V' out */                    \
      device float* h [[buffer(4)]],            /* [n][C][Dk][Dv] */                  \
      device StT* state [[buffer(5)]],          /* [B, Hv, Dv, Dk], in place */       \
      constant GdnChunkParams& p [[buffer(6)]],                                       \
      threadgroup float* scratch [[threadgroup(0)]], /* kStateFloats */               \
      uint3 group [[threadgroup_position_in_grid]],                                   \
      uint tid [[thread_index_in_threadgroup]],                                       \
      uint sg [[simdgroup_index_in_threadgroup]],                                     \
      uint lane [[thread_index_in_simdgroup]]) {                                      \
    gated_delta_chunk_state_impl<InT, StT>(k, gcum, w, u, h, state, p, scratch,       \
                                           group, tid, sg, lane);                     \
  }

#define GDN_CHUNK_OUT_KERNEL(name, InT)                                               \
  [[kernel]] void name(                                                               \
      const device InT* q [[buffer(0)]],        /* [B, T, Hk, Dk] */                  \
      const device InT* k [[buffer(1)]],        /* [B, T, Hk, Dk] */                  \
      const device float* gcum [[buffer(2)]],   /* from pass 1 */                     \
      const device float* h [[buffer(3)]],      /* from pass 2 */                     \
      const device float* v_new [[buffer(4)]],  /* from pass 2 */                     \
      const device float* mask [[buffer(5)]],   /* [B, T], read if has_mask */        \
      device InT* y [[buffer(6)]],              /* [B, T, Hv, Dv], chunks' tokens */  \
      constant GdnChunkParams& p [[buffer(7)]],                                       \
      threadgroup float* scratch [[threadgroup(0)]], /* kOutFloats */                 \
      uint3 group [[threadgroup_position_in_grid]],                                   \
      uint tid [[thread_index_in_threadgroup]],                                       \
      uint sg [[simdgroup_index_in_threadgroup]],                                     \
      uint lane [[thread_index_in_simdgroup]]) {                                      \
    gated_delta_chunk_out_impl<InT>(q, k, gcum, h, v_new, mask, y, p, scratch,        \
                                    group, tid, sg, lane);                            \
  }

GDN_CHUNK_PREP_KERNEL(gated_delta_chunk_prep_f32, float)
GDN_CHUNK_PREP_KERNEL(gated_delta_chunk_prep_f16, half)
GDN_CHUNK_STATE_KERNEL(gated_delta_chunk_state_f32_f32, float, float)
GDN_CHUNK_STATE_KERNEL(gated_delta_chunk_state_f16_f32, half, float)
GDN_CHUNK_OUT_KERNEL(gated_delta_chunk_out_f32, float)
GDN_CHUNK_OUT_KERNEL(gated_delta_chunk_out_f16, half)

#if defined(__HAVE_BFLOAT__)
GDN_CHUNK_PREP_KERNEL(gated_delta_chunk_prep_bf16, bfloat)
GDN_CHUNK_STATE_KERNEL(gated_delta_chunk_state_f32_bf16, float, bfloat)
GDN_CHUNK_STATE_KERNEL(gated_delta_chunk_state_f16_bf16, half, bfloat)
GDN_CHUNK_STATE_KERNEL(gated_delta_chunk_state_bf16_f32, bfloat, float)
GDN_CHUNK_STATE_KERNEL(gated_delta_chunk_state_bf16_bf16, bfloat, bfloat)
GDN_CHUNK_OUT_KERNEL(gated_delta_chunk_out_bf16, bfloat)
#endif
