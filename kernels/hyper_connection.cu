// The hyper-connection kernels of a qwen4_exp decode step on CUDA: the twins of
// kernels/hyper_connection.metal, with crates/gdn-ops/src/ops/hyper_connection/cpu.rs as the
// reference both must match (its mod.rs holds the spec).
//   hc_inject_norm: w = InT(2 * InT(sigmoid(InT(g[n,s] / S))))
//                   sum = InT(hs + InT(w * y[n,j]))                    (has_inject)
//                   with K = slots > 0: y[n,j] = InT(sum_k slot_weights[n,k] * y[n,k,j]),
//                   a MoE block's slot outputs summed as moe_combine sums them
//                   normed = InT(sum * rsqrt(mean_j sum^2 + eps) * weight[s,j])   (has_norm)
//   hc_act:         a[i] = InT(silu(InT(d[i] / S)))     (d: the down product's output)
//   hc_mix:         x[n,j] = InT((1/S) * sum_s InT(InT(sigmoid(u[n,s,j])) * normed[n,s,j]))
//   hc_up_mix:      hc_act, u[n,s,j] = InT(W[s*H+j] . a[n]) with the affine up matrix W
//                   [S*H, R] (f32 products and sums, affine_word_dot.h's per-word sum; the
//                   words split among L lanes a stream), then hc_mix (streams in order)
//
// ENTRY POINTS (extern "C"; <t> in {f32, f16, bf16}):
//   hc_inject_norm_<t>(hs, y, gate, weight (f32), slot_weights (f32), sum, normed,
//                      HcInjectNormParams p)
//     block = any multiple of 32 threads from ceil(H / kPer) up to 1024 (the host takes a
//     thread a column when the stream rows are fewer than the SMs: ops/hyper_connection/mod.rs
//     inject_row_threads), one block per stream row; grid = N * S. H <= kPer * 1024 = 8192
//     (MAX_COLS on the host).
//     Without an injection y, gate and sum are never touched; without a norm weight and
//     normed neither; slot_weights only with slots > 0: pass any valid pointer.
//   hc_inject_norm_cluster_<t>(same arguments): a stream row over the kClusterBlocks = 8
//     blocks of a thread-block cluster (sm_90), the decode form (ops/hyper_connection/mod.rs
//     inject_uses_cluster): block c of row r = blockIdx.x / 8 takes columns [c * span, (c + 1) *
//     span), span = ceil(H / 8), block = inject_cluster_threads (a thread a column: 320 at H =
//     2 560), grid = N * S * 8. sum is the one-block kernel's bit for bit (a column's
//     arithmetic does not depend on the split); the norm's sum of squares is summed per block,
//     then the 8 partials in rank order through distributed shared memory: a fixed order (the
//     same bits run to run, in every block), not the one-block kernel's. Why: one block a row
//     put a decode step's 4 rows on 4 of 132 SMs, a load → block reduce → store latency chain
//     of 6.4–6.8 µs (9.0 with a MoE block's slots) under Nsight Compute (docs/perf-notes-gpu.md,
//     issue 25).
//   hc_act_<t>(d, a, HcActParams p)
//     block = 256 threads (MIX_THREADS), one value each; grid = ceil(len / 256).
//   hc_mix_<t>(up, normed, x, HcMixParams p)
//     block = 256 threads (MIX_THREADS), one output value each; grid = ceil(N * H / 256).
//   hc_up_mix_<t>_<s>(packed, scales, biases, d, normed, x, HcUpMixParams p)
//     <s>: the up matrix's scale and bias type. block = (32, W = 4) (UP_MIX_WARPS), one warp
//     per output value x[n, j], j = blockIdx.x * W + threadIdx.y, n = blockIdx.y; grid =
//     (ceil(H / W), N); dynamic shared memory R floats (the token's activations, recomputed
//     by every block). bits 2, 4 or 8, groups of whole words, R <= 8192 (MAX_RANK). Within a
//     warp the S streams' dots run side by side, L lanes each (up_mix_groups).
//
// A decode step's residual is 4 streams of a few thousand values: the composed ops spent 25
// launches a hyper-connection on them. Each thread of hc_inject_norm holds its PER <= kPer
// columns of its stream in registers between the injection and the norm (as add_rms_norm.cu
// does), PER = ceil(H / threads) rounded up to 1, 2, 3, 4 or kPer.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/hyper_connection.cu

