// Runs the shipped kernels/attn_decode.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/attn_decode_emulation.rs.
//
// stdin and stdout: kernels/emu/attn_decode_case.h (shared with the CUDA bodies' harness).
//
// The launch geometry is crates/gdn-ops/src/ops/attn_decode/metal.rs's: threadgroups
// (Nq, B, 1) of (32, S, 1) threads with S * (2 + Dh) floats of threadgroup memory (the
// emulator fills it with NaN first and aborts past 32 KB); with P > 1, attn_decode_split_*
// on threadgroups (Nq, B, P) into NaN-filled partials [B, Nq, P, 2 + Dh], then
// attn_decode_combine_* on threadgroups (Nq, B, 1) of 32 threads. Buffers are guarded
// (guarded_buffer.h).
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/attn_decode_harness.cpp -o attn_decode_harness

#include "guarded_buffer.h"
#include "metal_math.h"

#include "../attn_decode.metal"
#include "attn_decode_case.h"

namespace {

using attn_decode_case::Case;

template <class T>
using Kernel = void (*)(const device T*, const device T*, const device T*, const device T*,
                        const device uint*, device T*, constant AttnDecodeParams&, threadgroup float*,
                        uint3, uint, uint);

template <class T>
using SplitKernel = void (*)(const device T*, const device T*, const device T*, const device uint*,
                             device float*, constant AttnDecodeParams&, threadgroup float*, uint3, uint,
                             uint);

template <class T>
using CombineKernel = void (*)(const device float*, const device T*, device T*, constant AttnDecodeParams&,
                               uint3, uint);

template <class T>
void run(const Case& c, Kernel<T> kernel, SplitKernel<T> split, CombineKernel<T> combine) {
  const AttnDecodeParams& p = c.p;
  attn_decode_case::Buffers<T> b(c);
  auto &q = b.q, &gate = b.gate, &keys = b.keys, &values = b.values, &out = b.out;
  auto& pos = b.pos;
  auto& partials = b.partials;
  // AttnDecodeDims::scratch_bytes: rounded up to 16 bytes, as Metal requires.
  const std::size_t scratch_bytes = (std::size_t(p.simdgroups) * (2 + p.head_dim) * sizeof(float) + 15) / 16 * 16;
  constant AttnDecodeParams& params = *(constant AttnDecodeParams*)&p;
  if (p.splits == 1) {
    metal_emu::dispatch_threadgroups(
        uint3{p.q_heads, p.batch, 1}, uint3{32, p.simdgroups, 1}, scratch_bytes, [&](const metal_emu::ThreadIds& id) {
          kernel((const device T*)q.data(), (const device T*)gate.data(), (const device T*)keys.data(),
                 (const device T*)values.data(), (const device uint*)pos.data(), (device T*)out.data(), params,
                 (threadgroup float*)id.threadgroup_memory, id.threadgroup_position_in_grid,
                 id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup);
        });
  } else {
    metal_emu::dispatch_threadgroups(
        uint3{p.q_heads, p.batch, p.splits}, uint3{32, p.simdgroups, 1}, scratch_bytes,
        [&](const metal_emu::ThreadIds& id) {
          split((const device T*)q.data(), (const device T*)keys.data(), (const device T*)values.data(),
                (const device uint*)pos.data(), (device float*)partials.data(), params,
                (threadgroup float*)id.threadgroup_memory, id.threadgroup_position_in_grid,
                id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup);
        });
    metal_emu::dispatch_threadgroups(uint3{p.q_heads, p.batch, 1}, uint3{32, 1, 1}, [&](const metal_emu::ThreadIds& id) {
      combine((const device float*)partials.data(), (const device T*)gate.data(), (device T*)out.data(), params,
              id.threadgroup_position_in_grid, id.thread_index_in_simdgroup);
    });
  }
  b.check_and_write();
}

}  // namespace

int main() {
  guarded::install_fault_handler("attn_decode_harness");
  const Case c = attn_decode_case::read();
  switch (c.type) {
    case 0: run<float>(c, attn_decode_f32, attn_decode_split_f32, attn_decode_combine_f32); break;
    case 1: run<half>(c, attn_decode_f16, attn_decode_split_f16, attn_decode_combine_f16); break;
    case 2: run<bfloat>(c, attn_decode_bf16, attn_decode_split_bf16, attn_decode_combine_bf16); break;
  }
  return guarded::finish();
}
