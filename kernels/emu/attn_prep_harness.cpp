// Runs the shipped kernels/attn_prep.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/attn_prep_emulation.rs.
//
// stdin, little-endian: "APREPEM1", u32 type (0 f32, 1 f16, 2 bf16), batch B, q_heads Nq,
// kv_heads Nkv, head_dim Dh, rope_dims R, capacity cap, pos, f32 eps; then f32 qkv
// [B, 2*Nq*Dh + 2*Nkv*Dh], q_norm [Dh], k_norm [Dh], inv_freq [R/2] (kept f32), and the KV
// buffers' contents before the call, keys and values [B, Nkv, cap, Dh].
// stdout: f32 q [B, Nq, Dh], gate [B, Nq*Dh], then the whole keys and values buffers.
//
// The launch geometry is crates/gdn-ops/src/ops/attn_prep/metal.rs's: threadgroups
// (Nq + 2*Nkv, B, 1) of (32, 1, 1) threads. Buffers are guarded (guarded_buffer.h); the KV
// buffers are in place (filled, writable, guards checked).
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/attn_prep_harness.cpp -o attn_prep_harness

#include "guarded_buffer.h"
#include "metal_math.h"

#include "../attn_prep.metal"

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  AttnPrepParams p;
  uint pos;
  std::vector<float> qkv, q_norm, k_norm, inv_freq, keys, values;
};

template <class T>
using Kernel = void (*)(const device T*, const device T*, const device T*, const device float*,
                        const device uint*, device T*, device T*, device T*, device T*,
                        constant AttnPrepParams&, uint3, uint);

template <class T>
void run(const Case& c, Kernel<T> kernel) {
  const AttnPrepParams& p = c.p;
  const std::size_t q_len = std::size_t(p.batch) * p.q_heads * p.head_dim;
  Buffer<T> qkv("qkv", c.qkv.size(), Kind::kInput);
  Buffer<T> q_norm("q_norm", p.head_dim, Kind::kInput);
  Buffer<T> k_norm("k_norm", p.head_dim, Kind::kInput);
  Buffer<float> inv_freq("inv_freq", p.rope_dims / 2, Kind::kInput);
  Buffer<uint> pos("pos", 1, Kind::kInput);
  Buffer<T> keys("keys", c.keys.size(), Kind::kInPlace);
  Buffer<T> values("values", c.values.size(), Kind::kInPlace);
  Buffer<T> q("q", q_len, Kind::kOutput);
  Buffer<T> gate("gate", q_len, Kind::kOutput);
  qkv.fill(c.qkv);
  q_norm.fill(c.q_norm);
  k_norm.fill(c.k_norm);
  inv_freq.fill(c.inv_freq);
  pos.fill(std::vector<uint>{c.pos});
  keys.fill(c.keys);
  values.fill(c.values);
  const uint3 groups{p.q_heads + 2 * p.kv_heads, p.batch, 1};
  metal_emu::dispatch_threadgroups(groups, uint3{32, 1, 1}, [&](const metal_emu::ThreadIds& id) {
    kernel((const device T*)qkv.data(), (const device T*)q_norm.data(), (const device T*)k_norm.data(),
           (const device float*)inv_freq.data(), (const device uint*)pos.data(), (device T*)keys.data(),
           (device T*)values.data(), (device T*)q.data(), (device T*)gate.data(),
           *(constant AttnPrepParams*)&p, id.threadgroup_position_in_grid, id.thread_index_in_simdgroup);
  });
  guarded::check_all(qkv, q_norm, k_norm, inv_freq, pos, keys, values, q, gate);
  q.write_f32();
  gate.write_f32();
  keys.write_f32();
  values.write_f32();
}

}  // namespace

int main() {
  const auto h = guarded::start<9>("attn_prep_harness", "APREPEM1");
  Case c;
  const std::uint32_t type = h[0];
  float eps;
  std::memcpy(&eps, &h[8], 4);
  c.p = AttnPrepParams{h[1], h[2], h[3], h[4], h[5], h[6], eps};
  c.pos = h[7];
  const AttnPrepParams& p = c.p;
  if (type > 2 || p.batch == 0 || p.kv_heads == 0 || p.q_heads % p.kv_heads != 0 || p.head_dim == 0 ||
      p.rope_dims % 2 != 0 || p.rope_dims > p.head_dim) {
    guarded::die("bad header");
  }
  const std::size_t width = std::size_t(2 * p.q_heads + 2 * p.kv_heads) * p.head_dim;
  const std::size_t kv = std::size_t(p.batch) * p.kv_heads * p.capacity * p.head_dim;
  c.qkv = guarded::read_raw<float>(p.batch * width);
  c.q_norm = guarded::read_raw<float>(p.head_dim);
  c.k_norm = guarded::read_raw<float>(p.head_dim);
  c.inv_freq = guarded::read_raw<float>(p.rope_dims / 2);
  c.keys = guarded::read_raw<float>(kv);
  c.values = guarded::read_raw<float>(kv);
  guarded::expect_end();
  guarded::by_type(type, attn_prep_f32, attn_prep_f16, attn_prep_bf16,
                   [&](auto t, auto kernel) { run<typename decltype(t)::type>(c, kernel); });
  return guarded::finish();
}
