// Variants of kernels/moe_combine.cu for scripts/gpu/moe_combine_cuda.py (bf16): the shipped
// one-block kernel, and `combine_split` over CL blocks a token (CL = 1: one block with the
// residual and norm weight asked for early, which tells the early loads from the split), and
// a deliberate break the harness must catch (x_c4_drop: the last block's sum of squares left
// out of the norm).
//   nvcc -ptx -arch=sm_90 -O3 -I kernels scripts/gpu/moe_combine_variants.cu -o moe_combine_variants.ptx
#define MOE_COMBINE_NO_ENTRY_POINTS
#include "moe_combine.cu"

#define MOE_COMBINE_ARGS                                                                      \
  const __nv_bfloat16 *down, const uint32_t *rows, const float *weights,                      \
      const __nv_bfloat16 *residual, const __nv_bfloat16 *norm_weight, __nv_bfloat16 *sum,    \
      __nv_bfloat16 *normed, const MoeCombineParams p

extern "C" __global__ void __launch_bounds__(512) v_one(MOE_COMBINE_ARGS) {
  moe_combine::combine<__nv_bfloat16>(down, rows, weights, residual, norm_weight, sum, normed, p);
}
extern "C" __global__ void __launch_bounds__(512) v_c1(MOE_COMBINE_ARGS) {
  moe_combine::combine_split<__nv_bfloat16, 1>(down, weights, residual, norm_weight, sum, normed, p);
}
#define MOE_COMBINE_VARIANT(NAME, CL)                                                          \
  extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(512)                 \
      NAME(MOE_COMBINE_ARGS) {                                                                 \
    moe_combine::combine_split<__nv_bfloat16, CL>(down, weights, residual, norm_weight, sum,   \
                                                  normed, p);                                  \
  }
MOE_COMBINE_VARIANT(v_c2, 2)
MOE_COMBINE_VARIANT(v_c4, 4)
MOE_COMBINE_VARIANT(v_c8, 8)
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(512) x_c4_drop(MOE_COMBINE_ARGS) {
  moe_combine::combine_split<__nv_bfloat16, 4, 3>(down, weights, residual, norm_weight, sum, normed, p);
}
