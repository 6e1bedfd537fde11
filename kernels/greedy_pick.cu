// Greedy pick on CUDA: the twin of kernels/greedy_pick.metal (same passes, same record order);
// crates/gdn-ops/src/ops/greedy_pick/cpu.rs is the reference, ops/greedy_pick/mod.rs the spec.
//
// ENTRY POINTS (extern "C"; <x> in {f32, f16, bf16}):
//   greedy_pick_slices_<x>(logits, partials, GreedyPickParams p)
//     logits [N, V] in <x>; partials [N, B] GreedyPickPartial. block = GREEDY_PICK_THREADS
//     threads, grid = (B, N): block (b, n) reduces row n's values [b * slice, min(V, (b + 1) *
//     slice)) to (largest finite value, its first index, non-finite count); an empty slice
//     gives (-INFINITY, GREEDY_PICK_NONE, 0).
//   greedy_pick_finish(partials, out, GreedyPickParams p)
//     out [N, 2] u32: (index, count) per row, index 0 when no value was finite. block = 32
//     threads (one warp per row), grid = N.
// Records are ordered by value, then by the lower index (a total order: every lane of a warp
// butterfly ends with the same record, and it is the CPU twin's pick whatever the slicing).
// Finiteness is tested on the f32 bits, as in the Metal kernel. The bodies take their block
// and thread indices and their shared memory as arguments, so that
// kernels/emu/greedy_pick_cuda_harness.cpp runs them on the CPU.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/greedy_pick.cu

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "params/greedy_pick.h"
#include "cuda_convert.h"

namespace greedy_pick {

using cuda_convert::to_f32;

constexpr uint32_t kWarps = GREEDY_PICK_THREADS / 32;

struct Best {
  float value;
  uint32_t index;
  uint32_t nonfinite;
};

__device__ __forceinline__ Best none() {
  Best b;
  b.value = -INFINITY;
  b.index = GREEDY_PICK_NONE;
  b.nonfinite = 0;
  return b;
}

// NaN and +-Inf have every exponent bit set (f16 and bf16 keep that through the widening).
__device__ __forceinline__ bool finite(float x) {
  return (__float_as_uint(x) & 0x7F800000u) != 0x7F800000u;
}

// Whether record a comes before b: larger value, or equal value and lower index.
__device__ __forceinline__ bool before(float av, uint32_t ai, float bv, uint32_t bi) {
  return av > bv || (av == bv && ai < bi);
}

// The first record of the warp's, and the warp's count, in every lane.
__device__ __forceinline__ Best warp_best(Best b) {
  for (int o = 16; o > 0; o >>= 1) {
    const float value = __shfl_xor_sync(0xffffffffu, b.value, o);
    const uint32_t index = __shfl_xor_sync(0xffffffffu, b.index, o);
    const uint32_t nonfinite = __shfl_xor_sync(0xffffffffu, b.nonfinite, o);
    if (before(value, index, b.value, b.index)) {
      b.value = value;
      b.index = index;
    }
    b.nonfinite += nonfinite;
  }
  return b;
}

// Block (block, row) of the slice pass; `scratch` holds 3 words per warp.
template <typename T>
__device__ void slices(const T* logits, GreedyPickPartial* partials, uint32_t* scratch,
                       const GreedyPickParams& p, uint32_t block, uint32_t row, uint32_t tid) {
  const uint32_t warp = tid / 32, lane = tid % 32;
  const uint32_t begin = min(block * p.slice, p.vocab);
  const uint32_t end = min(begin + p.slice, p.vocab);
  const T* values = logits + (size_t)row * p.vocab;
  Best best = none();
  for (uint32_t i = begin + tid; i < end; i += GREEDY_PICK_THREADS) {
    const float x = to_f32(values[i]);
    if (!finite(x)) {
      best.nonfinite += 1;
    } else if (x > best.value) {  // every finite x beats the initial -INFINITY
      best.value = x;
      best.index = i;
    }
  }
  best = warp_best(best);
  if (lane == 0) {
    scratch[3 * warp] = __float_as_uint(best.value);
    scratch[3 * warp + 1] = best.index;
    scratch[3 * warp + 2] = best.nonfinite;
  }
  __syncthreads();
  // The whole of warp 0 runs the second butterfly (lanes past the warps' records bring none).
  if (warp != 0) return;
  Best mine = none();
  if (lane < kWarps) {
    mine.value = __uint_as_float(scratch[3 * lane]);
    mine.index = scratch[3 * lane + 1];
    mine.nonfinite = scratch[3 * lane + 2];
  }
  mine = warp_best(mine);
  if (lane == 0) {
    GreedyPickPartial& out = partials[(size_t)row * p.blocks + block];
    out.value = mine.value;
    out.index = mine.index;
    out.nonfinite = mine.nonfinite;
  }
}

// Row `row` of the finish pass, one warp.
__device__ void finish(const GreedyPickPartial* partials, uint32_t* out, const GreedyPickParams& p,
                       uint32_t row, uint32_t lane) {
  const GreedyPickPartial* records = partials + (size_t)row * p.blocks;
  Best best = none();
  for (uint32_t b = lane; b < p.blocks; b += 32) {
    const GreedyPickPartial r = records[b];
    if (before(r.value, r.index, best.value, best.index)) {
      best.value = r.value;
      best.index = r.index;
    }
    best.nonfinite += r.nonfinite;
  }
  best = warp_best(best);
  if (lane == 0) {
    out[2 * (size_t)row] = best.index == GREEDY_PICK_NONE ? 0u : best.index;
    out[2 * (size_t)row + 1] = best.nonfinite;
  }
}

}  // namespace greedy_pick

#define GREEDY_PICK_ENTRY(XN, XT)                                                          \
  extern "C" __global__ void __launch_bounds__(GREEDY_PICK_THREADS)                        \
      greedy_pick_slices_##XN(const XT* logits, GreedyPickPartial* partials,               \
                              const GreedyPickParams p) {                                  \
    __shared__ uint32_t greedy_pick_scratch[3 * greedy_pick::kWarps];                      \
    greedy_pick::slices<XT>(logits, partials, greedy_pick_scratch, p, blockIdx.x,          \
                            blockIdx.y, threadIdx.x);                                      \
  }

GREEDY_PICK_ENTRY(f32, float)
GREEDY_PICK_ENTRY(f16, __half)
GREEDY_PICK_ENTRY(bf16, __nv_bfloat16)

extern "C" __global__ void greedy_pick_finish(const GreedyPickPartial* partials, uint32_t* out,
                                              const GreedyPickParams p) {
  greedy_pick::finish(partials, out, p, blockIdx.x, threadIdx.x);
}
