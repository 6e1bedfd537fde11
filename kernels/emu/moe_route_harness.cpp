// Runs the shipped kernels/moe_route.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/moe_route_emulation.rs.
//
// stdin, little-endian: "ROUTEMU1", then u32 in_type (0 f32, 1 f16, 2 bf16), tokens N,
// experts E, top_k k, renormalise, has_shared; then f32 logits [N, E + has_shared], converted
// to InT here (exactly, when the caller already rounded them).
// stdout: ids [N, S] as raw u32 words, then f32 weights [N, S] (S = k + has_shared).
//
// The launch geometry is ops/moe_route/metal.rs's: threadgroups (N, 1, 1), threads (32, 1, 1).
// Memory checks and exit codes: kernels/emu/guarded_buffer.h.
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/moe_route_harness.cpp -o moe_route_harness

#include "guarded_buffer.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "metal_emu.h"

#include "../moe_route.metal"


namespace {

using namespace guarded;

template <class InT>
using RouteKernel = void (*)(const device InT*, device uint*, device float*, constant MoeRouteParams&, uint3, uint);

struct Case {
  uint tokens, experts, top_k, renormalise, has_shared;
  std::vector<float> logits;
};

template <class InT>
void run(const Case& c, RouteKernel<InT> kernel) {
  const std::size_t slots = std::size_t(c.top_k) + c.has_shared;
  Buffer<InT> logits("logits", c.logits.size(), Kind::kInput);
  Buffer<uint> ids("ids", c.tokens * slots, Kind::kOutput);
  Buffer<float> weights("weights", c.tokens * slots, Kind::kOutput);
  logits.fill(c.logits);
  const MoeRouteParams params{c.tokens, c.experts, c.top_k, c.renormalise, c.has_shared};
  metal_emu::dispatch_threadgroups(uint3{c.tokens, 1, 1}, uint3{32, 1, 1}, [&](const metal_emu::ThreadIds& id) {
    kernel((const device InT*)logits.data(), (device uint*)ids.data(), (device float*)weights.data(),
           *(constant MoeRouteParams*)&params, id.threadgroup_position_in_grid, id.thread_index_in_simdgroup);
  });
  guarded::check_all(logits, ids, weights);
  ids.write_words();
  weights.write_f32();
}

}  // namespace

int main() {
  const auto h = guarded::start<6>("moe_route_harness", "ROUTEMU1");
  Case c{h[1], h[2], h[3], h[4], h[5], {}};
  // The host's contract (ops/moe_route/mod.rs `supports`).
  if (c.experts == 0 || c.experts > 512) die("experts must be 1..=512");
  if (c.top_k == 0 || c.top_k > 32 || c.top_k > c.experts) die("top_k must be 1..=min(32, experts)");
  if (c.renormalise > 1 || c.has_shared > 1) die("flags must be 0 or 1");
  c.logits = read_raw<float>(std::size_t(c.tokens) * (c.experts + c.has_shared));
  guarded::expect_end();
  guarded::by_type(h[0], moe_route_f32, moe_route_f16, moe_route_bf16,
                   [&](auto t, auto kernel) { run<typename decltype(t)::type>(c, kernel); });
  return guarded::finish();
}
