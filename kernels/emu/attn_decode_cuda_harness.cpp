// Runs the bodies of the shipped kernels/attn_decode.cu (attn_decode::run, attn_decode::combine)
// on the CPU through kernels/emu/cuda/cuda_emu.h, with the launch geometry of
// crates/gdn-ops/src/ops/attn_decode/cuda.rs: blocks (Nq, B, 1) of (32, S) threads and
// S * (2 + Dh) floats of shared memory (NaN before each block, so that a read of what no
// thread wrote poisons the result); with P > 1 the split pass on blocks (Nq, B, P) into
// NaN-filled partials [B, Nq, P, 2 + Dh], then the combine pass on blocks (Nq, B) of 32
// threads. Used by crates/gdn-ops/tests/attn_decode_emulation.rs.
//
// Built with -DATTN_DECODE_HEADS=1 or 2, the split cases run the long-context passes instead
// (attn_decode::run_pipelined<T, ATTN_DECODE_HEADS> on blocks (Nq / heads, B, P), then
// combine_wide on blocks of Dh threads), which take rows of 16 bytes a lane only (another
// width leaves the records NaN).
//
// stdin and stdout: kernels/emu/attn_decode_case.h (shared with the Metal kernels' harness), so
// that one test drives both.
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        -I kernels kernels/emu/attn_decode_cuda_harness.cpp

#include "guarded_buffer.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

// The entry points' extern __shared__ array (never used here: the harness passes its own).
extern "C" {
float attn_decode_scratch[1];
}

#include "../attn_decode.cu"
#include "attn_decode_case.h"

namespace {

using attn_decode_case::Case;

// Query heads a block of the long-context split pass takes (2: head pairs, for cases whose
// GQA group is even); the shipped pass takes one.
#ifdef ATTN_DECODE_HEADS
constexpr uint32_t kHeads = ATTN_DECODE_HEADS;
#else
constexpr uint32_t kHeads = 1;
#endif

template <class T>
void run(const Case& c) {
  const AttnDecodeParams& p = c.p;
  attn_decode_case::Buffers<T> b(c);
  auto &q = b.q, &gate = b.gate, &keys = b.keys, &values = b.values, &out = b.out;
  auto& pos = b.pos;
  auto& partials = b.partials;
  const std::size_t floats = std::size_t(p.simdgroups) * (2 + p.head_dim);
  BlockShared shared(floats);
  float* smem = shared.smem;
  const uint3 threads{32, p.simdgroups, 1};
  if (p.splits == 1) {
    metal_emu::dispatch_threadgroups(uint3{p.q_heads, p.batch, 1}, threads, [&](const metal_emu::ThreadIds& id) {
      shared.poison(id);
      const uint3 block = id.threadgroup_position_in_grid;
      attn_decode::run<T, false>(q.data(), gate.data(), keys.data(), values.data(), pos.data(), out.data(),
                                 nullptr, p, block.x, block.y, block.z, id.simdgroup_index_in_threadgroup,
                                 id.thread_index_in_simdgroup, smem);
    });
  } else {
    metal_emu::dispatch_threadgroups(
        uint3{p.q_heads / kHeads, p.batch, p.splits}, threads, [&](const metal_emu::ThreadIds& id) {
          shared.poison(id);
          const uint3 block = id.threadgroup_position_in_grid;
#ifdef ATTN_DECODE_HEADS
          attn_decode::run_pipelined<T, kHeads>(
              q.data(), keys.data(), values.data(), pos.data(), partials.data(), p, block.x, block.y, block.z,
              id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup, smem);
#else
          attn_decode::run<T, true>(q.data(), nullptr, keys.data(), values.data(), pos.data(), nullptr,
                                    partials.data(), p, block.x, block.y, block.z,
                                    id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup, smem);
#endif
        });
#ifdef ATTN_DECODE_HEADS
    // The wide combine: Dh threads a block, a thread a feature (up to 256: the emulator's
    // threadgroups of 32-thread simdgroups).
    metal_emu::dispatch_threadgroups(uint3{p.q_heads, p.batch, 1}, uint3{32, p.head_dim / 32, 1},
                                     [&](const metal_emu::ThreadIds& id) {
                                       const uint3 block = id.threadgroup_position_in_grid;
                                       attn_decode::combine_wide<T>(partials.data(), gate.data(), out.data(), p,
                                                                    block.x, block.y,
                                                                    id.thread_index_in_threadgroup);
                                     });
#else
    metal_emu::dispatch_threadgroups(uint3{p.q_heads, p.batch, 1}, uint3{32, 1, 1}, [&](const metal_emu::ThreadIds& id) {
      const uint3 block = id.threadgroup_position_in_grid;
      attn_decode::combine<T>(partials.data(), gate.data(), out.data(), p, block.x, block.y,
                              id.thread_index_in_simdgroup);
    });
#endif
  }
  shared.check();
  b.check_and_write();
}

}  // namespace

int main() {
  guarded::install_fault_handler("attn_decode_cuda_harness");
  const Case c = attn_decode_case::read();
  guarded::by_code<float, __half, __nv_bfloat16>(c.type, "unknown type",
                                                 [&](auto t) { run<typename decltype(t)::type>(c); });
  return guarded::finish();
}
