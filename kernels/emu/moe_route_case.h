// The input both moe_route harnesses read (kernels/emu/moe_route_harness.cpp for the Metal
// kernels, kernels/emu/moe_route_cuda_harness.cpp for the CUDA bodies), checked against the
// host's contract (ops/moe_route/mod.rs `supports`).
//
// stdin, little-endian: "ROUTEMU2", then u32 in_type (0 f32, 1 f16, 2 bf16), tokens N,
// experts E, top_k k, renormalise, has_shared, body (0: one simdgroup a token, 1: one
// threadgroup a token); then f32 logits [N, E + has_shared], converted to the input type by
// the harness (exactly, when the caller already rounded them).
// stdout: ids [N, S] as raw u32 words, then f32 weights [N, S] (S = k + has_shared).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moe_route_case {

enum Body : std::uint32_t { kWarp = 0, kBlock = 1 };

struct Case {
  std::uint32_t in_type;
  MoeRouteParams p;
  Body body;
  std::vector<float> logits;
};

inline Case read() {
  const auto h = guarded::start<7>("moe_route_harness", "ROUTEMU2");
  Case c{h[0], MoeRouteParams{h[1], h[2], h[3], h[4], h[5]}, Body(h[6]), {}};
  if (c.p.experts == 0 || c.p.experts > 512) guarded::die("experts must be 1..=512");
  if (c.p.top_k == 0 || c.p.top_k > 32 || c.p.top_k > c.p.experts) guarded::die("top_k must be 1..=min(32, experts)");
  if (c.p.renormalise > 1 || c.p.has_shared > 1) guarded::die("flags must be 0 or 1");
  if (h[6] > 1) guarded::die("body must be 0 (warp) or 1 (block)");
  c.logits = guarded::read_raw<float>(std::size_t(c.p.tokens) * (c.p.experts + c.p.has_shared));
  guarded::expect_end();
  return c;
}

}  // namespace moe_route_case
