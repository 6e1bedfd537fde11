// What the three gated-delta harnesses read (gated_delta_harness.cpp for the Metal step kernel,
// gated_delta_chunk_harness.cpp and gated_delta_chunk_cuda_harness.cpp for the chunk kernels),
// as crates/gdn-ops/tests/gated_delta_emu/mod.rs writes it: one reader, so that one test driver
// serves all three; and the guarded q, k, v, g and beta buffers, which gated_delta_norm_harness.cpp
// takes too.
//
// stdin, little-endian: an 8-byte magic, then u32 batch, steps, key_heads, value_heads,
// key_dim, value_dim, has_mask, in_type (0 f32, 1 f16, 2 bf16), state_type (0 f32, 1 bf16),
// then f32 arrays q, k [B,T,Hk,Dk], v [B,T,Hv,Dv], g, beta [B,T,Hv], state [B,Hv,Dv,Dk] and,
// when has_mask, mask [B,T].
#pragma once

#include "guarded_buffer.h"

#include <cstdint>
#include <vector>

namespace gdn_case {

struct Header {
  std::uint32_t batch, steps, key_heads, value_heads, key_dim, value_dim, has_mask, in_type, state_type;
};

// The f32 arrays, in the order they come.
struct Inputs {
  std::vector<float> q, k, v, g, beta, state, mask;
};

// The magic and the header words; a harness checks its own limits before it reads the arrays.
inline Header read_header(const char (&magic)[9]) {
  std::uint32_t h[9];
  guarded::read_header(magic, h);
  return Header{h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]};
}

// The arrays of a case of header `h`, then the end of the input.
inline void read_inputs(const Header& h, Inputs& in) {
  const std::size_t bt = std::size_t(h.batch) * h.steps;
  in.q = guarded::read_raw<float>(bt * h.key_heads * h.key_dim);
  in.k = guarded::read_raw<float>(bt * h.key_heads * h.key_dim);
  in.v = guarded::read_raw<float>(bt * h.value_heads * h.value_dim);
  in.g = guarded::read_raw<float>(bt * h.value_heads);
  in.beta = guarded::read_raw<float>(bt * h.value_heads);
  in.state = guarded::read_raw<float>(std::size_t(h.batch) * h.value_heads * h.value_dim * h.key_dim);
  in.mask = guarded::read_raw<float>(h.has_mask != 0 ? bt : 0);
  guarded::expect_end();
}

// The guarded inputs every gated-delta kernel reads: q, k, v in InT, g and beta in f32.
template <class InT>
struct StepBuffers {
  guarded::Buffer<InT> q, k, v;
  guarded::Buffer<float> g, beta;
};

// Those of a case's arrays (`in` holds q, k, v, g and beta as Inputs does).
template <class InT, class In>
StepBuffers<InT> step_buffers(const In& in) {
  using guarded::Kind;
  return {{"q", in.q, Kind::kInput},
          {"k", in.k, Kind::kInput},
          {"v", in.v, Kind::kInput},
          {"g", in.g, Kind::kInput},
          {"beta", in.beta, Kind::kInput}};
}

}  // namespace gdn_case
