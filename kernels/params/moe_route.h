// Parameters of the MoE router kernel (kernels/moe_route.metal, kernels/moe_route.cu),
// declared once for the shaders, the emulation harness and the host: mirrored field for field
// by `MoeRouteParams` in crates/gdn-ops/src/ops/moe_route/mod.rs (#[repr(C)]).
#ifndef QWEN_GDN_PARAMS_MOE_ROUTE_H
#define QWEN_GDN_PARAMS_MOE_ROUTE_H

struct MoeRouteParams {
  unsigned int tokens;       // N: logits rows, one simdgroup (warp) each
  unsigned int experts;      // E: routed experts (softmax width), at most 512
  unsigned int top_k;        // k: 1..=32, k <= E
  unsigned int renormalise;  // 1: chosen weights divided by their sum
  unsigned int has_shared;   // 1: logits rows hold E + 1 values; slot k is the shared expert
};

#endif
