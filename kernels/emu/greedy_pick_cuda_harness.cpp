// Runs the bodies of the shipped kernels/greedy_pick.cu (greedy_pick::slices, greedy_pick::finish)
// on the CPU through kernels/emu/cuda/cuda_emu.h, with the launch geometry of
// crates/gdn-ops/src/ops/greedy_pick/cuda.rs: blocks (B, N) of GREEDY_PICK_THREADS threads with
// their 3 words per warp of shared memory (NaN before each block), into guarded partials that
// the slice pass must fill completely; then blocks (N) of 32 threads. Used by
// crates/gdn-ops/tests/greedy_pick_emulation.rs.
//
// stdin and stdout: those of kernels/emu/greedy_pick_harness.cpp (the Metal kernels'), so that
// one test drives both.
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        kernels/emu/greedy_pick_cuda_harness.cpp

#include "guarded_buffer.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

#include "../greedy_pick.cu"
#include "greedy_pick_case.h"

namespace {

using namespace guarded;

template <class T>
void run(const GreedyPickParams& p, const std::vector<float>& values) {
  Buffer<T> logits("logits", values.size(), Kind::kInput);
  logits.fill(values);
  static_assert(sizeof(GreedyPickPartial) == 3 * sizeof(uint), "3 words a record");
  Buffer<uint> partials("partials", std::size_t(p.rows) * p.blocks * 3, Kind::kOutput);
  Buffer<uint> out("out", std::size_t(p.rows) * 2, Kind::kOutput);
  auto* records = reinterpret_cast<GreedyPickPartial*>(partials.data());
  BlockShared shared(3 * greedy_pick::kWarps);
  auto* scratch = reinterpret_cast<uint32_t*>(shared.smem);
  metal_emu::dispatch_threadgroups(
      uint3{p.blocks, p.rows, 1}, uint3{GREEDY_PICK_THREADS, 1, 1}, [&](const metal_emu::ThreadIds& id) {
        shared.poison(id);
        const uint3 block = id.threadgroup_position_in_grid;
        greedy_pick::slices<T>(logits.data(), records, scratch, p, block.x, block.y,
                               id.thread_index_in_threadgroup);
      });
  guarded::check_all(partials, shared);
  metal_emu::dispatch_threadgroups(uint3{p.rows, 1, 1}, uint3{32, 1, 1}, [&](const metal_emu::ThreadIds& id) {
    greedy_pick::finish(records, out.data(), p, id.threadgroup_position_in_grid.x, id.thread_index_in_simdgroup);
  });
  guarded::check_all(logits, partials, out);
  out.write_words();
}

}  // namespace

int main() {
  install_fault_handler("greedy_pick_cuda_harness");
  const greedy_pick_case::Case c = greedy_pick_case::read();
  guarded::by_code<float, __half, __nv_bfloat16>(
      c.in_type, "unknown in_type", [&](auto t) { run<typename decltype(t)::type>(c.p, c.values); });
  return guarded::finish();
}
