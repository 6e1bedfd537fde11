// Runs the bodies of the shipped kernels/attn_decode.cu (attn_decode::run, attn_decode::combine)
// on the CPU through kernels/emu/cuda/cuda_emu.h, with the launch geometry of
// crates/gdn-ops/src/ops/attn_decode/cuda.rs: blocks (Nq, B, 1) of (32, S) threads and
// S * (2 + Dh) floats of shared memory (NaN before each block, so that a read of what no
// thread wrote poisons the result); with P > 1 the split pass on blocks (Nq, B, P) into
// NaN-filled partials [B, Nq, P, 2 + Dh], then the combine pass on blocks (Nq, B) of 32
// threads. Used by crates/gdn-ops/tests/attn_decode_emulation.rs.
//
// stdin and stdout: as kernels/emu/attn_decode_harness.cpp (the Metal kernels' harness), so
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

// The entry points' extern __shared__ array (never used here: the harness passes its own).
extern "C" {
float attn_decode_scratch[1];
}

#include "../attn_decode.cu"

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  AttnDecodeParams p;
  uint32_t pos;
  std::vector<float> q, gate, keys, values;
};

template <class T>
void run(const Case& c) {
  const AttnDecodeParams& p = c.p;
  Buffer<T> q("q", c.q.size(), Kind::kInput);
  Buffer<T> gate("gate", c.gate.size(), Kind::kInput);
  Buffer<T> keys("keys", c.keys.size(), Kind::kInput);
  Buffer<T> values("values", c.values.size(), Kind::kInput);
  Buffer<uint32_t> pos("pos", 1, Kind::kInput);
  Buffer<T> out("out", c.q.size(), Kind::kOutput);
  q.fill(c.q);
  gate.fill(c.gate);
  keys.fill(c.keys);
  values.fill(c.values);
  pos.fill(std::vector<uint32_t>{c.pos});
  const std::size_t floats = std::size_t(p.simdgroups) * (2 + p.head_dim);
  Buffer<float> shared("shared memory", floats, Kind::kInPlace);
  shared.fill(std::vector<float>(floats, 0.f));
  float* smem = shared.data();
  // Thread 0 runs first in every block: fresh poison for each.
  auto poison = [&](const metal_emu::ThreadIds& id) {
    if (id.thread_index_in_threadgroup == 0) {
      for (std::size_t i = 0; i < floats; ++i) smem[i] = std::numeric_limits<float>::quiet_NaN();
    }
  };
  const uint3 threads{32, p.simdgroups, 1};
  if (p.splits == 1) {
    metal_emu::dispatch_threadgroups(uint3{p.q_heads, p.batch, 1}, threads, [&](const metal_emu::ThreadIds& id) {
      poison(id);
      const uint3 block = id.threadgroup_position_in_grid;
      attn_decode::run<T, false>(q.data(), gate.data(), keys.data(), values.data(), pos.data(), out.data(),
                                 nullptr, p, block.x, block.y, block.z, id.simdgroup_index_in_threadgroup,
                                 id.thread_index_in_simdgroup, smem);
    });
  } else {
    Buffer<float> partials("partials", std::size_t(p.batch) * p.q_heads * p.splits * (2 + p.head_dim),
                           Kind::kOutput);
    metal_emu::dispatch_threadgroups(
        uint3{p.q_heads, p.batch, p.splits}, threads, [&](const metal_emu::ThreadIds& id) {
          poison(id);
          const uint3 block = id.threadgroup_position_in_grid;
          attn_decode::run<T, true>(q.data(), nullptr, keys.data(), values.data(), pos.data(), nullptr,
                                    partials.data(), p, block.x, block.y, block.z,
                                    id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup, smem);
        });
    metal_emu::dispatch_threadgroups(uint3{p.q_heads, p.batch, 1}, uint3{32, 1, 1}, [&](const metal_emu::ThreadIds& id) {
      const uint3 block = id.threadgroup_position_in_grid;
      attn_decode::combine<T>(partials.data(), gate.data(), out.data(), p, block.x, block.y,
                              id.thread_index_in_simdgroup);
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
  guarded::install_fault_handler("attn_decode_cuda_harness");
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
      p.head_dim == 0 || p.head_dim > 256 || p.capacity == 0 || p.simdgroups == 0 || p.splits == 0 ||
      p.splits > 65535) {
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
    case 0: run<float>(c); break;
    case 1: run<__half>(c); break;
    case 2: run<__nv_bfloat16>(c); break;
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}
