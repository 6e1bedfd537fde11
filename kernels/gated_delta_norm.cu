// The gated-delta recurrence with the gated RMSNorm folded into its output, on CUDA: the twin
// of kernels/gated_delta_norm.metal (which documents the maths and the layout), with
// crates/gdn-ops/src/ops/gated_delta_norm/cpu.rs as the reference both must match.
//
// ENTRY POINTS (extern "C"; <in> in {f32, f16, bf16}, <st> in {f32, bf16}):
//   gated_delta_norm_<in>_<st>(q, k, v, g, beta, state, z, weight, out, GdnNormParams p)
//     q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] and weight [Dv] in InT; g, beta [B, T, Hv] f32;
//     state [B, Hv, Dv, Dk] in StT, advanced in place and rounded once per call; z at
//     b * z_batch_stride + t * z_token_stride + hv * Dv + d (a view is fine); out
//     [B, T, Hv, Dv] in InT.
//     block = (32, S) with ceil(Dv / S) <= 8 and S <= 32: warp s owns the state rows
//     s, s + S, ...; grid = B * Hv. Dk a multiple of 32 up to 256 (the host checks). The
//     keys per lane and the rows per warp (4 or 8) are compile-time, so that the state
//     stays in registers: 16 floats a lane at Qwen3-Next's shapes with 32 warps.
//   gated_delta_norm_cluster_<in>_<st>(same arguments)
//     Each value head's rows split over the 4 blocks of a thread-block cluster (sm_90):
//     grid = 4 * B * Hv, block = (32, S) with Dv % 4 == 0 and ceil(Dv / 4 / S) <= 2; block c
//     of head n owns rows c * Dv / 4 ... (c + 1) * Dv / 4 - 1. The norm's sum of squares is
//     summed per block, then over the cluster through distributed shared memory. Why: one
//     block per head leaves 100 of 132 SMs idle at Qwen3-Next's 32 heads, and the step is a
//     chain of dependent latencies on each (issue 25); four blocks a head run it on 128 SMs
//     with a quarter of the rows each.
//   gated_delta_norm_slots_<in>_<st>, gated_delta_norm_slots_cluster_<in>_<st>
//       (q, k, v, g, beta, slots, z, weight, out, GdnNormParams p)  [module
//       gated_delta_norm_slots.cu]
//     The two above over B sequences whose states are separate tensors: slots [B] holds the
//     device address of sequence b's state [1, Hv, Dv, Dk] (StT), advanced in place; every
//     other argument and the geometry as above. The host picks the entry (cluster or not) as
//     it would for one sequence, so that each head is computed as the per-sequence launch
//     computes it (the cluster's sum of squares is added in another order).
//   gated_delta_norm_window_<in>_<st>, gated_delta_norm_window_cluster_<in>_<st>
//       (q, k, v, g, beta, state, z, weight, out, after, GdnNormParams p)  [module
//       gated_delta_norm_window.cu]
//     The two first over a verify window of T tokens (speculative decoding, issue 28), bit for
//     bit what T one-token launches of the same entry give: the state is rounded to StT after
//     every token (as each launch stores it), and the state after token t < T - 1 is also
//     written to after [T - 1, B, Hv, Dv, Dk] (StT), the window's rollback points. Why: one
//     launch a GDN layer instead of T, and no state copies between them.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/gated_delta_norm.cu

#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/gated_delta_norm.h"
#include "cuda_convert.h"

