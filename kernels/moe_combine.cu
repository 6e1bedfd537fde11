// MoE combine on CUDA: the twin of kernels/moe_combine.metal (same maths, same roundings);
// crates/gdn-ops/src/ops/moe_combine/cpu.rs is the reference.
//
// ENTRY POINTS (extern "C"; <x> in {f32, f16, bf16}):
//   moe_combine_<x>(down, rows, weights, residual, norm_weight, sum, normed, MoeCombineParams p)
//     down [N, S, H] (or, gathered, [down_rows, H] with rows [N, S] u32 naming the row of
//     each slot), residual [N, H], norm_weight [H], sum and normed [N, H] in <x>;
//     weights [N, S] f32. Per token n, column j, in f32:
//       acc = sum_s weights[n, s] * down[n, s, j]           (slots in order)
//       sum = x(residual[n, j] + x(acc))   (has_residual; else sum = x(acc))
//       normed = x(sum * rsqrt(mean_j sum^2 + eps) * norm_weight[j])   (has_norm only)
//     block = ceil(H / kPer) threads rounded up to whole warps, at most 512 (one block per
//     token row: __launch_bounds__(512) keeps the slot tile's registers within an SM), grid = N.
// Each thread keeps kPer columns in registers, so that every slot's loads of a row are in
// flight together and the norm's second pass reads nothing back (a decode step's combine was
// ~24 us of one block walking its row load after load); rows wider than kPer * 512 take the
// columns in turns and read their own sums back for the norm.
// Without a norm (has_norm == 0) norm_weight and normed are never touched; without a residual
// residual is never read; unless gathered, rows is never read. A gathered row index at or past
// down_rows adds nothing (the host never passes one; the guard keeps a bad one in bounds).
//
//   moe_combine_cluster_<x>(same arguments): the decode form (never gathered) with a token's
//     columns split over the kClusterBlocks blocks of a thread-block cluster (sm_90): block c
//     of token n's cluster takes columns [c * span, (c + 1) * span), span = ceil(H / kClusterBlocks),
//     combine_threads(span) threads of kPer columns each (the host picks it only where
//     span <= kPer * 512), grid = N * kClusterBlocks. sum is the one-block kernel's bit for bit
//     (a column's arithmetic does not depend on the split); the norm's sum of squares is summed
//     per block as there, then over the cluster's blocks in rank order through distributed
//     shared memory: a fixed order (the same bits run to run), not the one-block kernel's.
//     Why: one block per token keeps a decode step's 45 KB of expert rows on one SM, ~8 us a
//     call against a launch floor of ~4.4 us (docs/perf-notes-gpu.md, issue 25). The residual
//     and norm weight are asked for with the expert rows, not after their sum.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 kernels/moe_combine.cu -o moe_combine.ptx

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/moe_combine.h"
#include "cuda_convert.h"

