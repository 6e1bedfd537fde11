// Runs the body of the shipped wide decode products of kernels/affine.cu
// (affine_wide::wide_body, the `affine_wide_{products,swiglu}_b<bits>_r<rows>_*` entry points),
// or of the streamed ones of kernels/affine_stream.cu (affine_stream::stream_body, the
// `affine_stream_{products,swiglu}_b<bits>_r<rows>_s<steps>_*` entry points, with their dynamic
// shared memory, and affine_stream::rows_body, `affine_stream_rows_b<bits>_t<T>_s<steps>_*`),
// or of the block-split ones of kernels/affine.cu (affine_split::split_body, the
// `affine_split_products_b<bits>_r<rows>_*` entry points: blocks of 8 warps, a block's rows'
// partials in shared memory), on the CPU through kernels/emu/cuda/cuda_emu.h, with the launch
// geometry of crates/gdn-ops/src/ops/affine/{wide,stream,split}.rs: blocks (blocks_x, out_rows)
// of 4 warps (8 for the split body). Used by crates/gdn-ops/tests/affine_wide_cuda_emulation.rs,
// which compares the wide and split bodies with the CPU twin and the streamed bodies with the
// wide one and with each other.
//
// stdin, little-endian: "AWDCUDA2", then u32 experts, rows, cols, bits, group_size, out_rows,
// x_div, has_ids, swiglu, rows_per_group, lanes_per_row, blocks_x, body (0 wide, 1 streamed,
// 2 split: its rows_per_group is rows a block, its lanes_per_row unused, 3 streamed over
// T = out_rows activation rows a pass: affine_stream::rows_body, dense products only), steps
// (the streamed bodies' chunk steps a lane: 1, 2 or 4), x_type, scale_type
// (0 f32, 1 f16, 2 bf16), then u32 packed [E * rows, cols * bits / 32], f32 scales and biases
// [E * rows, cols / group_size] (exact in the scale type), f32 x [(out_rows - 1) / x_div + 1,
// cols] (exact in the x type), u32 ids [out_rows] (present when has_ids).
// stdout: f32 y [out_rows, outputs], outputs = rows (products) or rows / 2 (swiglu). Every
// element must be written.
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        -I kernels kernels/emu/affine_wide_cuda_harness.cpp

#include "guarded_buffer.h"
#include "affine_case.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

#include "../affine.cu"
#include "../affine_stream.cu"

// The streamed entry points' extern __shared__ array, defined so that they link (never
// called here: the harness passes its own).
float4 stream_shared[1];

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  AffineParams p;
  std::uint32_t experts, swiglu, rows_per_group, lpr, blocks_x, body, steps;
  std::vector<std::uint32_t> packed, ids;
  std::vector<float> scales, biases, x;
};

static_assert(affine_wide::kWideWarps == affine_stream::kStreamWarps, "one block shape for both");

// The split body: rows_per_group rows a block of kSplitWarps warps.
template <uint32_t BITS, uint32_t ROWS, class X, class S>
void run_split(const Case& c) {
  const AffineParams& p = c.p;
  Buffer<uint> packed("packed", c.packed, Kind::kInput);
  Buffer<S> scales("scales", c.scales, Kind::kInput);
  Buffer<S> biases("biases", c.biases, Kind::kInput);
  Buffer<X> x("x", c.x, Kind::kInput);
  Buffer<uint> ids("ids", c.p.has_ids ? c.ids : std::vector<std::uint32_t>{0}, Kind::kInput);
  Buffer<X> y("y", std::size_t(p.out_rows) * p.rows, Kind::kOutput);
  BlockShared shared(affine_split::kSplitWarps * ROWS);  // the warps' partials
  metal_emu::dispatch_threadgroups(uint3{c.blocks_x, p.out_rows, 1}, uint3{affine_split::kSplitWarps * 32, 1, 1},
                                   [&](const metal_emu::ThreadIds& id) {
                                     shared.poison(id);
                                     affine_split::split_body<BITS, ROWS, X, S>(
                                         packed.data(), scales.data(), biases.data(), x.data(), ids.data(), y.data(),
                                         p, c.experts, id.thread_index_in_threadgroup,
                                         id.threadgroup_position_in_grid.x, id.threadgroup_position_in_grid.y,
                                         shared.smem);
                                   });
  shared.check();
  guarded::check_all(packed, scales, biases, x, ids, y);
  y.write_f32();
}