namespace gated_delta_norm {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

constexpr unsigned int kMaxWarps = 32;
// The blocks of a cluster that share one value head (gated_delta_norm_cluster_*).
constexpr unsigned int kClusterBlocks = 4;

// PER = Dk / 32 keys per lane and ROWS (4 or 8) rows per warp at most, known at compile time
// so that the state stays in registers: ROWS * PER floats per lane (16 at Qwen3-Next's
// Dk = 128 with 32 warps of 4 rows).
// CLUSTER blocks share one head (1: the whole head in one block): block `part` owns the
// head's rows part * span ... (part + 1) * span - 1.
// WINDOW (the window entries): the state is rounded to StT after every token, as T one-token
// launches round it, and the state after token t < T - 1 is written to `after` as well.
template <typename InT, typename StT, unsigned int PER, unsigned int ROWS, unsigned int CLUSTER,
          bool WINDOW = false>
__device__ __forceinline__ void step(const InT* __restrict__ q, const InT* __restrict__ k,
                     const InT* __restrict__ v, const float* __restrict__ g,
                     const float* __restrict__ beta, StT* __restrict__ state,
                     const InT* __restrict__ z, const InT* __restrict__ weight,
                     InT* __restrict__ out, const GdnNormParams p,
                     const unsigned long long* __restrict__ slots = nullptr,
                     StT* __restrict__ after = nullptr) {
  // Two halves of one partial sum per warp, alternating by token parity: one barrier a token.
  __shared__ float partial[2 * kMaxWarps];
  // The block's sum of squares, by token parity, read by the cluster's other blocks.
  __shared__ float block_sum[2];
  const unsigned int n = blockIdx.x / CLUSTER;
  const unsigned int part = blockIdx.x % CLUSTER;  // the block's rank in its 1-D cluster
  const unsigned int warp = threadIdx.y;
  const unsigned int warps = blockDim.y;
  const unsigned int lane = threadIdx.x;
  const unsigned int b = n / p.value_heads;
  const unsigned int hv = n % p.value_heads;
  const unsigned int hk = hv / (p.value_heads / p.key_heads);
  const unsigned int key0 = lane * PER;
  const unsigned int dim = p.value_dim;
  const unsigned int span = dim / CLUSTER;  // the host checks dim % CLUSTER == 0
  const unsigned int first = part * span;
  // Row r of this warp: first + warp + r * warps, present while warp + r * warps < span.
  // The head's state: in the call's [B, Hv, Dv, Dk] tensor, or (the slot entries) in sequence
  // b's own [1, Hv, Dv, Dk] state at the device address slots[b]. Either way the same rows
  // in the same order: a slot launch computes what the per-sequence launch does, bit for bit.
  StT* head_state = slots != nullptr
                        ? reinterpret_cast<StT*>(slots[b]) + (size_t)hv * dim * p.key_dim
                        : state + (size_t)n * dim * p.key_dim;

  float s[ROWS][PER];
#pragma unroll
  for (unsigned int r = 0; r < ROWS; ++r) {
    const unsigned int local = warp + r * warps;
    const unsigned int dv = first + local;
    const StT* s_row = head_state + (size_t)dv * p.key_dim + key0;
#pragma unroll
    for (unsigned int i = 0; i < PER; ++i) {
      s[r][i] = local < span ? to_f32(s_row[i]) : 0.0f;
    }
  }

  for (unsigned int t = 0; t < p.steps; ++t) {
    const size_t bt = (size_t)b * p.steps + t;
    const size_t gate_at = bt * p.value_heads + hv;
    const size_t qk_at = (bt * p.key_heads + hk) * p.key_dim + key0;
    const float g_t = g[gate_at];
    const float beta_t = beta[gate_at];
    float k_t[PER], q_t[PER];
#pragma unroll
    for (unsigned int i = 0; i < PER; ++i) {
      k_t[i] = to_f32(k[qk_at + i]);
      q_t[i] = to_f32(q[qk_at + i]);
    }
    // The output gate and the norm's weight, loaded with the token's other inputs rather than
    // after the barrier (one DRAM round trip less on the critical path).
    const InT* z_tok = z + (size_t)b * p.z_batch_stride + (size_t)t * p.z_token_stride + (size_t)hv * dim;
    float z_r[ROWS], w_r[ROWS];
#pragma unroll
    for (unsigned int r = 0; r < ROWS; ++r) {
      const unsigned int local = warp + r * warps;
      const unsigned int dv = first + local;
      const bool mine = local < span && lane == 0;
      z_r[r] = mine ? to_f32(z_tok[dv]) : 0.0f;
      w_r[r] = mine ? to_f32(weight[dv]) : 0.0f;
    }

    float y[ROWS];
    float square_sum = 0.0f;
#pragma unroll
    for (unsigned int r = 0; r < ROWS; ++r) {
      y[r] = 0.0f;
      const unsigned int local = warp + r * warps;
      const unsigned int dv = first + local;
      if (local < span) {  // uniform over the warp
        float kv = 0.0f;
#pragma unroll
        for (unsigned int i = 0; i < PER; ++i) {
          {
            s[r][i] *= g_t;
            kv = fmaf(s[r][i], k_t[i], kv);
          }
        }
        kv = warp_sum(kv);
        const float delta = (to_f32(v[gate_at * dim + dv]) - kv) * beta_t;
        float o = 0.0f;
#pragma unroll
        for (unsigned int i = 0; i < PER; ++i) {
          {
            s[r][i] = fmaf(k_t[i], delta, s[r][i]);
            o = fmaf(s[r][i], q_t[i], o);
          }
        }
        y[r] = to_f32(from_f32<InT>(warp_sum(o)));
        square_sum = fmaf(y[r], y[r], square_sum);
      }
    }

    float* sums = partial + (t & 1) * warps;
    if (lane == 0) sums[warp] = square_sum;
    __syncthreads();
    float total = 0.0f;
    for (unsigned int j = 0; j < warps; ++j) total += sums[j];
    if constexpr (CLUSTER > 1) {
      // Every block adds the cluster's partial sums in rank order: the same total in each.
      // The parity double buffer makes one cluster barrier a token enough, as `partial` does
      // for the block's: a block writes this parity again only after the next token's barrier,
      // which every block reaches after reading it.
      cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
      if (warp == 0 && lane == 0) block_sum[t & 1] = total;
      cluster.sync();
      total = 0.0f;
#pragma unroll
      for (unsigned int c = 0; c < CLUSTER; ++c) total += *cluster.map_shared_rank(&block_sum[t & 1], c);
    }
    const float inv_rms = rsqrtf(total / (float)dim + p.eps);

    InT* out_tok = out + gate_at * dim;
#pragma unroll
    for (unsigned int r = 0; r < ROWS; ++r) {
      const unsigned int local = warp + r * warps;
      const unsigned int dv = first + local;
      if (local < span && lane == 0) {
        const float normed = to_f32(from_f32<InT>(y[r] * inv_rms * w_r[r]));
        // silu(z) = z * sigmoid(z): the numerator picks the gate (p.sigmoid_gate: qwen4_exp).
        const float gate = z_r[r];
        const float numerator = p.sigmoid_gate ? 1.0f : gate;
        out_tok[dv] = from_f32<InT>(numerator / (1.0f + expf(-gate)) * normed);
      }
    }
    if constexpr (WINDOW) {
      // A one-token launch stores the state in StT and the next one reads it back: the same
      // rounding here keeps every token's arithmetic that of T launches, bit for bit. The
      // states after the tokens but the last are the window's (rollback); the last is `state`.
      StT* after_head = after + ((size_t)t * p.batch * p.value_heads + n) * dim * p.key_dim;
#pragma unroll
      for (unsigned int r = 0; r < ROWS; ++r) {
        const unsigned int local = warp + r * warps;
        const unsigned int dv = first + local;
        StT* a_row = after_head + (size_t)dv * p.key_dim + key0;
#pragma unroll
        for (unsigned int i = 0; i < PER; ++i) {
          const StT rounded = from_f32<StT>(s[r][i]);
          s[r][i] = to_f32(rounded);
          if (local < span && t + 1 < p.steps) a_row[i] = rounded;
        }
      }
    }
  }

  // The only rounding of the state in the call: StT, never InT.
#pragma unroll
  for (unsigned int r = 0; r < ROWS; ++r) {
    const unsigned int local = warp + r * warps;
    const unsigned int dv = first + local;
    StT* s_row = head_state + (size_t)dv * p.key_dim + key0;
#pragma unroll
    for (unsigned int i = 0; i < PER; ++i) {
      if (local < span) s_row[i] = from_f32<StT>(s[r][i]);
    }
  }
  // No block may leave while another still reads its block_sum.
  if constexpr (CLUSTER > 1) cooperative_groups::this_cluster().sync();
}

// Dispatches on Dk (PER) and on the rows per warp: at most FEW, else MANY (the host rejects
// other key dims and more rows per warp). One head a block: 4, else 8; a cluster's block (a
// quarter of a head): 1, else 2. scripts/gpu/gdn_norm_variants.cu instantiates others.
template <typename InT, typename StT, unsigned int CLUSTER, unsigned int FEW, unsigned int MANY,
          bool WINDOW = false>
__device__ __forceinline__ void entry(const InT* q, const InT* k, const InT* v, const float* g,
                                      const float* beta, StT* state, const InT* z,
                                      const InT* weight, InT* out, const GdnNormParams& p,
                                      const unsigned long long* slots = nullptr,
                                      StT* after = nullptr) {
  constexpr unsigned int kFew = FEW;
  constexpr unsigned int kMany = MANY;
  const bool few = p.value_dim / CLUSTER <= kFew * blockDim.y;
  switch (p.key_dim) {
#define GDN_NORM_CASE(DK)                                                                   \
  case DK:                                                                                  \
    if (few) {                                                                              \
      step<InT, StT, DK / 32, kFew, CLUSTER, WINDOW>(q, k, v, g, beta, state, z, weight, out, p, \
                                                     slots, after);                         \
    } else {                                                                                \
      step<InT, StT, DK / 32, kMany, CLUSTER, WINDOW>(q, k, v, g, beta, state, z, weight, out, p, \
                                                      slots, after);                        \
    }                                                                                       \
    break;
    GDN_NORM_CASE(32)
    GDN_NORM_CASE(64)
    GDN_NORM_CASE(96)
    GDN_NORM_CASE(128)
    GDN_NORM_CASE(160)
    GDN_NORM_CASE(192)
    GDN_NORM_CASE(224)
    GDN_NORM_CASE(256)
#undef GDN_NORM_CASE
    default:
      break;
  }
}

}  // namespace gated_delta_norm