namespace moe_combine {

constexpr uint32_t kPer = 4;  // COMBINE_PER on the host: columns a thread holds
constexpr uint32_t kSlotTile = 12;  // slots whose loads are in flight together (top-10 + shared)
constexpr uint32_t kClusterBlocks = 4;  // CLUSTER_BLOCKS on the host: moe_combine_cluster_*'s

using cuda_convert::from_f32;
using cuda_convert::to_f32;

template <typename T>
__device__ __forceinline__ float column(const T* __restrict__ down, const uint32_t* __restrict__ rows,
                                        const float* __restrict__ w, const MoeCombineParams& p,
                                        uint32_t token, size_t j) {
  float acc = 0.f;
  for (uint32_t s = 0; s < p.slots; ++s) {
    const size_t r = p.gathered ? (size_t)rows[(size_t)token * p.slots + s] : (size_t)token * p.slots + s;
    if (p.gathered && r >= p.down_rows) continue;
    acc = fmaf(w[s], to_f32(down[r * p.hidden + j]), acc);
  }
  return acc;
}

template <typename T>
__device__ __forceinline__ T with_residual(const T* __restrict__ residual, const MoeCombineParams& p,
                                           size_t at, float acc) {
  return p.has_residual ? from_f32<T>(to_f32(residual[at]) + to_f32(from_f32<T>(acc)))
                        : from_f32<T>(acc);
}

template <typename T>
__device__ void combine(const T* __restrict__ down, const uint32_t* __restrict__ rows,
                        const float* __restrict__ weights, const T* __restrict__ residual,
                        const T* __restrict__ norm_weight, T* __restrict__ sum,
                        T* __restrict__ normed, const MoeCombineParams p) {
  __shared__ float warp_sums[32];
  const uint32_t token = blockIdx.x, H = p.hidden, tid = threadIdx.x, threads = blockDim.x;
  if (token >= p.tokens) return;  // the whole block
  const float* w = weights + (size_t)token * p.slots;
  const size_t row = (size_t)token * H;
  const bool in_registers = H <= kPer * threads;  // uniform over the block
  float t[kPer];
  float squares = 0.f;
  if (in_registers) {
#pragma unroll
    for (uint32_t k = 0; k < kPer; ++k) t[k] = 0.f;
    // kSlotTile slots at a time, every load of the tile issued before the first is used (a
    // loop over the slots per column kept ~3 loads in flight: 11 µs a call on the H200); the
    // sums still run over the slots in order, as the CPU twin's.
    for (uint32_t s0 = 0; s0 < p.slots; s0 += kSlotTile) {
      T d[kSlotTile][kPer];
      float ws[kSlotTile];
#pragma unroll
      for (uint32_t u = 0; u < kSlotTile; ++u) {
        const uint32_t s = s0 + u;
        const size_t r = s < p.slots ? (p.gathered ? (size_t)rows[(size_t)token * p.slots + s]
                                                   : (size_t)token * p.slots + s)
                                     : 0;
        const bool used = s < p.slots && (!p.gathered || r < p.down_rows);
        ws[u] = used ? w[s] : 0.f;
#pragma unroll
        for (uint32_t k = 0; k < kPer; ++k) {
          const uint32_t j = tid + k * threads;
          d[u][k] = used && j < H ? down[r * H + j] : from_f32<T>(0.f);
        }
      }
#pragma unroll
      for (uint32_t u = 0; u < kSlotTile; ++u) {
        if (s0 + u >= p.slots) break;
#pragma unroll
        for (uint32_t k = 0; k < kPer; ++k) t[k] = fmaf(ws[u], to_f32(d[u][k]), t[k]);
      }
    }
#pragma unroll
    for (uint32_t k = 0; k < kPer; ++k) {
      const uint32_t j = tid + k * threads;
      if (j < H) {
        const T total = with_residual(residual, p, row + j, t[k]);
        sum[row + j] = total;
        t[k] = to_f32(total);
        squares = fmaf(t[k], t[k], squares);
      }
    }
  } else {
    for (uint32_t j = tid; j < H; j += threads) {
      const T total = with_residual(residual, p, row + j, column(down, rows, w, p, token, j));
      sum[row + j] = total;
      const float v = to_f32(total);
      squares = fmaf(v, v, squares);
    }
  }
  if (!p.has_norm) return;  // uniform over the block
  for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
  if (tid % 32 == 0) warp_sums[tid / 32] = squares;
  __syncthreads();
  float total = 0.f;
  for (uint32_t i = 0; i < threads / 32; ++i) total += warp_sums[i];
  const float inv_rms = rsqrtf(total / (float)H + p.eps);
  if (in_registers) {
#pragma unroll
    for (uint32_t k = 0; k < kPer; ++k) {
      const uint32_t j = tid + k * threads;
      if (j < H) normed[row + j] = from_f32<T>(t[k] * inv_rms * to_f32(norm_weight[j]));
    }
  } else {
    // Each thread reads back only the sum values it wrote itself.
    for (uint32_t j = tid; j < H; j += threads) {
      normed[row + j] = from_f32<T>(to_f32(sum[row + j]) * inv_rms * to_f32(norm_weight[j]));
    }
  }
}

// The decode form (not gathered) over CLUSTER blocks a token (CLUSTER = 1: one block, the
// same early loads; scripts/gpu/moe_combine_variants.cu times it). The block's columns must
// fit its registers: ceil(H / CLUSTER) <= kPer * blockDim.x (the host's rule). RANKS: the
// block sums the norm adds, CLUSTER but in the harness's deliberate break (one left out).
// The slot tiles are the one-block kernel's, written again on purpose: sharing one helper
// between the two (a row lambda) measured 3.32 -> 3.70 µs a call on the H200 (the cluster
// kernel's row addresses then went through a 64-bit select).
template <typename T, uint32_t CLUSTER, uint32_t RANKS = CLUSTER>
__device__ void combine_split(const T* __restrict__ down, const float* __restrict__ weights,
                              const T* __restrict__ residual, const T* __restrict__ norm_weight,
                              T* __restrict__ sum, T* __restrict__ normed, const MoeCombineParams p) {
  __shared__ float warp_sums[32];
  __shared__ float block_sum;  // read by the cluster's other blocks
  const uint32_t token = blockIdx.x / CLUSTER, part = blockIdx.x % CLUSTER;
  const uint32_t H = p.hidden, tid = threadIdx.x, threads = blockDim.x;
  const uint32_t span = (H + CLUSTER - 1) / CLUSTER;
  const uint32_t first = part * span, end = min(H, first + span);
  // Column k of this thread's kPer.
  auto column = [&](uint32_t k) { return first + tid + k * threads; };
  const float* w = weights + (size_t)token * p.slots;
  const size_t row = (size_t)token * H;
  const T* d_tok = down + (size_t)token * p.slots * H;
  // Everything the block reads besides the expert rows, asked for with them (each was one more
  // round trip after the sum when loaded where it is used).
  T res[kPer], nw[kPer];
#pragma unroll
  for (uint32_t k = 0; k < kPer; ++k) {
    const uint32_t j = column(k);
    res[k] = p.has_residual && j < end ? residual[row + j] : from_f32<T>(0.f);
    nw[k] = p.has_norm && j < end ? norm_weight[j] : from_f32<T>(0.f);
  }
  float t[kPer];
#pragma unroll
  for (uint32_t k = 0; k < kPer; ++k) t[k] = 0.f;
  for (uint32_t s0 = 0; s0 < p.slots; s0 += kSlotTile) {
    T d[kSlotTile][kPer];
    float ws[kSlotTile];
#pragma unroll
    for (uint32_t u = 0; u < kSlotTile; ++u) {
      const uint32_t s = s0 + u;
      const bool used = s < p.slots;
      ws[u] = used ? w[s] : 0.f;
#pragma unroll
      for (uint32_t k = 0; k < kPer; ++k) {
        const uint32_t j = column(k);
        d[u][k] = used && j < end ? d_tok[(size_t)s * H + j] : from_f32<T>(0.f);
      }
    }
#pragma unroll
    for (uint32_t u = 0; u < kSlotTile; ++u) {
      if (s0 + u >= p.slots) break;
#pragma unroll
      for (uint32_t k = 0; k < kPer; ++k) t[k] = fmaf(ws[u], to_f32(d[u][k]), t[k]);
    }
  }
  // The one-block kernel's roundings, column for column.
  float squares = 0.f;
#pragma unroll
  for (uint32_t k = 0; k < kPer; ++k) {
    const uint32_t j = column(k);
    if (j < end) {
      const T total = p.has_residual ? from_f32<T>(to_f32(res[k]) + to_f32(from_f32<T>(t[k])))
                                     : from_f32<T>(t[k]);
      sum[row + j] = total;
      t[k] = to_f32(total);
      squares = fmaf(t[k], t[k], squares);
    }
  }
  if (!p.has_norm) return;  // uniform over the cluster
  for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
  if (tid % 32 == 0) warp_sums[tid / 32] = squares;
  __syncthreads();
  float total = 0.f;
  for (uint32_t i = 0; i < threads / 32; ++i) total += warp_sums[i];
  if constexpr (CLUSTER > 1) {
    // Every block adds the cluster's block sums in rank order: the same total in each, the
    // same run to run.
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    if (tid == 0) block_sum = total;
    cluster.sync();
    total = 0.f;
#pragma unroll
    for (uint32_t c = 0; c < RANKS; ++c) total += *cluster.map_shared_rank(&block_sum, c);
    // No block may leave while another still reads its block_sum: arrive now, wait after the
    // stores.
    cluster.barrier_arrive();
  }
  const float inv_rms = rsqrtf(total / (float)H + p.eps);
#pragma unroll
  for (uint32_t k = 0; k < kPer; ++k) {
    const uint32_t j = column(k);
    if (j < end) normed[row + j] = from_f32<T>(t[k] * inv_rms * to_f32(nw[k]));
  }
  if constexpr (CLUSTER > 1) cooperative_groups::this_cluster().barrier_wait();
}

}  // namespace moe_combine

