// Runs the body of the shipped kernels/indexer_pool.cu (indexer_pool::pool) on the CPU through
// kernels/emu/cuda/cuda_emu.h, with the launch geometry of crates/gdn-ops/src/ops/indexer_pool/
// cuda.rs: one block of 32 threads, its INDEXER_POOL_MAX_DIM floats of shared memory NaN before
// the block. Used by crates/gdn-ops/tests/indexer_pool_emulation.rs.
//
// stdin and stdout: those of kernels/emu/indexer_pool_harness.cpp (the Metal kernel's), so that
// one test drives both.
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        kernels/emu/indexer_pool_cuda_harness.cpp

#include "guarded_buffer.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

#include "../indexer_pool.cu"
#include "indexer_pool_case.h"

namespace {

using namespace guarded;

template <class T>
void run(const indexer_pool_case::Case& c) {
  Buffer<T> qk("qk", c.qk, Kind::kInput);
  Buffer<float> tail("tail", c.tail, Kind::kInPlace);
  Buffer<float> blocks("blocks", c.blocks, Kind::kInPlace);
  Buffer<uint32_t> tail_row("tail_row", std::vector<uint32_t>{c.tail_row}, Kind::kInput);
  Buffer<uint32_t> block_row("block_row", std::vector<uint32_t>{c.block_row}, Kind::kInput);
  Buffer<float> cs("cos", c.cos, Kind::kInput);
  Buffer<float> sn("sin", c.sin, Kind::kInput);
  Buffer<float> norm("norm", c.norm, Kind::kInput);
  BlockShared shared(INDEXER_POOL_MAX_DIM);
  metal_emu::dispatch_threadgroups(uint3{1, 1, 1}, uint3{32, 1, 1}, [&](const metal_emu::ThreadIds& id) {
    shared.poison(id);
    indexer_pool::pool<T>(qk.data(), tail.data(), blocks.data(), tail_row.data(), block_row.data(), cs.data(),
                          sn.data(), norm.data(), c.p, shared.smem, id.thread_index_in_threadgroup);
  });
  guarded::check_all(qk, tail, blocks, tail_row, block_row, cs, sn, norm, shared);
  tail.write_f32();
  blocks.write_f32();
}

}  // namespace

int main() {
  install_fault_handler("indexer_pool_cuda_harness");
  const indexer_pool_case::Case c = indexer_pool_case::read();
  guarded::by_code<float, __half, __nv_bfloat16>(c.in_type, "unknown in_type",
                                                  [&](auto t) { run<typename decltype(t)::type>(c); });
  return guarded::finish();
}
