// Runs the shipped kernels/indexer_pool.metal on the CPU through metal_emu.h, as
// ops/indexer_pool/metal.rs encodes it: one threadgroup of one simdgroup (32 threads) with Di
// floats of threadgroup memory. Used by crates/gdn-ops/tests/indexer_pool_emulation.rs.
//
// stdin and stdout: kernels/emu/indexer_pool_case.h. The tail and the blocks are guarded
// in-place buffers, every other buffer a read-only input. Memory checks and exit codes:
// kernels/emu/guarded_buffer.h.
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/indexer_pool_harness.cpp -o indexer_pool_harness

#include "guarded_buffer.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "metal_emu.h"

#include "../indexer_pool.metal"
#include "indexer_pool_case.h"

namespace {

using namespace guarded;

template <class InT>
using PoolKernel = void (*)(const device InT*, device float*, device float*, const device uint*,
                            const device uint*, const device float*, const device float*,
                            const device float*, constant IndexerPoolParams&, threadgroup float*, uint);

template <class InT>
void run(const indexer_pool_case::Case& c, PoolKernel<InT> kernel) {
  Buffer<InT> qk("qk", c.qk, Kind::kInput);
  Buffer<float> tail("tail", c.tail, Kind::kInPlace);
  Buffer<float> blocks("blocks", c.blocks, Kind::kInPlace);
  Buffer<uint> tail_row("tail_row", std::vector<uint>{c.tail_row}, Kind::kInput);
  Buffer<uint> block_row("block_row", std::vector<uint>{c.block_row}, Kind::kInput);
  Buffer<float> cs("cos", c.cos, Kind::kInput);
  Buffer<float> sn("sin", c.sin, Kind::kInput);
  Buffer<float> norm("norm", c.norm, Kind::kInput);
  IndexerPoolParams params_copy = c.p;
  auto* params = (constant IndexerPoolParams*)&params_copy;
  metal_emu::dispatch_threadgroups(
      uint3{1, 1, 1}, uint3{32, 1, 1}, std::size_t(c.p.dim) * sizeof(float),
      [&](const metal_emu::ThreadIds& id) {
        kernel((const device InT*)qk.data(), (device float*)tail.data(), (device float*)blocks.data(),
               (const device uint*)tail_row.data(), (const device uint*)block_row.data(),
               (const device float*)cs.data(), (const device float*)sn.data(),
               (const device float*)norm.data(), *params, id.threadgroup_memory_as<float>(),
               id.thread_index_in_simdgroup);
      });
  guarded::check_all(qk, tail, blocks, tail_row, block_row, cs, sn, norm);
  tail.write_f32();
  blocks.write_f32();
}

}  // namespace

int main() {
  install_fault_handler("indexer_pool_harness");
  const indexer_pool_case::Case c = indexer_pool_case::read();
  guarded::by_type(c.in_type, indexer_pool_f32, indexer_pool_f16, indexer_pool_bf16,
                   [&](auto t, auto kernel) { run<typename decltype(t)::type>(c, kernel); });
  return guarded::finish();
}