#ifndef HYPER_CONNECTION_NO_CLUSTER
#include <cooperative_groups.h>
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/hyper_connection.h"
#include "cuda_block_sum.h"
#include "cuda_convert.h"
#include "affine_word_dot.h"

namespace hyper_connection {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

// Columns per thread, held in registers (PER_THREAD on the host).
constexpr uint32_t kPer = 8;

template <typename T>
__device__ __forceinline__ float rounded(float x) {
  return to_f32(from_f32<T>(x));
}

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

using cuda_block_sum::block_sum;

// Slots of a MoE block's outputs loaded together in hc_inject_norm's slot sum at PER columns a
// thread (each column's sum still adds them in slot order): 12 at one column a thread (a
// cluster's block at the release: a decode step's 11 slots in one round trip, the tail
// predicated), 4 up to 3 columns a thread (12 loads in flight), 1 from 4 (within the 64
// registers of a 1 024-thread block: more spilled).
template <uint32_t PER>
__device__ constexpr uint32_t slots_together() {
  return PER == 1 ? 12 : PER <= 3 ? 4 : 1;
}

// hc_inject_norm's buffers (see the entry points).
template <typename T>
struct InjectBuffers {
  const T* hs;
  const T* y;
  const T* gate;
  const float* weight;
  const float* slot_weights;
  T* sum;
  T* normed;
};

// The columns [first, end) of one stream row (token n = row / S, stream s = row % S) that one
// block holds, PER columns a thread (PER >= ceil((end - first) / threads): the loops are
// unrolled, so a thread walks only the columns it may hold — a decode step's 1 024 threads a
// row hold 3 of H = 2 560, where kPer = 8 unrolled made 8 predicated slots of every load and
// product), with the thread index and the shared scratch as arguments. The one-block kernel
// passes the whole row; a cluster's block its share (hc_inject_norm_cluster_*). The norm's sum
// of squares: the block's (block_sum), then row_squares(block's sum) the row's — the block's
// own sum for the one-block kernel, the cluster's partials in rank order for a cluster — so
// that both kernels run this one body, on the GPU and on the emulator alike.
template <typename T, uint32_t PER, typename RowSquares>
__device__ __forceinline__ void inject_norm_cols(const InjectBuffers<T>& b,
                                                 const HcInjectNormParams& p, uint32_t row,
                                                 uint32_t first, uint32_t end, uint32_t tid,
                                                 uint32_t threads, float* warp_sums,
                                                 RowSquares row_squares) {
  const T* __restrict__ hs = b.hs;
  const T* __restrict__ y = b.y;
  const T* __restrict__ gate = b.gate;
  const float* __restrict__ weight = b.weight;
  const float* __restrict__ slot_weights = b.slot_weights;
  T* __restrict__ sum = b.sum;
  T* __restrict__ normed = b.normed;
  const uint32_t n = row / p.streams, s = row % p.streams;
  const size_t base = (size_t)row * p.cols;
  const bool inject = p.has_inject != 0;
  float v[PER];
#pragma unroll
  for (uint32_t k = 0; k < PER; ++k) {
    const uint32_t j = first + tid + k * threads;
    v[k] = j < end ? to_f32(hs[base + j]) : 0.f;
  }
  if (inject) {
    // gate is [N, S]: this row's logit.
    const float g = rounded<T>(to_f32(gate[row]) / (float)p.streams);
    const float w = rounded<T>(2.f * rounded<T>(sigmoid(g)));
    float yv[PER];
    if (p.slots == 0) {
#pragma unroll
      for (uint32_t k = 0; k < PER; ++k) {
        const uint32_t j = first + tid + k * threads;
        yv[k] = j < end ? to_f32(y[(size_t)n * p.cols + j]) : 0.f;
      }
    } else {
      // moe_combine's sum over the slots, in order, rounded once.
      const T* slot_rows = y + (size_t)n * p.slots * p.cols;
      const float* slot_w = slot_weights + (size_t)n * p.slots;
      constexpr uint32_t kSlotsTogether = slots_together<PER>();
      if constexpr (kSlotsTogether == 1) {
        // A column at a time, its K loads one after the other: at PER >= 4 the slots-outer loop
        // below, even one slot at a time, spills under the 64 registers of a 1 024-thread block.
#pragma unroll
        for (uint32_t k = 0; k < PER; ++k) {
          const uint32_t j = first + tid + k * threads;
          float acc = 0.f;
          if (j < end)
            for (uint32_t k2 = 0; k2 < p.slots; ++k2)
              acc = fmaf(slot_w[k2], to_f32(slot_rows[(size_t)k2 * p.cols + j]), acc);
          yv[k] = rounded<T>(acc);
        }
      } else if constexpr (PER == 1) {
        // One column: kSlotsTogether slots' loads in flight together, the last batch's missing
        // slots neither loaded nor added.
        const uint32_t j = first + tid;
        float acc = 0.f;
        for (uint32_t k2 = 0; k2 < p.slots; k2 += kSlotsTogether) {
          float yk[kSlotsTogether], sw[kSlotsTogether];
#pragma unroll
          for (uint32_t u = 0; u < kSlotsTogether; ++u) {
            const bool used = k2 + u < p.slots;
            sw[u] = used ? slot_w[k2 + u] : 0.f;
            yk[u] = used && j < end ? to_f32(slot_rows[(size_t)(k2 + u) * p.cols + j]) : 0.f;
          }
#pragma unroll
          for (uint32_t u = 0; u < kSlotsTogether; ++u)
            if (k2 + u < p.slots) acc = fmaf(sw[u], yk[u], acc);
        }
        yv[0] = rounded<T>(acc);
      } else {
        // The slots outer and the columns inner, kSlotsTogether slots at a time: their PER
        // columns' loads in flight together.
        float acc[PER];
#pragma unroll
        for (uint32_t k = 0; k < PER; ++k) acc[k] = 0.f;
        uint32_t k2 = 0;
        for (; k2 + kSlotsTogether <= p.slots; k2 += kSlotsTogether) {
          float yk[kSlotsTogether][PER];
#pragma unroll
          for (uint32_t u = 0; u < kSlotsTogether; ++u) {
#pragma unroll
            for (uint32_t k = 0; k < PER; ++k) {
              const uint32_t j = first + tid + k * threads;
              yk[u][k] = j < end ? to_f32(slot_rows[(size_t)(k2 + u) * p.cols + j]) : 0.f;
            }
          }
#pragma unroll
          for (uint32_t u = 0; u < kSlotsTogether; ++u) {
            const float sw = slot_w[k2 + u];
#pragma unroll
            for (uint32_t k = 0; k < PER; ++k) acc[k] = fmaf(sw, yk[u][k], acc[k]);
          }
        }
        for (; k2 < p.slots; ++k2) {
          const float sw = slot_w[k2];
#pragma unroll
          for (uint32_t k = 0; k < PER; ++k) {
            const uint32_t j = first + tid + k * threads;
            if (j < end) acc[k] = fmaf(sw, to_f32(slot_rows[(size_t)k2 * p.cols + j]), acc[k]);
          }
        }
#pragma unroll
        for (uint32_t k = 0; k < PER; ++k) yv[k] = rounded<T>(acc[k]);
      }
    }
#pragma unroll
    for (uint32_t k = 0; k < PER; ++k) {
      const uint32_t j = first + tid + k * threads;
      // Rounded before it is squared: the norm sees the stored sum.
      if (j < end) v[k] = rounded<T>(v[k] + rounded<T>(w * yv[k]));
    }
  }
  if (p.has_norm != 0) {
    // The norm's weights are loaded before the reduction waits, not after it.
    float wt[PER];
#pragma unroll
    for (uint32_t k = 0; k < PER; ++k) {
      const uint32_t j = first + tid + k * threads;
      wt[k] = j < end ? weight[(size_t)s * p.cols + j] : 0.f;
    }
    float squares = 0.f;
#pragma unroll
    for (uint32_t k = 0; k < PER; ++k) squares = fmaf(v[k], v[k], squares);
    const float total = row_squares(block_sum(squares, warp_sums, tid, threads));
    const float inv = rsqrtf(total / (float)p.cols + p.eps);
#pragma unroll
    for (uint32_t k = 0; k < PER; ++k) {
      const uint32_t j = first + tid + k * threads;
      if (j < end) normed[base + j] = from_f32<T>(v[k] * inv * wt[k]);
    }
  }
  if (inject) {
#pragma unroll
    for (uint32_t k = 0; k < PER; ++k) {
      const uint32_t j = first + tid + k * threads;
      if (j < end) sum[base + j] = from_f32<T>(v[k]);
    }
  }
}

// The columns [first, end) of one stream row (see inject_norm_cols), at the fewest columns a
// thread that cover them: 1, 2, 3, 4 or kPer (a cluster's block left without columns takes 1:
// it only adds its zero to the row's sum of squares).
template <typename T, typename RowSquares>
__device__ __forceinline__ void inject_norm_span(const InjectBuffers<T>& b,
                                                 const HcInjectNormParams& p, uint32_t row,
                                                 uint32_t first, uint32_t end, uint32_t tid,
                                                 uint32_t threads, float* warp_sums,
                                                 RowSquares row_squares) {
  switch ((end - first + threads - 1) / threads) {
    case 0:
    case 1: inject_norm_cols<T, 1>(b, p, row, first, end, tid, threads, warp_sums, row_squares); break;
    case 2: inject_norm_cols<T, 2>(b, p, row, first, end, tid, threads, warp_sums, row_squares); break;
    case 3: inject_norm_cols<T, 3>(b, p, row, first, end, tid, threads, warp_sums, row_squares); break;
    case 4: inject_norm_cols<T, 4>(b, p, row, first, end, tid, threads, warp_sums, row_squares); break;
    default: inject_norm_cols<T, kPer>(b, p, row, first, end, tid, threads, warp_sums, row_squares);
  }
}

// One stream row a block (hc_inject_norm_*): the whole row, its block's sum of squares the
// row's.
template <typename T>
__device__ __forceinline__ void inject_norm_body(const T* __restrict__ hs, const T* __restrict__ y,
                                                 const T* __restrict__ gate,
                                                 const float* __restrict__ weight,
                                                 const float* __restrict__ slot_weights,
                                                 T* __restrict__ sum,
                                                 T* __restrict__ normed, const HcInjectNormParams& p,
                                                 uint32_t row, uint32_t tid, uint32_t threads,
                                                 float* warp_sums) {
  if (row >= p.tokens * p.streams) return;  // the whole block
  const InjectBuffers<T> b{hs, y, gate, weight, slot_weights, sum, normed};
  inject_norm_span<T>(b, p, row, 0, p.cols, tid, threads, warp_sums,
                      [](float block_squares) { return block_squares; });
}

// Blocks of a stream row's cluster in hc_inject_norm_cluster_* (CLUSTER_BLOCKS on the host).
constexpr uint32_t kClusterBlocks = 8;

// The block of rank `rank` in a stream row's cluster of `blocks`: its columns [first, end),
// ceil(H / blocks) each (the last ones fewer, or none).
struct ClusterSpan {
  uint32_t first, end;
};
__device__ __forceinline__ ClusterSpan cluster_span(uint32_t cols, uint32_t blocks, uint32_t rank) {
  const uint32_t span = (cols + blocks - 1) / blocks;
  const uint32_t first = min(cols, rank * span);
  return {first, min(cols, first + span)};
}

// The row's sum of squares from its cluster's BLOCKS partial sums, partial(c) that of rank c,
// added in rank order: every block of the cluster gets the same bits, run after run.
template <uint32_t BLOCKS, typename Partial>
__device__ __forceinline__ float in_rank_order(Partial partial) {
  float total = 0.f;
#pragma unroll
  for (uint32_t c = 0; c < BLOCKS; ++c) total += partial(c);
  return total;
}

// Block `block` of hc_inject_norm_cluster_*'s grid: rank block % kClusterBlocks of stream row
// block / kClusterBlocks, its cluster_span; row_squares(the block's sum of squares) returns
// the row's (the kernel: through distributed shared memory; the emulator, which runs no
// clusters, from the partials of a first pass: kernels/emu/hyper_connection_cuda_harness.cpp).
template <typename T, typename RowSquares>
__device__ __forceinline__ void inject_norm_cluster_body(
    const T* __restrict__ hs, const T* __restrict__ y, const T* __restrict__ gate,
    const float* __restrict__ weight, const float* __restrict__ slot_weights, T* __restrict__ sum,
    T* __restrict__ normed, const HcInjectNormParams& p, uint32_t block, uint32_t tid,
    uint32_t threads, float* warp_sums, RowSquares row_squares) {
  const uint32_t row = block / kClusterBlocks, rank = block % kClusterBlocks;
  if (row >= p.tokens * p.streams) return;  // the whole cluster
  const InjectBuffers<T> b{hs, y, gate, weight, slot_weights, sum, normed};
  const ClusterSpan cols = cluster_span(p.cols, kClusterBlocks, rank);
  inject_norm_span<T>(b, p, row, cols.first, cols.end, tid, threads, warp_sums, row_squares);
}

// One value of the low-rank mixer's activation.
template <typename T>
__device__ __forceinline__ void act_body(const T* __restrict__ d, T* __restrict__ a,
                                         const HcActParams& p, uint32_t i) {
  if (i >= p.len) return;
  const float t = rounded<T>(to_f32(d[i]) / (float)p.streams);
  a[i] = from_f32<T>(t / (1.f + expf(-t)));
}

// One output value x[n, j] (i = n * H + j).
template <typename T>
__device__ __forceinline__ void mix_body(const T* __restrict__ up, const T* __restrict__ normed,
                                         T* __restrict__ x, const HcMixParams& p, uint32_t i) {
  if (i >= p.tokens * p.cols) return;
  const uint32_t n = i / p.cols, j = i % p.cols;
  float acc = 0.f;
  for (uint32_t s = 0; s < p.streams; ++s) {
    const size_t at = ((size_t)n * p.streams + s) * p.cols + j;
    acc += rounded<T>(rounded<T>(sigmoid(to_f32(up[at]))) * to_f32(normed[at]));
  }
  x[i] = from_f32<T>(acc / (float)p.streams);
}

// hc_up_mix splits a warp's lanes among the streams: G = the power of two >= min(S, 32) lane
// groups of L = 32 / G lanes, group g taking stream s = r * G + g in round r (one round at the
// release: S = 4, G = 4 groups of L = 8 lanes). The S dots of an output are in flight together
// instead of one after the other, and a lane walks R * bits / 32 / L words (5 at the release)
// rather than 1.25 of each of the S rows.
__device__ __forceinline__ uint32_t up_mix_groups(uint32_t streams) {
  uint32_t g = 1;
  while (g < streams && g < 32) g <<= 1;
  return g;
}

// A lane's first words of its row, loaded before they are used: kUpAhead words, their scales and
// biases (every load of a lane issued before the first is waited on; the rest of a long row, past
// kUpAhead * L words, is loaded as it is summed).
constexpr uint32_t kUpAhead = 6;

struct UpAhead {
  uint32_t word[kUpAhead];
  float scale[kUpAhead], bias[kUpAhead];
  float normed;
};

// Lane q's words q, q + L, ... of one up row (row_words) with their groups' scales and biases.
template <uint32_t BITS, typename S>
__device__ __forceinline__ void up_load_ahead(UpAhead& ahead, const uint32_t* row_words,
                                              const S* row_scales, const S* row_biases,
                                              uint32_t words, uint32_t group_size, uint32_t q,
                                              uint32_t lanes) {
  constexpr uint32_t PER_WORD = 32 / BITS;
#pragma unroll
  for (uint32_t i = 0; i < kUpAhead; ++i) {
    const uint32_t w = q + i * lanes;
    if (w < words) {
      const uint32_t g = w * PER_WORD / group_size;
      ahead.word[i] = row_words[w];
      ahead.scale[i] = to_f32(row_scales[g]);
      ahead.bias[i] = to_f32(row_biases[g]);
    }
  }
}

// One word's s * sum(q a) + b * sum(a) added to acc (affine_word_dot.h's word_sum, the order
// the decode products add in), the activations read four at a time from shared memory (j0 is
// a multiple of 4: 16-byte aligned).
template <uint32_t BITS>
__device__ __forceinline__ float up_word(uint32_t word, float scale, float bias, const float* act,
                                         uint32_t j0, float acc) {
  constexpr uint32_t PER_WORD = 32 / BITS;
  const float4* a4 = reinterpret_cast<const float4*>(act + j0);
  float av[PER_WORD];
#pragma unroll
  for (uint32_t v = 0; v < PER_WORD / 4; ++v) {
    const float4 a = a4[v];
    av[4 * v] = a.x;
    av[4 * v + 1] = a.y;
    av[4 * v + 2] = a.z;
    av[4 * v + 3] = a.w;
  }
  return affine_word_dot::word_sum<BITS>(word, scale, bias, av, acc);
}

// hc_up_mix's buffers (see the entry points).
template <typename X, typename S>
struct UpMixBuffers {
  const uint32_t* packed;
  const S* scales;
  const S* biases;
  const X* d;
  const X* normed;
  X* x;
};

// Output x[n, j] of one warp at BITS; every thread of the block first writes its share of
// token n's activations into `act` (R floats, 16-byte aligned), so the whole block calls this.
// The round-0 loads (weights, scales, biases, the normed value) are issued before the
// activations are computed, so that their latency hides behind the expf and the barrier.
template <uint32_t BITS, typename X, typename S>
__device__ __forceinline__ void up_mix_bits(const UpMixBuffers<X, S>& b, const HcUpMixParams& p,
                                            uint32_t n, uint32_t j, uint32_t tid,
                                            uint32_t threads, uint32_t lane, float* act) {
  const uint32_t* __restrict__ packed = b.packed;
  const S* __restrict__ scales = b.scales;
  const S* __restrict__ biases = b.biases;
  const X* __restrict__ d = b.d;
  const X* __restrict__ normed = b.normed;
  X* __restrict__ x = b.x;
  constexpr uint32_t PER_WORD = 32 / BITS;
  const uint32_t groups = up_mix_groups(p.streams), lanes = 32 / groups;
  const uint32_t g = lane / lanes, q = lane % lanes;
  const uint32_t words = p.rank / PER_WORD, row_groups = p.rank / p.group_size;
  const bool live = j < p.cols;  // a whole warp
  UpAhead ahead;
  // Stream s = r * G + g's row of output j: its loads ahead.
  auto load = [&](uint32_t r) {
    const uint32_t s = r * groups + g;
    if (!live || s >= p.streams) return;
    const size_t row = (size_t)s * p.cols + j;
    up_load_ahead<BITS, S>(ahead, packed + row * words, scales + row * row_groups,
                           biases + row * row_groups, words, p.group_size, q, lanes);
    ahead.normed = to_f32(normed[((size_t)n * p.streams + s) * p.cols + j]);
  };
  load(0);
  for (uint32_t k = tid; k < p.rank; k += threads) {
    const float t = rounded<X>(to_f32(d[(size_t)n * p.rank + k]) / (float)p.streams);
    act[k] = rounded<X>(t / (1.f + expf(-t)));
  }
  __syncthreads();
  if (!live) return;  // a whole warp, after the barrier
  const uint32_t rounds = (p.streams + groups - 1) / groups;
  float acc = 0.f;
  for (uint32_t r = 0; r < rounds; ++r) {
    if (r > 0) load(r);
    const uint32_t s = r * groups + g;
    float dot = 0.f;
    if (s < p.streams) {
#pragma unroll
      for (uint32_t i = 0; i < kUpAhead; ++i) {
        const uint32_t w = q + i * lanes;
        if (w < words)
          dot = up_word<BITS>(ahead.word[i], ahead.scale[i], ahead.bias[i], act, w * PER_WORD, dot);
      }
      const size_t row = (size_t)s * p.cols + j;
      for (uint32_t w = q + kUpAhead * lanes; w < words; w += lanes) {
        const uint32_t gi = w * PER_WORD / p.group_size;
        dot = up_word<BITS>(packed[row * words + w], to_f32(scales[row * row_groups + gi]),
                            to_f32(biases[row * row_groups + gi]), act, w * PER_WORD, dot);
      }
    }
    // The group's lanes summed (the xor stays inside a group of L lanes).
    for (uint32_t o = lanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float term =
        s < p.streams ? rounded<X>(rounded<X>(sigmoid(rounded<X>(dot))) * ahead.normed) : 0.f;
    // The streams' terms added in stream order, as hc_mix adds them.
    for (uint32_t gg = 0; gg < groups; ++gg) {
      const float t = __shfl_sync(0xffffffffu, term, gg * lanes);
      if (r * groups + gg < p.streams) acc += t;
    }
  }
  if (lane == 0) x[(size_t)n * p.cols + j] = from_f32<X>(acc / (float)p.streams);
}

// Output x[n, j] of one warp (see up_mix_bits).
template <typename X, typename S>
__device__ __forceinline__ void up_mix_body(const uint32_t* __restrict__ packed,
                                            const S* __restrict__ scales,
                                            const S* __restrict__ biases, const X* __restrict__ d,
                                            const X* __restrict__ normed, X* __restrict__ x,
                                            const HcUpMixParams& p, uint32_t n, uint32_t j,
                                            uint32_t tid, uint32_t threads, uint32_t lane,
                                            float* act) {
  const UpMixBuffers<X, S> b{packed, scales, biases, d, normed, x};
  switch (p.bits) {
    case 4: up_mix_bits<4, X, S>(b, p, n, j, tid, threads, lane, act); break;
    case 8: up_mix_bits<8, X, S>(b, p, n, j, tid, threads, lane, act); break;
    default: up_mix_bits<2, X, S>(b, p, n, j, tid, threads, lane, act);
  }
}

template <typename X, typename S>
__device__ void run_up_mix(const uint32_t* packed, const S* scales, const S* biases, const X* d,
                           const X* normed, X* x, const HcUpMixParams p) {
  extern __shared__ __align__(16) float hc_up_mix_act[];
  up_mix_body<X, S>(packed, scales, biases, d, normed, x, p, blockIdx.y,
                    blockIdx.x * blockDim.y + threadIdx.y, threadIdx.y * 32 + threadIdx.x,
                    blockDim.x * blockDim.y, threadIdx.x, hc_up_mix_act);
}

template <typename T>
__device__ void run_inject_norm(const T* hs, const T* y, const T* gate, const float* weight,
                                const float* slot_weights, T* sum, T* normed,
                                const HcInjectNormParams p) {
  __shared__ float warp_sums[32];
  inject_norm_body<T>(hs, y, gate, weight, slot_weights, sum, normed, p, blockIdx.x, threadIdx.x,
                      blockDim.x, warp_sums);
}

#ifndef HYPER_CONNECTION_NO_CLUSTER
// One stream row over a cluster of kClusterBlocks blocks (sm_90; see
// inject_norm_cluster_body): each block's partial sum of squares read by the others through
// distributed shared memory.
template <typename T>
__device__ void run_inject_norm_cluster(const T* hs, const T* y, const T* gate,
                                        const float* weight, const float* slot_weights, T* sum,
                                        T* normed, const HcInjectNormParams p) {
  __shared__ float warp_sums[32];
  __shared__ float block_squares;  // read by the cluster's other blocks
  // The whole cluster (the grid is whole clusters, a row each): no block waits at the barrier
  // below for one that left.
  if (blockIdx.x / kClusterBlocks >= p.tokens * p.streams) return;
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  auto row_squares = [&](float own) {
    if (threadIdx.x == 0) block_squares = own;
    cluster.sync();
    const float total = in_rank_order<kClusterBlocks>(
        [&](uint32_t c) { return *cluster.map_shared_rank(&block_squares, c); });
    // No block may leave while another still reads its block_squares: arrive now, wait after
    // the stores.
    cluster.barrier_arrive();
    return total;
  };
  inject_norm_cluster_body<T>(hs, y, gate, weight, slot_weights, sum, normed, p, blockIdx.x,
                              threadIdx.x, blockDim.x, warp_sums, row_squares);
  if (p.has_norm != 0) cluster.barrier_wait();  // the whole cluster: it arrived in row_squares
}
#endif

}  // namespace hyper_connection

#ifndef HYPER_CONNECTION_NO_CLUSTER
#define HC_INJECT_CLUSTER(TN, T)                                                              \
  extern "C" __global__ void __cluster_dims__(hyper_connection::kClusterBlocks, 1, 1)         \
      __launch_bounds__(1024) hc_inject_norm_cluster_##TN(                                    \
          const T* hs, const T* y, const T* gate, const float* weight,                        \
          const float* slot_weights, T* sum, T* normed, const HcInjectNormParams p) {         \
    hyper_connection::run_inject_norm_cluster<T>(hs, y, gate, weight, slot_weights, sum,      \
                                                 normed, p);                                  \
  }

