// Runs the slot entries' bodies of the shipped kernels/attn_decode.cu (attn_decode::run_slot,
// attn_decode::combine_slot) on the CPU through kernels/emu/cuda/cuda_emu.h, with the launch
// geometry of crates/gdn-ops/src/ops/attn_decode_slots/cuda.rs: blocks (Nq, B, P) of (32, S)
// threads, P the most ranges of any sequence, S * (2 + Dh) floats of shared memory (NaN
// before each block); then, where any sequence splits, blocks (Nq, B) of Dh threads. Each
// sequence's KV buffers, position, capacity, ranges and passes come from a table of host
// addresses (the emulator's device memory is the host's), each buffer guarded on its own.
// The partials start NaN (a record read before it is written poisons the output).
// Used by crates/gdn-ops/tests/attn_decode_slots_emulation.rs.
//
// stdin, little-endian: "ADSLEMU1", u32 type (0 f32, 1 f16, 2 bf16), B, Nq, Nkv, Dh, S,
// f32 scale; per sequence u32 capacity, pos, splits, passes (attn_decode::kSingle ..
// kPairs); f32 q [B, Nq, Dh], gate [B, Nq*Dh]; per sequence f32 keys then values
// [Nkv, cap, Dh]. stdout: f32 out [B, Nq*Dh].
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        -I kernels kernels/emu/attn_decode_slots_cuda_harness.cpp

#include "guarded_buffer.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

// The entry points' extern __shared__ array (never used here: the harness passes its own).
extern "C" {
float attn_decode_scratch[1];
}

#include "../attn_decode.cu"

namespace {

struct Sequence {
  std::uint32_t capacity, pos, splits, passes;
  std::vector<float> keys, values;
};

struct Case {
  std::uint32_t type;
  AttnDecodeParams p;  // batch, heads, Dh, S, scale; capacity and splits: the most of any
  std::vector<Sequence> seqs;
  std::vector<float> q, gate;
};

Case read_case() {
  const auto h = guarded::start<6>("attn_decode_slots_cuda_harness", "ADSLEMU1");
  Case c;
  c.type = h[0];
  const float scale = guarded::read_f32_word();
  const std::uint32_t b = h[1], nq = h[2], nkv = h[3], dh = h[4], s = h[5];
  if (c.type > 2 || b == 0 || b > 8 || nkv == 0 || nq % nkv != 0 || dh % 32 != 0 || dh == 0 || dh > 256 ||
      s == 0) {
    guarded::die("bad header");
  }
  std::uint32_t most_cap = 1, most_splits = 1;
  for (std::uint32_t i = 0; i < b; ++i) {
    std::uint32_t w[4];
    guarded::read_words(w, 4);
    if (w[0] == 0 || w[2] == 0 || w[2] > 32 || w[3] > attn_decode::kPairs || (w[3] == attn_decode::kSingle) != (w[2] == 1)) {
      guarded::die("bad sequence");
    }
    c.seqs.push_back(Sequence{w[0], w[1], w[2], w[3], {}, {}});
    most_cap = std::max(most_cap, w[0]);
    most_splits = std::max(most_splits, w[2]);
  }
  c.p = AttnDecodeParams{b, nq, nkv, dh, most_cap, s, most_splits, scale};
  c.q = guarded::read_raw<float>(std::size_t(b) * nq * dh);
  c.gate = guarded::read_raw<float>(std::size_t(b) * nq * dh);
  for (auto& q : c.seqs) {
    const std::size_t kv = std::size_t(nkv) * q.capacity * dh;
    q.keys = guarded::read_raw<float>(kv);
    q.values = guarded::read_raw<float>(kv);
  }
  guarded::expect_end();
  return c;
}

template <class T>
void run(const Case& c) {
  const AttnDecodeParams& p = c.p;
  guarded::Buffer<T> q("q", c.q, guarded::Kind::kInput), gate("gate", c.gate, guarded::Kind::kInput);
  guarded::Buffer<T> out("out", c.q.size(), guarded::Kind::kOutput);
  const std::size_t records = std::size_t(p.batch) * p.q_heads * p.splits * (2 + p.head_dim);
  guarded::Buffer<float> partials("partials", std::vector<float>(records, std::numeric_limits<float>::quiet_NaN()),
                                  guarded::Kind::kInPlace);
  std::vector<std::unique_ptr<guarded::Buffer<T>>> kv;
  std::vector<std::unique_ptr<guarded::Buffer<std::uint32_t>>> pos;
  std::vector<attn_decode::Slot> slots;
  for (const auto& s : c.seqs) {
    kv.push_back(std::make_unique<guarded::Buffer<T>>("keys", s.keys, guarded::Kind::kInput));
    kv.push_back(std::make_unique<guarded::Buffer<T>>("values", s.values, guarded::Kind::kInput));
    pos.push_back(std::make_unique<guarded::Buffer<std::uint32_t>>("pos", std::vector<std::uint32_t>{s.pos},
                                                                   guarded::Kind::kInput));
    slots.push_back(attn_decode::Slot{kv[kv.size() - 2]->data(), kv.back()->data(), pos.back()->data(), s.capacity,
                                      s.splits, s.passes});
  }
  BlockShared shared(std::size_t(p.simdgroups) * (2 + p.head_dim));
  float* smem = shared.smem;
  metal_emu::dispatch_threadgroups(
      uint3{p.q_heads, p.batch, p.splits}, uint3{32, p.simdgroups, 1}, [&](const metal_emu::ThreadIds& id) {
        shared.poison(id);
        const uint3 block = id.threadgroup_position_in_grid;
        attn_decode::run_slot<T>(q.data(), gate.data(), slots.data(), partials.data(), out.data(), p, block.x,
                                 block.y, block.z, id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup,
                                 smem);
      });
  if (p.splits > 1) {
    metal_emu::dispatch_threadgroups(uint3{p.q_heads, p.batch, 1}, uint3{32, p.head_dim / 32, 1},
                                     [&](const metal_emu::ThreadIds& id) {
                                       const uint3 block = id.threadgroup_position_in_grid;
                                       attn_decode::combine_slot<T>(partials.data(), gate.data(), slots.data(),
                                                                    out.data(), p, block.x, block.y,
                                                                    id.thread_index_in_threadgroup);
                                     });
  }
  shared.check();
  guarded::check_all(q, gate, partials);
  for (const auto& b : kv) b->check();
  for (const auto& b : pos) b->check();
  out.check();
  out.write_f32();
}

}  // namespace

int main() {
  const Case c = read_case();
  guarded::by_code<float, __half, __nv_bfloat16>(c.type, "unknown type",
                                                 [&](auto t) { run<typename decltype(t)::type>(c); });
  return guarded::finish();
}
