// Parameters of the fused residual add + RMSNorm kernels (kernels/add_rms_norm.metal,
// kernels/add_rms_norm.cu), declared once for the shaders, the emulation harness and the
// host: mirrored field for field by `AddRmsNormParams` in
// crates/gdn-ops/src/ops/add_rms_norm/mod.rs (#[repr(C)]).
#ifndef QWEN_GDN_PARAMS_ADD_RMS_NORM_H
#define QWEN_GDN_PARAMS_ADD_RMS_NORM_H

struct AddRmsNormParams {
  unsigned int rows;       // N
  unsigned int cols;       // H
  unsigned int has_delta;  // 1: sum = residual + delta is written; 0: sum is the residual
  float eps;
};

#endif