HC_INJECT_CLUSTER(f32, float)
HC_INJECT_CLUSTER(f16, __half)
HC_INJECT_CLUSTER(bf16, __nv_bfloat16)
#endif

#define HC_ENTRIES(TN, T)                                                                     \
  extern "C" __global__ void __launch_bounds__(1024)                                          \
      hc_inject_norm_##TN(const T* hs, const T* y, const T* gate,                             \
                                                 const float* weight,                         \
                                                 const float* slot_weights, T* sum,           \
                                                 T* normed, const HcInjectNormParams p) {     \
    hyper_connection::run_inject_norm<T>(hs, y, gate, weight, slot_weights, sum, normed, p);  \
  }                                                                                           \
  extern "C" __global__ void hc_act_##TN(const T* d, T* a, const HcActParams p) {             \
    hyper_connection::act_body<T>(d, a, p, blockIdx.x * blockDim.x + threadIdx.x);            \
  }                                                                                           \
  extern "C" __global__ void hc_mix_##TN(const T* up, const T* normed, T* x,                  \
                                         const HcMixParams p) {                               \
    hyper_connection::mix_body<T>(up, normed, x, p, blockIdx.x * blockDim.x + threadIdx.x);   \
  }

HC_ENTRIES(f32, float)
HC_ENTRIES(f16, __half)
HC_ENTRIES(bf16, __nv_bfloat16)

#define HC_UP_MIX(XN, XT, SN, ST)                                                              \
  extern "C" __global__ void hc_up_mix_##XN##_##SN(const uint32_t* packed, const ST* scales,   \
                                                   const ST* biases, const XT* d,              \
                                                   const XT* normed, XT* x,                    \
                                                   const HcUpMixParams p) {                    \
    hyper_connection::run_up_mix<XT, ST>(packed, scales, biases, d, normed, x, p);             \
  }
#define HC_UP_MIX_SCALES(XN, XT)            \
  HC_UP_MIX(XN, XT, f32, float)             \
  HC_UP_MIX(XN, XT, f16, __half)            \
  HC_UP_MIX(XN, XT, bf16, __nv_bfloat16)

HC_UP_MIX_SCALES(f32, float)
HC_UP_MIX_SCALES(f16, __half)
HC_UP_MIX_SCALES(bf16, __nv_bfloat16)
