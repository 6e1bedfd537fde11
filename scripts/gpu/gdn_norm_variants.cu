// Variants of kernels/gated_delta_norm.cu for scripts/gpu/gdn_norm_cuda.py (bf16 activations,
// f32 state): the blocks a head is split over (a cluster of CL), the block's launch bound, and
// the rows a warp may own. The shipped entry points are the first two.
//   nvcc -ptx -arch=sm_90 -O3 -I kernels scripts/gpu/gdn_norm_variants.cu -o gdn_norm_variants.ptx
#define GDN_NORM_NO_ENTRY_POINTS
#include "gated_delta_norm.cu"

#define GDN_NORM_ARGS                                                                         \
  const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *g,     \
      const float *beta, float *state, const __nv_bfloat16 *z, const __nv_bfloat16 *weight,   \
      __nv_bfloat16 *out, const GdnNormParams p
#define GDN_NORM_CALL(CL, FEW, MANY) \
  gated_delta_norm::entry<__nv_bfloat16, float, CL, FEW, MANY>(q, k, v, g, beta, state, z, weight, out, p)

extern "C" __global__ void __launch_bounds__(1024) v_one_t1024(GDN_NORM_ARGS) { GDN_NORM_CALL(1, 4, 8); }
#define GDN_NORM_VARIANT(NAME, CL, THREADS, FEW, MANY)                                      \
  extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(THREADS)          \
      NAME(GDN_NORM_ARGS) {                                                                 \
    GDN_NORM_CALL(CL, FEW, MANY);                                                           \
  }
GDN_NORM_VARIANT(v_c4_t1024, 4, 1024, 1, 2)
GDN_NORM_VARIANT(v_c4_t512, 4, 512, 2, 4)
GDN_NORM_VARIANT(v_c4_t256, 4, 256, 4, 8)
GDN_NORM_VARIANT(v_c2_t1024, 2, 1024, 2, 4)
GDN_NORM_VARIANT(v_c8_t512, 8, 512, 1, 2)
GDN_NORM_VARIANT(v_c8_t256, 8, 256, 2, 4)
