// Runs the shipped kernels/moe_route.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/moe_route_emulation.rs.
//
// stdin and stdout: kernels/emu/moe_route_case.h (one input type, the shape, the body).
//
// The launch geometries are ops/moe_route/metal.rs's: moe_route_<in> in threadgroups
// (N, 1, 1) of (32, 1, 1) threads; moe_route_block_<in> in threadgroups (N, 1, 1) of
// (32 * ceil(E / 32), 1, 1) threads with kBlockScratchWords words of threadgroup memory.
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
#include "moe_route_case.h"

namespace {

using namespace guarded;

template <class InT>
using RouteKernel = void (*)(const device InT*, device uint*, device float*, constant MoeRouteParams&, uint3, uint);
template <class InT>
using BlockKernel = void (*)(const device InT*, device uint*, device float*, constant MoeRouteParams&,
                             threadgroup float*, uint3, uint, uint);

template <class InT>
void run(const moe_route_case::Case& c, RouteKernel<InT> warp_kernel, BlockKernel<InT> block_kernel) {
  const MoeRouteParams& p = c.p;
  const std::size_t slots = std::size_t(p.top_k) + p.has_shared;
  Buffer<InT> logits("logits", c.logits.size(), Kind::kInput);
  Buffer<uint> ids("ids", p.tokens * slots, Kind::kOutput);
  Buffer<float> weights("weights", p.tokens * slots, Kind::kOutput);
  logits.fill(c.logits);
  const auto in = (const device InT*)logits.data();
  const auto ids_out = (device uint*)ids.data();
  const auto weights_out = (device float*)weights.data();
  const auto params = (constant MoeRouteParams*)&p;
  if (c.body == moe_route_case::kWarp) {
    metal_emu::dispatch_threadgroups(uint3{p.tokens, 1, 1}, uint3{32, 1, 1}, [&](const metal_emu::ThreadIds& id) {
      warp_kernel(in, ids_out, weights_out, *params, id.threadgroup_position_in_grid, id.thread_index_in_simdgroup);
    });
  } else {
    const uint threads = 32 * ((p.experts + 31) / 32);
    metal_emu::dispatch_threadgroups(
        uint3{p.tokens, 1, 1}, uint3{threads, 1, 1}, kBlockScratchWords * 4, [&](const metal_emu::ThreadIds& id) {
          block_kernel(in, ids_out, weights_out, *params, id.threadgroup_memory_as<float>(),
                       id.threadgroup_position_in_grid, id.thread_index_in_threadgroup, id.simdgroups_per_threadgroup);
        });
  }
  guarded::check_all(logits, ids, weights);
  ids.write_words();
  weights.write_f32();
}

}  // namespace

int main() {
  const moe_route_case::Case c = moe_route_case::read();
  switch (c.in_type) {
    case 0: run<float>(c, moe_route_f32, moe_route_block_f32); break;
    case 1: run<half>(c, moe_route_f16, moe_route_block_f16); break;
    case 2: run<bfloat>(c, moe_route_bf16, moe_route_block_bf16); break;
    default: die("unknown type");
  }
  return guarded::finish();
}