// STEPS 0: the wide body; 1, 2 or 4: the streamed body, a lane's chunk steps of a row.
template <uint32_t BITS, uint32_t ROWS, bool SWIGLU, uint32_t STEPS, class X, class S>
void run(const Case& c) {
  const AffineParams& p = c.p;
  const std::uint32_t outputs = SWIGLU ? p.rows / 2 : p.rows;
  Buffer<uint> packed("packed", c.packed, Kind::kInput);
  Buffer<S> scales("scales", c.scales, Kind::kInput);
  Buffer<S> biases("biases", c.biases, Kind::kInput);
  Buffer<X> x("x", c.x, Kind::kInput);
  // Without ids the kernel must not read them: a one-element buffer whose read would fault
  // only past its guard, so bind it and check nothing else.
  Buffer<uint> ids("ids", c.p.has_ids ? c.ids : std::vector<std::uint32_t>{0}, Kind::kInput);
  Buffer<X> y("y", std::size_t(p.out_rows) * outputs, Kind::kOutput);
  const uint3 groups{c.blocks_x, p.out_rows, 1};
  BlockShared shared((p.cols + p.cols / (128 / BITS)));  // the streamed body's x
  metal_emu::dispatch_threadgroups(groups, uint3{affine_wide::kWideWarps * 32, 1, 1}, [&](const metal_emu::ThreadIds& id) {
    if constexpr (STEPS == 0) {
      affine_wide::wide_body<BITS, ROWS, SWIGLU, X, S>(
          packed.data(), scales.data(), biases.data(), x.data(), ids.data(), y.data(), p, c.experts, c.lpr,
          id.thread_index_in_simdgroup, id.simdgroup_index_in_threadgroup, id.threadgroup_position_in_grid.x,
          id.threadgroup_position_in_grid.y);
    } else {
      shared.poison(id);
      affine_stream::stream_body<BITS, ROWS, SWIGLU, STEPS, X, S>(
          packed.data(), scales.data(), biases.data(), x.data(), ids.data(), y.data(), p, c.experts, c.lpr,
          id.thread_index_in_threadgroup, id.threadgroup_position_in_grid.x, c.blocks_x,
          id.threadgroup_position_in_grid.y, shared.smem);
    }
  });
  shared.check();
  guarded::check_all(packed, scales, biases, x, ids, y);
  y.write_f32();
}

// The streamed products of out_rows activation rows a pass (affine_stream::rows_body), held
// for T.
template <uint32_t BITS, uint32_t T, uint32_t STEPS, class X, class S>
void run_rows(const Case& c) {
  const AffineParams& p = c.p;
  Buffer<uint> packed("packed", c.packed, Kind::kInput);
  Buffer<S> scales("scales", c.scales, Kind::kInput);
  Buffer<S> biases("biases", c.biases, Kind::kInput);
  Buffer<X> x("x", c.x, Kind::kInput);
  Buffer<X> y("y", std::size_t(p.out_rows) * p.rows, Kind::kOutput);
  BlockShared shared(p.out_rows * (p.cols + p.cols / (128 / BITS)));
  metal_emu::dispatch_threadgroups(uint3{c.blocks_x, 1, 1}, uint3{affine_stream::kStreamWarps * 32, 1, 1},
                                   [&](const metal_emu::ThreadIds& id) {
                                     shared.poison(id);
                                     affine_stream::rows_body<BITS, T, STEPS, X, S>(
                                         packed.data(), scales.data(), biases.data(), x.data(), y.data(), p,
                                         c.lpr, id.thread_index_in_threadgroup,
                                         id.threadgroup_position_in_grid.x, c.blocks_x, shared.smem);
                                   });
  shared.check();
  guarded::check_all(packed, scales, biases, x, y);
  y.write_f32();
}

template <uint32_t BITS, uint32_t T, class X, class S>
void run_rows_for_steps(const Case& c) {
  switch (c.steps) {
    case 1: run_rows<BITS, T, 1, X, S>(c); break;
    case 2: run_rows<BITS, T, 2, X, S>(c); break;
    case 4: run_rows<BITS, T, 4, X, S>(c); break;
    default: guarded::die("steps must be 1, 2 or 4");
  }
}

// The instantiated capacity that holds the rows, as the host picks it (stream::pass_capacity).
template <uint32_t BITS, class X, class S>
void run_rows_for_count(const Case& c) {
  const uint32_t m = c.p.out_rows;
  if (m < 2 || m > 8) guarded::die("the rows kernel takes 2 to 8 activation rows");
  if (m <= 2) return run_rows_for_steps<BITS, 2, X, S>(c);
  if (m <= 4) return run_rows_for_steps<BITS, 4, X, S>(c);
  run_rows_for_steps<BITS, 8, X, S>(c);
}

template <uint32_t BITS, uint32_t ROWS, bool SWIGLU, class X, class S>
void run_for_steps(const Case& c) {
  if (!c.body) return run<BITS, ROWS, SWIGLU, 0, X, S>(c);
  switch (c.steps) {
    case 1: run<BITS, ROWS, SWIGLU, 1, X, S>(c); break;
    case 2: run<BITS, ROWS, SWIGLU, 2, X, S>(c); break;
    case 4: run<BITS, ROWS, SWIGLU, 4, X, S>(c); break;
    default: guarded::die("steps must be 1, 2 or 4");
  }
}

