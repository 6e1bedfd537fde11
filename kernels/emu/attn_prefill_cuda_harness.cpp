// Runs the body of the shipped kernels/attn_prefill.cu (attn_prefill::run) on the CPU through
// kernels/emu/cuda/cuda_emu.h, with the launch geometry of
// crates/gdn-ops/src/ops/attn_prefill/cuda.rs: blocks (ceil(S / 64), Nq, B) of 128 threads and
// smem_bytes(Dh) of shared memory (NaN before each block, so that a read of what no thread
// wrote poisons the result). k and v are read as the KV cache's views: [B, Nkv, cap, Dh]
// buffers of which positions 0..T are attended (the test fills the rest with NaN, so that a
// kernel reading past T fails). Used by crates/gdn-ops/tests/attn_prefill_cuda_emulation.rs.
//
// stdin, little-endian: "APFCUDA1", then u32 type (1 f16, 2 bf16), batch, q_heads, kv_heads,
// head_dim, queries (S), keys (T), offset, capacity (cap >= T), then f32 arrays q [B, Nq, S, Dh],
// k and v [B, Nkv, cap, Dh].
// stdout: f32 out [B, Nq, S, Dh].
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        -I kernels kernels/emu/attn_prefill_cuda_harness.cpp

#include "guarded_buffer.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

// The entry points' extern __shared__ array (never used here: the harness passes its own).
extern "C" {
alignas(128) float attn_prefill_smem[1];
}

// The shipped kernel; the emulation test's mutants (a deliberately broken copy, which the test
// must see fail) name theirs with -DATTN_PREFILL_SOURCE='"path"'.
#ifndef ATTN_PREFILL_SOURCE
#define ATTN_PREFILL_SOURCE "../attn_prefill.cu"
#endif
#include ATTN_PREFILL_SOURCE

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  AttnPrefillParams p;
  unsigned capacity;
  std::vector<float> q, k, v;
};

template <class T>
void run(const Case& c) {
  const AttnPrefillParams& p = c.p;
  Buffer<T> q("q", c.q, Kind::kInput);
  Buffer<T> k("k", c.k, Kind::kInput);
  Buffer<T> v("v", c.v, Kind::kInput);
  Buffer<T> out("out", std::size_t(p.batch) * p.q_heads * p.queries * p.head_dim, Kind::kOutput);
  BlockShared shared(attn_prefill::smem_bytes(p.head_dim) / 4);
  metal_emu::dispatch_threadgroups(uint3{p.q_tiles, p.q_heads, p.batch}, uint3{attn_prefill::kThreads, 1, 1},
                                   [&](const metal_emu::ThreadIds& id) {
                                     shared.poison(id);
                                     const uint3 block = id.threadgroup_position_in_grid;
                                     attn_prefill::run<T>(q.data(), k.data(), v.data(), out.data(), p, block.x,
                                                          block.y, block.z, id.thread_index_in_threadgroup,
                                                          shared.smem);
                                   });
  guarded::check_all(shared, q, k, v, out);
  out.write_f32();
}

}  // namespace

int main() {
  const auto h = guarded::start<9>("attn_prefill_cuda_harness", "APFCUDA1");
  Case c;
  const std::uint32_t type = h[0];
  const unsigned batch = h[1], q_heads = h[2], kv_heads = h[3], dh = h[4], queries = h[5], keys = h[6],
                 offset = h[7], cap = h[8];
  // The host side's contract (ops/attn_prefill/{mod,cuda}.rs check it).
  if (dh == 0 || dh % 16 != 0 || dh > attn_prefill::kMaxDh) guarded::die("head_dim must be a multiple of 16, at most 256");
  if (kv_heads == 0 || q_heads % kv_heads != 0) guarded::die("q_heads must be a multiple of kv_heads");
  if (batch == 0 || queries == 0 || keys == 0 || keys > cap) guarded::die("need 1 <= S and 1 <= T <= cap");
  c.capacity = cap;
  const unsigned q_tiles = (queries + attn_prefill::kRows - 1) / attn_prefill::kRows;
  const float scale_f32 = 1.f / std::sqrt(float(dh));
  const float scale = type == 1 ? float(__half(scale_f32)) : float(__nv_bfloat16(scale_f32));
  const unsigned head_stride = cap * dh, batch_stride = kv_heads * cap * dh;
  c.p = AttnPrefillParams{batch,        q_heads,      kv_heads, dh,           queries,     keys, offset, q_tiles,
                          batch_stride, head_stride,  dh,       batch_stride, head_stride, dh,   scale};
  c.q = guarded::read_raw<float>(std::size_t(batch) * q_heads * queries * dh);
  c.k = guarded::read_raw<float>(std::size_t(batch) * kv_heads * cap * dh);
  c.v = guarded::read_raw<float>(std::size_t(batch) * kv_heads * cap * dh);
  guarded::expect_end();
  switch (type) {
    case 1: run<__half>(c); break;
    case 2: run<__nv_bfloat16>(c); break;
    default: guarded::die("type: 1 (f16) or 2 (bf16)");
  }
  return guarded::finish();
}
