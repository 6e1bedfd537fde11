// Runs the body of the shipped kernels/affine_grouped.cu (affine_grouped::grouped_kernel) on
// the CPU through kernels/emu/cuda/cuda_emu.h, with the launch geometry of
// crates/gdn-ops/src/ops/affine_grouped/cuda.rs: blocks (tiles, ceil(rows / kTileN)) of
// kThreads threads, kSmemBytes of (dynamic) shared memory (NaN before each block, so that a read of
// what no thread wrote poisons the result). Used by
// crates/gdn-ops/tests/affine_grouped_cuda_emulation.rs, which passes the host's own tile
// schedule.
//
// stdin, little-endian: "AGQCUDA1", then u32 experts, rows, cols, bits, group_size, pairs,
// tiles, tile_pairs, slice_steps (0: one launch writing y; > 0: split-K, the split entry's
// body over grid z = slices into an f32 workspace, then the shipped fixed-order sum,
// affine_grouped::split_sum_kernel, into y), x_type, scale_type (0 f32, 1 f16, 2 bf16), then u32 packed [E * rows, cols * bits / 32],
// f32 scales and biases [E * rows, cols / group_size] (exact in the scale type), f32 x
// [pairs, cols] (exact in the x type), u32 schedule [tiles, 3].
// stdout: f32 y [pairs, rows]. Every element must be written (the schedule covers every pair).
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        -I kernels kernels/emu/affine_grouped_cuda_harness.cpp

#include "guarded_buffer.h"
#include "affine_case.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

// The entry points' extern __shared__ array (never used here: the harness passes its own).
extern "C" {
alignas(128) unsigned char affine_grouped_smem[1];
}

#include "../affine_grouped.cu"

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  AffineGroupedParams p;
  std::vector<std::uint32_t> packed, tiles;
  std::vector<float> scales, biases, x;
};

template <class X, class S>
void run(const Case& c) {
  const AffineGroupedParams& p = c.p;
  Buffer<uint> packed("packed", c.packed, Kind::kInput);
  Buffer<S> scales("scales", c.scales, Kind::kInput);
  Buffer<S> biases("biases", c.biases, Kind::kInput);
  Buffer<X> x("x", c.x, Kind::kInput);
  Buffer<uint> tiles("tiles", c.tiles, Kind::kInput);
  const std::size_t n = std::size_t(p.pairs) * p.rows;
  Buffer<X> y("y", n, Kind::kOutput);
  const std::size_t floats = affine_grouped::kSmemBytes / 4;
  BlockShared shared(floats);
  const std::uint32_t row_blocks = (p.rows + affine_grouped::kTileN - 1) / affine_grouped::kTileN;
  const auto ids = [](const metal_emu::ThreadIds& id) {
    return std::make_pair(int(id.thread_index_in_threadgroup), id.threadgroup_position_in_grid);
  };
  if (p.slice_steps == 0) {
    metal_emu::dispatch_threadgroups(uint3{p.tiles, row_blocks, 1}, uint3{affine_grouped::kThreads, 1, 1},
                                     [&](const metal_emu::ThreadIds& id) {
      shared.poison(id);
      const auto [tid, g] = ids(id);
      affine_grouped::grouped_kernel<X, S>(packed.data(), scales.data(), biases.data(), x.data(), tiles.data(),
                                           y.data(), p, tid, g.x, g.y, reinterpret_cast<unsigned char*>(shared.smem));
    });
    guarded::check_all(packed, scales, biases, x, tiles, shared, y);
  } else {
    // The host's slice count: every slice holds at least one step.
    const std::uint32_t steps = (p.cols + affine_grouped::kTileK - 1) / affine_grouped::kTileK;
    const std::uint32_t slices = (steps + p.slice_steps - 1) / p.slice_steps;
    Buffer<float> partial("partial", std::size_t(slices) * n, Kind::kOutput);
    metal_emu::dispatch_threadgroups(uint3{p.tiles, row_blocks, slices}, uint3{affine_grouped::kThreads, 1, 1},
                                     [&](const metal_emu::ThreadIds& id) {
      shared.poison(id);
      const auto [tid, g] = ids(id);
      affine_grouped::grouped_kernel<X, S, float>(packed.data(), scales.data(), biases.data(), x.data(), tiles.data(),
                                                  partial.data(), p, tid, g.x, g.y,
                                                  reinterpret_cast<unsigned char*>(shared.smem), g.z);
    });
    const std::uint32_t sum_blocks = std::uint32_t((n + affine_grouped::kSumThreads - 1) / affine_grouped::kSumThreads);
    metal_emu::dispatch_threadgroups(uint3{sum_blocks, 1, 1}, uint3{affine_grouped::kSumThreads, 1, 1},
                                     [&](const metal_emu::ThreadIds& id) {
      affine_grouped::split_sum_kernel<X>(partial.data(), y.data(), std::uint32_t(n), slices,
                                          std::uint64_t(id.threadgroup_position_in_grid.x) * affine_grouped::kSumThreads +
                                              id.thread_index_in_threadgroup);
    });
    guarded::check_all(packed, scales, biases, x, tiles, shared, partial, y);
  }
  y.write_f32();
}

}  // namespace

int main() {
  const auto h = guarded::start<11>("affine_grouped_cuda_harness", "AGQCUDA1");
  Case c;
  c.p = AffineGroupedParams{h[1], h[2], h[3], h[4], h[0], h[5], h[6], h[7], h[8]};
  const std::uint32_t x_type = h[9], scale_type = h[10];
  const AffineGroupedParams& p = c.p;
  // The host side's contract (ops/affine_grouped/cuda.rs checks it).
  if (p.bits != 2 && p.bits != 4 && p.bits != 8) guarded::die("bits must be 2, 4 or 8");
  if (p.cols == 0 || p.cols % 32 != 0) guarded::die("cols must be a positive multiple of 32");
  if (p.group_size == 0 || p.group_size % 32 != 0 || p.cols % p.group_size != 0)
    guarded::die("group_size must be a multiple of 32 dividing cols");
  if (p.experts == 0 || p.rows == 0) guarded::die("experts and rows must be positive");
  if (p.tile_pairs != 16 && p.tile_pairs != 32 && p.tile_pairs != 64) guarded::die("tile_pairs must be 16, 32 or 64");
  const std::size_t stacked = std::size_t(p.experts) * p.rows;
  affine_case::read_weights(stacked, p.cols, p.bits, p.group_size, c.packed, c.scales, c.biases);
  c.x = guarded::read_raw<float>(std::size_t(p.pairs) * p.cols);
  c.tiles = guarded::read_raw<std::uint32_t>(std::size_t(p.tiles) * affine_grouped::kTileEntry);
  guarded::expect_end();

  using guarded::by_code;
  by_code<float, __half, __nv_bfloat16>(x_type, "unknown x_type", [&](auto x) {
    by_code<float, __half, __nv_bfloat16>(scale_type, "unknown scale_type", [&](auto s) {
      run<typename decltype(x)::type, typename decltype(s)::type>(c);
    });
  });
  return guarded::finish();
}
