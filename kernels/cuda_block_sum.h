// A block's sum of one float per thread, for the .cu kernels that normalise a row held in a
// block's registers (add_rms_norm.cu, hyper_connection.cu): a shuffle within each warp, then
// a pass over the warps' sums in shared memory.
#ifndef QWEN_GDN_CUDA_BLOCK_SUM_H
#define QWEN_GDN_CUDA_BLOCK_SUM_H

#include <stdint.h>

namespace cuda_block_sum {

// The block's sum of v (every thread returns it), through `warp_sums` (32 floats). Every
// thread of the block must call it; `threads` is a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* warp_sums, uint32_t tid, uint32_t threads) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (tid % 32 == 0) warp_sums[tid / 32] = v;
  __syncthreads();
  float total = 0.f;
  for (uint32_t w = 0; w < threads / 32; ++w) total += warp_sums[w];
  return total;
}

}  // namespace cuda_block_sum

#endif