#ifndef MOE_COMBINE_NO_ENTRY_POINTS

#define MOE_COMBINE_ENTRY(XN, XT)                                                          \
  extern "C" __global__ void __launch_bounds__(512) moe_combine_##XN(                     \
      const XT* down, const uint32_t* rows, const float* weights, const XT* residual,      \
      const XT* norm_weight, XT* sum, XT* normed, const MoeCombineParams p) {              \
    moe_combine::combine<XT>(down, rows, weights, residual, norm_weight, sum, normed, p);  \
  }

MOE_COMBINE_ENTRY(f32, float)
MOE_COMBINE_ENTRY(f16, __half)
MOE_COMBINE_ENTRY(bf16, __nv_bfloat16)

#define MOE_COMBINE_CLUSTER_ENTRY(XN, XT)                                                         \
  extern "C" __global__ void __cluster_dims__(moe_combine::kClusterBlocks, 1, 1)                 \
      __launch_bounds__(512) moe_combine_cluster_##XN(                                           \
          const XT* down, const uint32_t* rows, const float* weights, const XT* residual,        \
          const XT* norm_weight, XT* sum, XT* normed, const MoeCombineParams p) {                \
    moe_combine::combine_split<XT, moe_combine::kClusterBlocks>(down, weights, residual,         \
                                                                norm_weight, sum, normed, p);    \
  }

MOE_COMBINE_CLUSTER_ENTRY(f32, float)
MOE_COMBINE_CLUSTER_ENTRY(f16, __half)
MOE_COMBINE_CLUSTER_ENTRY(bf16, __nv_bfloat16)

#endif  // MOE_COMBINE_NO_ENTRY_POINTS
