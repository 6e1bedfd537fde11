// Runs the shipped kernels/greedy_pick.metal on the CPU through metal_emu.h: the slice pass,
// then the finish pass, as ops/greedy_pick/metal.rs encodes them. Used by
// crates/gdn-ops/tests/greedy_pick_emulation.rs.
//
// stdin: kernels/emu/greedy_pick_case.h ("GPICKEM1", the params, f32 logits [N, V]).
// stdout: out [N, 2] as raw u32 words.
//
// Geometry: slice pass threadgroups (B, N, 1) of (GREEDY_PICK_THREADS, 1, 1) threads with 3
// words of threadgroup memory per simdgroup; finish pass threadgroups (N, 1, 1) of (32, 1, 1).
// The partials between them are a guarded output that the slice pass must fill completely.
// Memory checks and exit codes: kernels/emu/guarded_buffer.h.
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/greedy_pick_harness.cpp -o greedy_pick_harness

#include "guarded_buffer.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "metal_emu.h"

#include "../greedy_pick.metal"
#include "greedy_pick_case.h"

namespace {

using namespace guarded;

template <class InT>
using SlicesKernel = void (*)(const device InT*, device GreedyPickPartial*, constant GreedyPickParams&,
                              threadgroup uint*, uint3, uint, uint, uint);

template <class InT>
void run(const GreedyPickParams& p, const std::vector<float>& values, SlicesKernel<InT> slices) {
  Buffer<InT> logits("logits", values.size(), Kind::kInput);
  logits.fill(values);
  static_assert(sizeof(GreedyPickPartial) == 3 * sizeof(uint), "3 words a record");
  Buffer<uint> partials("partials", std::size_t(p.rows) * p.blocks * 3, Kind::kOutput);
  Buffer<uint> out("out", std::size_t(p.rows) * 2, Kind::kOutput);
  GreedyPickParams params_copy = p;
  auto* params = (constant GreedyPickParams*)&params_copy;
  auto* records = (device GreedyPickPartial*)partials.data();
  const std::size_t scratch_bytes = GREEDY_PICK_THREADS / 32 * 3 * sizeof(uint);
  metal_emu::dispatch_threadgroups(
      uint3{p.blocks, p.rows, 1}, uint3{GREEDY_PICK_THREADS, 1, 1}, scratch_bytes,
      [&](const metal_emu::ThreadIds& id) {
        slices((const device InT*)logits.data(), records, *params,
               id.threadgroup_memory_as<uint>(), id.threadgroup_position_in_grid,
               id.thread_index_in_threadgroup, id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup);
      });
  partials.check();
  metal_emu::dispatch_threadgroups(uint3{p.rows, 1, 1}, uint3{32, 1, 1}, [&](const metal_emu::ThreadIds& id) {
    greedy_pick_finish(records, (device uint*)out.data(), *params,
                       id.threadgroup_position_in_grid, id.thread_index_in_simdgroup);
  });
  guarded::check_all(logits, partials, out);
  out.write_words();
}

}  // namespace

int main() {
  install_fault_handler("greedy_pick_harness");
  const greedy_pick_case::Case c = greedy_pick_case::read();
  guarded::by_type(c.in_type, greedy_pick_slices_f32, greedy_pick_slices_f16, greedy_pick_slices_bf16,
                   [&](auto t, auto slices) { run<typename decltype(t)::type>(c.p, c.values, slices); });
  return guarded::finish();
}