// __launch_bounds__(1024): any block of up to 32 warps launches (registers capped to fit).
// Three families of entry points, each in a module of its own (this file: the decode step's;
// gated_delta_norm_slots.cu: the batched step's; gated_delta_norm_window.cu: the verify
// window's), because the driver JIT-compiles a PTX module whole at its first load: with all
// 36 entries in one module a fresh machine spent ~98 s on it (docs/perf-notes-gpu.md,
// thirteenth session), whichever one the process needed.
#define GDN_NORM_DECODE_KERNELS(NAME, InT, StT)                                                 \
  extern "C" __global__ void __launch_bounds__(1024) gated_delta_norm_##NAME(                   \
      const InT* q, const InT* k, const InT* v, const float* g, const float* beta, StT* state,   \
      const InT* z, const InT* weight, InT* out, const GdnNormParams p) {                       \
    gated_delta_norm::entry<InT, StT, 1, 4, 8>(q, k, v, g, beta, state, z, weight, out, p);     \
  }                                                                                             \
  extern "C" __global__ void __cluster_dims__(gated_delta_norm::kClusterBlocks, 1, 1)           \
      __launch_bounds__(1024) gated_delta_norm_cluster_##NAME(                                  \
          const InT* q, const InT* k, const InT* v, const float* g, const float* beta,          \
          StT* state, const InT* z, const InT* weight, InT* out, const GdnNormParams p) {       \
    gated_delta_norm::entry<InT, StT, gated_delta_norm::kClusterBlocks, 1, 2>(                 \
        q, k, v, g, beta, state, z, weight, out, p);                                            \
  }