template <class X, class S>
void run_for_shape(const Case& c) {
  if (c.body == 3) return c.p.bits == 4 ? run_rows_for_count<4, X, S>(c) : run_rows_for_count<8, X, S>(c);
  const bool sw = c.swiglu != 0;
  if (c.body == 2) {
    const unsigned split_key = c.p.bits * 10 + c.rows_per_group;
    switch (sw ? 0 : split_key) {
      case 41: run_split<4, 1, X, S>(c); break;
      case 42: run_split<4, 2, X, S>(c); break;
      case 81: run_split<8, 1, X, S>(c); break;
      case 82: run_split<8, 2, X, S>(c); break;
      default: guarded::die("no split entry point for these bits / rows per block / kind");
    }
    return;
  }
  const unsigned key = c.p.bits * 100 + c.rows_per_group * 10 + (sw ? 1 : 0);
  switch (key) {
    case 410: run_for_steps<4, 1, false, X, S>(c); break;
    case 420: run_for_steps<4, 2, false, X, S>(c); break;
    case 440: run<4, 4, false, 0, X, S>(c); break;
    case 810: run_for_steps<8, 1, false, X, S>(c); break;
    case 820: run_for_steps<8, 2, false, X, S>(c); break;
    case 840: run<8, 4, false, 0, X, S>(c); break;
    case 411: run_for_steps<4, 1, true, X, S>(c); break;
    case 421: run<4, 2, true, 0, X, S>(c); break;
    case 811: run_for_steps<8, 1, true, X, S>(c); break;
    case 821: run<8, 2, true, 0, X, S>(c); break;
    default: guarded::die("no entry point for these bits / rows per group / kind");
  }
}

}  // namespace

int main() {
  const auto h = guarded::start<16>("affine_wide_cuda_harness", "AWDCUDA2");
  Case c;
  c.experts = h[0];
  c.p = AffineParams{h[1], h[2], h[3], h[4], h[5], h[6], h[7]};
  c.swiglu = h[8], c.rows_per_group = h[9], c.lpr = h[10], c.blocks_x = h[11];
  c.body = h[12], c.steps = h[13];
  const std::uint32_t x_type = h[14], scale_type = h[15];
  const AffineParams& p = c.p;
  // The host side's contract (ops/affine/wide.rs checks it).
  if (p.bits != 4 && p.bits != 8) guarded::die("bits must be 4 or 8");
  const std::uint32_t v = 128 / p.bits;
  if (p.cols % v != 0 || p.cols / v < 8) guarded::die("cols must be whole 16-byte chunks, at least 8");
  if (p.group_size % v != 0 || p.cols % p.group_size != 0) guarded::die("groups must hold whole chunks");
  if (c.lpr != 8 && c.lpr != 16 && c.lpr != 32) guarded::die("lanes per row must be 8, 16 or 32");
  if (c.blocks_x == 0) guarded::die("blocks_x must be at least 1");
  if (c.body > 3) guarded::die("body must be 0 (wide), 1 (streamed), 2 (split) or 3 (streamed rows)");
  if ((c.body == 1 || c.body == 3) && (p.cols / v + c.lpr - 1) / c.lpr > c.steps)
    guarded::die("more chunks a lane than steps");
  if (c.body == 1 && (c.rows_per_group > 2 || (c.swiglu && c.rows_per_group > 1)))
    guarded::die("no streamed entry point for these rows per group");
  if (c.body == 3 && (c.swiglu || p.has_ids || p.x_div != 1 || c.rows_per_group != 1 || c.experts != 1))
    guarded::die("the rows kernel takes dense products, one row a group");
  if (c.experts == 0 || p.rows == 0 || p.out_rows == 0 || p.x_div == 0) guarded::die("empty shape");
  const std::size_t stacked = std::size_t(c.experts) * p.rows;
  affine_case::read_weights(stacked, p.cols, p.bits, p.group_size, c.packed, c.scales, c.biases);
  c.x = guarded::read_raw<float>(std::size_t((p.out_rows - 1) / p.x_div + 1) * p.cols);
  if (p.has_ids) c.ids = guarded::read_raw<std::uint32_t>(p.out_rows);
  guarded::expect_end();

  using guarded::by_code;
  by_code<float, __half, __nv_bfloat16>(x_type, "unknown x_type", [&](auto x) {
    by_code<float, __half, __nv_bfloat16>(scale_type, "unknown scale_type", [&](auto s) {
      run_for_shape<typename decltype(x)::type, typename decltype(s)::type>(c);
    });
  });
  return guarded::finish();
}
