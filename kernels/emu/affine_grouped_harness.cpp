// Runs the shipped kernels/affine_grouped.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/affine_grouped_emulation.rs.
//
// stdin, little-endian: "AGQEMU02", then u32 value_type (InT; 0 f32, 1 f16, 2 bf16),
// scale_type (ScT, same codes), experts E, rows R, cols K, bits, group_size, x_rows P, tiles
// T, slice_cols (0: the one-pass entry affine_grouped_qmm_* writing y; > 0: split-K, the
// entry affine_grouped_split_* over threadgroup z = ceil(K / slice_cols) slices into a float
// workspace, every plane of which must be written, then the shipped fixed-order sum
// affine_split_sum_* into y); then packed u32 [E*R, K*bits/32], f32 scales and biases [E*R, K/group_size], f32 x
// [P, K], and the tile schedule u32 [T, 3] (expert, row_begin, row_end) exactly as the host
// builds it (gdn_ops::ops::affine_grouped::tiles::tile_schedule). Inputs are converted to the
// instantiation's InT / ScT here (exactly, when the caller already rounded them).
// stdout: f32 y [P, R].
//
// The launch geometry is the host's (crates/gdn-ops/src/ops/affine_grouped/metal.rs):
// threadgroups (ceil(R / 32), T, slices), 128 threads each, GROUPED_SCRATCH_BYTES of
// threadgroup memory; the sum (ceil(P * R / 256), 1, 1) of SPLIT_SUM_THREADS = 256. Change
// both together.
//
// Memory checks and exit codes: kernels/emu/guarded_buffer.h (every buffer guarded, inputs
// read-only, y poisoned: a row of y no tile covers fails the case).
//
// Build: clang++-19 -std=c++17 -O2 -ffp-contract=off --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/affine_grouped_harness.cpp -o affine_grouped_harness
// (-ffp-contract=off: the weights are dequantized with the reference's separate multiply
// and add, so the test can round them to InT as the kernel does.)

#include "guarded_buffer.h"
#include "affine_case.h"

#include "../affine_grouped.metal"

namespace {

using namespace guarded;

// Mirrors GROUPED_TILE_COLS, GROUPED_THREADS and GROUPED_SCRATCH_BYTES of
// crates/gdn-ops/src/ops/affine_grouped/tiles.rs.
constexpr uint kHostTileCols = 32;
constexpr uint kHostThreads = 128;
constexpr uint kHostScratchBytes = 12288;
constexpr uint kHostSumThreads = 256;
static_assert(kHostTileCols == kTileN && kHostThreads == kThreads && kHostScratchBytes == kScratchBytes &&
                  kHostSumThreads == kSumThreads,
              "the host's launch constants changed: update the harness and the host together");

struct Case {
  uint experts, rows, cols, bits, group_size, x_rows, tiles, slice_cols;
  std::vector<std::uint32_t> packed, schedule;
  std::vector<float> scales, biases, x;
};

template <class InT, class ScT>
using GroupedKernel = void (*)(const device uint*, const device ScT*, const device ScT*, const device InT*,
                               const device GroupedTile*, device InT*, constant AffineGroupedParams&,
                               threadgroup float*, uint3, uint, uint);

template <class InT, class ScT>
using SplitKernel = void (*)(const device uint*, const device ScT*, const device ScT*, const device InT*,
                             const device GroupedTile*, device float*, constant AffineGroupedParams&,
                             threadgroup float*, uint3, uint, uint);

template <class InT>
using SumKernel = void (*)(const device float*, device InT*, constant AffineSplitSumParams&, uint);

template <class InT, class ScT>
void run(const Case& c, GroupedKernel<InT, ScT> kernel, SplitKernel<InT, ScT> split, SumKernel<InT> sum) {
  Buffer<uint> w("w", c.packed.size(), Kind::kInput);
  Buffer<ScT> scales("scales", c.scales.size(), Kind::kInput);
  Buffer<ScT> biases("biases", c.biases.size(), Kind::kInput);
  Buffer<InT> x("x", c.x.size(), Kind::kInput);
  Buffer<uint> tiles("tiles", c.schedule.size(), Kind::kInput);
  Buffer<InT> y("y", std::size_t(c.x_rows) * c.rows, Kind::kOutput);
  w.fill(c.packed);
  scales.fill(c.scales);
  biases.fill(c.biases);
  x.fill(c.x);
  tiles.fill(c.schedule);
  const AffineGroupedParams params{c.experts, c.rows,  c.cols,      c.bits, c.group_size,
                                   c.x_rows,  c.tiles, c.slice_cols};
  const uint3 per_group{kHostThreads, 1, 1};
  const uint column_groups = (c.rows + kHostTileCols - 1) / kHostTileCols;

  if (c.slice_cols == 0) {
    const uint3 groups{column_groups, c.tiles, 1};
    metal_emu::dispatch_threadgroups(groups, per_group, kHostScratchBytes, [&](const metal_emu::ThreadIds& id) {
      kernel((const device uint*)w.data(), (const device ScT*)scales.data(), (const device ScT*)biases.data(),
             (const device InT*)x.data(), (const device GroupedTile*)tiles.data(), (device InT*)y.data(),
             *(constant AffineGroupedParams*)&params, id.threadgroup_memory_as<float>(),
             id.threadgroup_position_in_grid, id.thread_index_in_threadgroup, id.simdgroup_index_in_threadgroup);
    });
    guarded::check_all(w, scales, biases, x, tiles, y);
  } else {
    // The host's slice count: every slice holds at least one column step.
    const uint slices = (c.cols + c.slice_cols - 1) / c.slice_cols;
    const std::size_t n = std::size_t(c.x_rows) * c.rows;
    Buffer<float> partial("partial", std::size_t(slices) * n, Kind::kOutput);
    const uint3 groups{column_groups, c.tiles, slices};
    metal_emu::dispatch_threadgroups(groups, per_group, kHostScratchBytes, [&](const metal_emu::ThreadIds& id) {
      split((const device uint*)w.data(), (const device ScT*)scales.data(), (const device ScT*)biases.data(),
            (const device InT*)x.data(), (const device GroupedTile*)tiles.data(), (device float*)partial.data(),
            *(constant AffineGroupedParams*)&params, id.threadgroup_memory_as<float>(),
            id.threadgroup_position_in_grid, id.thread_index_in_threadgroup, id.simdgroup_index_in_threadgroup);
    });
    const AffineSplitSumParams sum_params{uint(n), slices};
    const uint3 sum_groups{uint((n + kHostSumThreads - 1) / kHostSumThreads), 1, 1};
    metal_emu::dispatch_threadgroups(sum_groups, uint3{kHostSumThreads, 1, 1}, 0, [&](const metal_emu::ThreadIds& id) {
      sum((const device float*)partial.data(), (device InT*)y.data(), *(constant AffineSplitSumParams*)&sum_params,
          id.thread_position_in_grid.x);
    });
    guarded::check_all(w, scales, biases, x, tiles, partial, y);
  }
  y.write_f32();
}

}  // namespace

