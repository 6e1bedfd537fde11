// Runs the bodies of the shipped kernels/moe_route.cu on the CPU through
// kernels/emu/cuda/cuda_emu.h, with the launch geometries of
// crates/gdn-ops/src/ops/moe_route/cuda.rs: the warp body (moe_route::route) in blocks of
// (32, 4) threads, one warp a token; the block body (moe_route::route_block) in one block a
// token of 32 * ceil(E / 32) threads (`block_threads`), with its shared memory (NaN before
// each block). Used by crates/gdn-ops/tests/moe_route_emulation.rs.
//
// stdin and stdout: those of kernels/emu/moe_route_harness.cpp (the Metal kernels'), so that
// one test drives both.
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        kernels/emu/moe_route_cuda_harness.cpp

#include "guarded_buffer.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

#include "../moe_route.cu"
#include "moe_route_case.h"

namespace {

using namespace guarded;

constexpr uint kTokensPerBlock = 4;  // cuda.rs TOKENS_PER_BLOCK

template <class T>
void run(const moe_route_case::Case& c) {
  const std::size_t slots = std::size_t(c.p.top_k) + c.p.has_shared;
  Buffer<T> logits("logits", c.logits.size(), Kind::kInput);
  Buffer<uint> ids("ids", c.p.tokens * slots, Kind::kOutput);
  Buffer<float> weights("weights", c.p.tokens * slots, Kind::kOutput);
  logits.fill(c.logits);
  const MoeRouteParams p = c.p;
  if (c.body == moe_route_case::kWarp) {
    metal_emu::dispatch_threadgroups(
        uint3{(p.tokens + kTokensPerBlock - 1) / kTokensPerBlock, 1, 1}, uint3{32, kTokensPerBlock, 1},
        [&](const metal_emu::ThreadIds& id) {
          const uint token = id.threadgroup_position_in_grid.x * kTokensPerBlock + id.thread_position_in_threadgroup.y;
          moe_route::route<T>(logits.data(), ids.data(), weights.data(), p, token, id.thread_index_in_simdgroup);
        });
    guarded::check_all(logits, ids, weights);
  } else {
    static_assert(sizeof(moe_route::BlockShared) % sizeof(float) == 0, "shared memory in floats");
    BlockShared shared(sizeof(moe_route::BlockShared) / sizeof(float));
    auto& block_shared = *reinterpret_cast<moe_route::BlockShared*>(shared.smem);
    const uint warps = (p.experts + 31) / 32;
    metal_emu::dispatch_threadgroups(uint3{p.tokens, 1, 1}, uint3{32 * warps, 1, 1}, [&](const metal_emu::ThreadIds& id) {
      shared.poison(id);
      moe_route::route_block<T>(logits.data(), ids.data(), weights.data(), p, id.threadgroup_position_in_grid.x,
                                id.thread_index_in_threadgroup, warps, block_shared);
    });
    guarded::check_all(logits, ids, weights, shared);
  }
  ids.write_words();
  weights.write_f32();
}

}  // namespace

int main() {
  const moe_route_case::Case c = moe_route_case::read();
  guarded::by_code<float, __half, __nv_bfloat16>(c.in_type, "unknown in_type",
                                                 [&](auto t) { run<typename decltype(t)::type>(c); });
  return guarded::finish();
}
