// Runs the shipped kernels/attn_decode.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/attn_decode_emulation.rs.
//
// stdin, little-endian: "ADECEMU1", u32 type (0 f32, 1 f16, 2 bf16), batch B, q_heads Nq,
// kv_heads Nkv, head_dim Dh, capacity cap, pos, simdgroups S, splits P, f32 scale; then f32 q
// [B, Nq, Dh], gate [B, Nq*Dh], keys and values [B, Nkv, cap, Dh].
// stdout: f32 out [B, Nq*Dh].
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

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  AttnDecodeParams p;
  uint pos;
  std::vector<float> q, gate, keys, values;
};

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
  Buffer<T> q("q", c.q.size(), Kind::kInput);
  Buffer<T> gate("gate", c.gate.size(), Kind::kInput);
  Buffer<T> keys("keys", c.keys.size(), Kind::kInput);
  Buffer<T> values("values", c.values.size(), Kind::kInput);
  Buffer<uint> pos("pos", 1, Kind::kInput);
  Buffer<T> out("out", c.q.size(), Kind::kOutput);
  q.fill(c.q);
  gate.fill(c.gate);
  keys.fill(c.keys);
  values.fill(c.values);
  pos.fill(std::vector<uint>{c.pos});
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
    // Written by the split pass, every float of it (NaN until then, so a record it skips
    // poisons the result).
    Buffer<float> partials("partials", std::size_t(p.batch) * p.q_heads * p.splits * (2 + p.head_dim),
                           Kind::kOutput);
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
    partials.check();
  }
  q.check();
  gate.check();
  keys.check();
  values.check();
  pos.check();
  out.check();
  out.write_f32();
}

}  // namespace

int main() {
  guarded::install_fault_handler("attn_decode_harness");
  guarded::expect_magic("ADECEMU1");
  const auto h = guarded::read_raw<std::uint32_t>(10);
  Case c;
  const std::uint32_t type = h[0];
  float scale;
  std::memcpy(&scale, &h[9], 4);
  c.p = AttnDecodeParams{h[1], h[2], h[3], h[4], h[5], h[7], h[8], scale};
  c.pos = h[6];
  const AttnDecodeParams& p = c.p;
  if (type > 2 || p.batch == 0 || p.kv_heads == 0 || p.q_heads % p.kv_heads != 0 || p.head_dim % 32 != 0 ||
      p.head_dim == 0 || p.head_dim > 256 || p.capacity == 0 || p.simdgroups == 0 || p.splits == 0 || p.splits > 65535) {
    guarded::die("bad header");
  }
  const std::size_t q_len = std::size_t(p.batch) * p.q_heads * p.head_dim;
  const std::size_t kv = std::size_t(p.batch) * p.kv_heads * p.capacity * p.head_dim;
  c.q = guarded::read_raw<float>(q_len);
  c.gate = guarded::read_raw<float>(q_len);
  c.keys = guarded::read_raw<float>(kv);
  c.values = guarded::read_raw<float>(kv);
  guarded::expect_end();
  switch (type) {
    case 0: run<float>(c, attn_decode_f32, attn_decode_split_f32, attn_decode_combine_f32); break;
    case 1: run<half>(c, attn_decode_f16, attn_decode_split_f16, attn_decode_combine_f16); break;
    case 2: run<bfloat>(c, attn_decode_bf16, attn_decode_split_bf16, attn_decode_combine_bf16); break;
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}