int main() {
  install_fault_handler("affine_grouped_harness");

  std::uint32_t h[10];
  read_header("AGQEMU02", h);
  Case c;
  const std::uint32_t value_type = h[0], scale_type = h[1];
  c.experts = h[2];
  c.rows = h[3];
  c.cols = h[4];
  c.bits = h[5];
  c.group_size = h[6];
  c.x_rows = h[7];
  c.tiles = h[8];
  c.slice_cols = h[9];

  // The host side's contract (affine_grouped/metal.rs checks it).
  affine_case::check_metal_bits(c.bits);
  if (c.group_size == 0 || c.group_size % 32 != 0 || c.cols % c.group_size != 0) {
    die("cols must be a multiple of group_size, itself a multiple of 32");
  }
  if (c.experts == 0 || c.rows == 0 || c.tiles == 0) die("an empty launch is no launch");
  if (c.slice_cols % 64 != 0) die("slice_cols must be whole 64-column steps (slicing.rs)");
  if (c.slice_cols > 0 && c.experts != 1) die("split-K takes one matrix");
  if (value_type > 2 || scale_type > 2) die("unknown value_type / scale_type");
  const std::size_t stacked = std::size_t(c.experts) * c.rows;
  affine_case::read_weights(stacked, c.cols, c.bits, c.group_size, c.packed, c.scales, c.biases);
  c.x = read_raw<float>(std::size_t(c.x_rows) * c.cols);
  c.schedule = read_raw<std::uint32_t>(std::size_t(c.tiles) * 3);
  expect_end();

  switch (value_type * 3 + scale_type) {
    case 0: run<float, float>(c, affine_grouped_qmm_f32_f32, affine_grouped_split_f32_f32, affine_split_sum_f32); break;
    case 1: run<float, half>(c, affine_grouped_qmm_f32_f16, affine_grouped_split_f32_f16, affine_split_sum_f32); break;
    case 2: run<float, bfloat>(c, affine_grouped_qmm_f32_bf16, affine_grouped_split_f32_bf16, affine_split_sum_f32); break;
    case 3: run<half, float>(c, affine_grouped_qmm_f16_f32, affine_grouped_split_f16_f32, affine_split_sum_f16); break;
    case 4: run<half, half>(c, affine_grouped_qmm_f16_f16, affine_grouped_split_f16_f16, affine_split_sum_f16); break;
    case 5: run<half, bfloat>(c, affine_grouped_qmm_f16_bf16, affine_grouped_split_f16_bf16, affine_split_sum_f16); break;
    case 6: run<bfloat, float>(c, affine_grouped_qmm_bf16_f32, affine_grouped_split_bf16_f32, affine_split_sum_bf16); break;
    case 7: run<bfloat, half>(c, affine_grouped_qmm_bf16_f16, affine_grouped_split_bf16_f16, affine_split_sum_bf16); break;
    case 8: run<bfloat, bfloat>(c, affine_grouped_qmm_bf16_bf16, affine_grouped_split_bf16_bf16, affine_split_sum_bf16); break;
  }
  return guarded::finish();
}
