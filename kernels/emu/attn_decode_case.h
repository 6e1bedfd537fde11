// What the two attention decode harnesses share (attn_decode_harness.cpp for the Metal kernels,
// attn_decode_cuda_harness.cpp for the CUDA bodies), so that one test drives both on the same
// cases: the case read from stdin, its guarded buffers, and the checks and output after a run.
// Include it after the kernel source (it needs AttnDecodeParams).
//
// stdin, little-endian: "ADECEMU1", u32 type (0 f32, 1 f16, 2 bf16), batch B, q_heads Nq,
// kv_heads Nkv, head_dim Dh, capacity cap, pos, simdgroups S, splits P, f32 scale; then f32 q
// [B, Nq, Dh], gate [B, Nq*Dh], keys and values [B, Nkv, cap, Dh].
// stdout: f32 out [B, Nq*Dh].
#pragma once

#include "guarded_buffer.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace attn_decode_case {

struct Case {
  std::uint32_t type;
  AttnDecodeParams p;
  std::uint32_t pos;
  std::vector<float> q, gate, keys, values;
};

// The case on stdin; a malformed one ends the harness with "bad header" / "short input".
inline Case read() {
  guarded::expect_magic("ADECEMU1");
  const auto h = guarded::read_raw<std::uint32_t>(10);
  Case c;
  c.type = h[0];
  float scale;
  std::memcpy(&scale, &h[9], 4);
  c.p = AttnDecodeParams{h[1], h[2], h[3], h[4], h[5], h[7], h[8], scale};
  c.pos = h[6];
  const AttnDecodeParams& p = c.p;
  if (c.type > 2 || p.batch == 0 || p.kv_heads == 0 || p.q_heads % p.kv_heads != 0 || p.head_dim % 32 != 0 ||
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
  return c;
}

// The case's inputs in T (read-only), the poisoned output, and with P > 1 the poisoned
// partials [B, Nq, P, 2 + Dh] that the split pass must write in full (a record it skips
// poisons the result).
template <class T>
struct Buffers {
  guarded::Buffer<T> q, gate, keys, values;
  guarded::Buffer<std::uint32_t> pos;
  guarded::Buffer<T> out;
  guarded::Buffer<float> partials;

  explicit Buffers(const Case& c)
      : q("q", c.q, guarded::Kind::kInput),
        gate("gate", c.gate, guarded::Kind::kInput),
        keys("keys", c.keys, guarded::Kind::kInput),
        values("values", c.values, guarded::Kind::kInput),
        pos("pos", std::vector<std::uint32_t>{c.pos}, guarded::Kind::kInput),
        out("out", c.q.size(), guarded::Kind::kOutput),
        partials("partials",
                 c.p.splits == 1 ? 0 : std::size_t(c.p.batch) * c.p.q_heads * c.p.splits * (2 + c.p.head_dim),
                 guarded::Kind::kOutput) {}

  // Every guard intact and every output written; then out on stdout.
  void check_and_write() const {
    guarded::check_all(q, gate, keys, values, pos, partials, out);
    out.write_f32();
  }
};

}  // namespace attn_decode_case
