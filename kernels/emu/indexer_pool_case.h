// What the two indexer pooling harnesses share (indexer_pool_harness.cpp for the Metal kernel,
// indexer_pool_cuda_harness.cpp for the CUDA body), so that one test drives both on the same
// cases: the case read from stdin and checked against the host's contract. Include it after the
// kernel source (it needs IndexerPoolParams).
//
// stdin, little-endian: "IPOOLEM1", then u32 in_type (0 f32, 1 f16, 2 bf16), key_offset, dim,
// rows, capacity, rope_half, tail_row, block_row, qk_len; f32 eps; then f32 qk [qk_len] (converted
// to the in_type by the harness: exactly, when the caller already rounded them), tail
// [rows, dim], blocks [capacity, dim], cos [rope_half], sin [rope_half], norm [dim].
// stdout: tail, then blocks, after the kernel (f32).
#pragma once

#include "guarded_buffer.h"

#include <cstdint>
#include <vector>

namespace indexer_pool_case {

struct Case {
  std::uint32_t in_type;
  IndexerPoolParams p;
  std::uint32_t tail_row, block_row;
  std::vector<float> qk, tail, blocks, cos, sin, norm;
};

inline Case read() {
  std::uint32_t h[9];
  guarded::read_header("IPOOLEM1", h);
  Case c;
  c.in_type = h[0];
  c.p = IndexerPoolParams{h[1], h[2], h[3], h[4], h[5], guarded::read_f32_word()};
  c.tail_row = h[6];
  c.block_row = h[7];
  const IndexerPoolParams& p = c.p;
  // The host's contract (ops/indexer_pool/mod.rs `PoolCall::checked`); the rows may lie past
  // their buffers (the kernel then writes nothing).
  if (p.dim == 0 || p.dim > INDEXER_POOL_MAX_DIM) guarded::die("dim must be 1..=INDEXER_POOL_MAX_DIM");
  if (p.rows == 0) guarded::die("the tail needs a row");
  if (2 * p.rope_half > p.dim) guarded::die("the rotation must fit the key");
  if (std::uint64_t(p.key_offset) + p.dim > h[8]) guarded::die("the key must fit the projection row");
  c.qk = guarded::read_raw<float>(h[8]);
  c.tail = guarded::read_raw<float>(std::size_t(p.rows) * p.dim);
  c.blocks = guarded::read_raw<float>(std::size_t(p.capacity) * p.dim);
  c.cos = guarded::read_raw<float>(p.rope_half);
  c.sin = guarded::read_raw<float>(p.rope_half);
  c.norm = guarded::read_raw<float>(p.dim);
  guarded::expect_end();
  return c;
}

}  // namespace indexer_pool_case
