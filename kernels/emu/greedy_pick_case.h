// What the two greedy pick harnesses share (greedy_pick_harness.cpp for the Metal kernels,
// greedy_pick_cuda_harness.cpp for the CUDA bodies), so that one test drives both on the same
// cases: the case read from stdin and checked against the host's contract. Include it after the
// kernel source (it needs GreedyPickParams).
//
// stdin, little-endian: "GPICKEM1", then u32 in_type (0 f32, 1 f16, 2 bf16), rows N, vocab V,
// blocks B, slice; then f32 logits [N, V], converted to InT by the harness (exactly, when the
// caller already rounded them; NaN and Inf stay what they are).
#pragma once

#include "guarded_buffer.h"

#include <cstdint>
#include <vector>

namespace greedy_pick_case {

struct Case {
  std::uint32_t in_type;
  GreedyPickParams p;
  std::vector<float> values;
};

inline Case read() {
  std::uint32_t h[5];
  guarded::read_header("GPICKEM1", h);
  Case c{h[0], GreedyPickParams{h[1], h[2], h[3], h[4]}, {}};
  const GreedyPickParams& p = c.p;
  // The host's contract (ops/greedy_pick/mod.rs `GreedyPickParams::new`).
  if (p.vocab == 0 || p.vocab == 0xFFFFFFFFu) guarded::die("vocab must be 1..2^32-1");
  if (p.blocks == 0 || p.blocks > 256) guarded::die("blocks must be 1..=256");
  if (std::uint64_t(p.blocks) * p.slice < p.vocab) guarded::die("the slices must cover the row");
  c.values = guarded::read_raw<float>(std::size_t(p.rows) * p.vocab);
  guarded::expect_end();
  return c;
}

}  // namespace greedy_pick_case
