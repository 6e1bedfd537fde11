// Parameters of the MoE combine kernel (kernels/moe_combine.metal, kernels/moe_combine.cu),
// declared once for the shaders, the emulation harness and the host: mirrored field for field
// by `MoeCombineParams` in crates/gdn-ops/src/ops/moe_combine/mod.rs (#[repr(C)]).
#ifndef QWEN_GDN_PARAMS_MOE_COMBINE_H
#define QWEN_GDN_PARAMS_MOE_COMBINE_H

struct MoeCombineParams {
  unsigned int tokens;    // N
  unsigned int slots;     // S: expert outputs summed per token
  unsigned int hidden;    // H
  unsigned int has_norm;  // 1: normed = rms_norm(sum) * norm_weight is written
  float eps;              // the RMSNorm epsilon (read only when has_norm)
  unsigned int has_residual;  // 0: no residual (sum = InT(acc)); residual never read
  unsigned int gathered;      // 1: down is [down_rows, H] and rows[n, s] names the row of slot s
  unsigned int down_rows;     // rows of down when gathered; a row index past it adds nothing
};

#endif