#define GDN_NORM_SLOTS_KERNELS(NAME, InT, StT)                                                  \
  extern "C" __global__ void __launch_bounds__(1024) gated_delta_norm_slots_##NAME(             \
      const InT* q, const InT* k, const InT* v, const float* g, const float* beta,              \
      const unsigned long long* slots, const InT* z, const InT* weight, InT* out,               \
      const GdnNormParams p) {                                                                  \
    gated_delta_norm::entry<InT, StT, 1, 4, 8>(q, k, v, g, beta, nullptr, z, weight, out, p,    \
                                               slots);                                          \
  }                                                                                             \
  extern "C" __global__ void __cluster_dims__(gated_delta_norm::kClusterBlocks, 1, 1)           \
      __launch_bounds__(1024) gated_delta_norm_slots_cluster_##NAME(                            \
          const InT* q, const InT* k, const InT* v, const float* g, const float* beta,          \
          const unsigned long long* slots, const InT* z, const InT* weight, InT* out,           \
          const GdnNormParams p) {                                                              \
    gated_delta_norm::entry<InT, StT, gated_delta_norm::kClusterBlocks, 1, 2>(                 \
        q, k, v, g, beta, nullptr, z, weight, out, p, slots);                                   \
  }

#define GDN_NORM_WINDOW_KERNELS(NAME, InT, StT)                                                 \
  extern "C" __global__ void __launch_bounds__(1024) gated_delta_norm_window_##NAME(            \
      const InT* q, const InT* k, const InT* v, const float* g, const float* beta, StT* state,   \
      const InT* z, const InT* weight, InT* out, StT* after, const GdnNormParams p) {           \
    gated_delta_norm::entry<InT, StT, 1, 4, 8, true>(q, k, v, g, beta, state, z, weight, out, p, \
                                                     nullptr, after);                           \
  }                                                                                             \
  extern "C" __global__ void __cluster_dims__(gated_delta_norm::kClusterBlocks, 1, 1)           \
      __launch_bounds__(1024) gated_delta_norm_window_cluster_##NAME(                           \
          const InT* q, const InT* k, const InT* v, const float* g, const float* beta,          \
          StT* state, const InT* z, const InT* weight, InT* out, StT* after,                    \
          const GdnNormParams p) {                                                              \
    gated_delta_norm::entry<InT, StT, gated_delta_norm::kClusterBlocks, 1, 2, true>(           \
        q, k, v, g, beta, state, z, weight, out, p, nullptr, after);                            \
  }

// One family's entries for every (activation, state) pair.
#define GDN_NORM_FOR_TYPES(FAMILY)                 \
  FAMILY(f32_f32, float, float)                    \
  FAMILY(f32_bf16, float, __nv_bfloat16)           \
  FAMILY(f16_f32, __half, float)                   \
  FAMILY(f16_bf16, __half, __nv_bfloat16)          \
  FAMILY(bf16_f32, __nv_bfloat16, float)           \
  FAMILY(bf16_bf16, __nv_bfloat16, __nv_bfloat16)

// scripts/gpu/gdn_norm_variants.cu and the slot and window modules declare their own.
#ifndef GDN_NORM_NO_ENTRY_POINTS
GDN_NORM_FOR_TYPES(GDN_NORM_DECODE_KERNELS)
#endif
