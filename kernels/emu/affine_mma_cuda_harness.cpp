// Runs the body of the tensor-core decode products of kernels/affine_mma.cu (affine_mma::body,
// the `affine_mma_{products,swiglu}_b4_bf16_<s>` entry points) on the CPU through
// kernels/emu/cuda/cuda_emu.h: the mma.sync m16n8k16 through the kernel's own emulation path
// (its `#else` branch: fragments gathered with shuffles), the cp.async ring through the
// deferred copies of cuda_pipeline_primitives.h (a stage read before its copies were waited
// for, or overwritten while still read, holds 0xFF bytes). The launch geometry is the host's
// (crates/gdn-ops/src/ops/affine/mma.rs): blocks (blocks_x, out_rows) of 32 * warps threads,
// the dynamic shared memory of its formula (NaN before each block, so that a read of what no
// thread wrote poisons the result). Used by crates/gdn-ops/tests/affine_mma_cuda_emulation.rs.
//
// stdin, little-endian: "AMMACUD1", then u32 experts, rows, cols, bits, group_size, out_rows,
// x_div, has_ids, swiglu, warps (W, 1..16), blocks_x, x_type (must be 2: bf16), scale_type
// (0 f32, 1 f16, 2 bf16), then u32 packed [E * rows, cols / 8], f32 scales and biases
// [E * rows, cols / group_size] (exact in the scale type), f32 x [(out_rows - 1) / x_div + 1,
// cols] (exact in bf16), u32 ids [out_rows] (present when has_ids).
// stdout: f32 y [out_rows, outputs], outputs = rows (products) or rows / 2 (swiglu). Every
// element must be written.
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        -I kernels kernels/emu/affine_mma_cuda_harness.cpp

#include "guarded_buffer.h"
#include "affine_case.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

#include "../affine_mma.cu"

// The entry points' extern __shared__ array, defined so that they link (never called here:
// the harness passes its own).
uint4 mma_shared[1];

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  AffineParams p;
  std::uint32_t experts, swiglu, warps, blocks_x;
  std::vector<std::uint32_t> packed, ids;
  std::vector<float> scales, biases, x;
};

// A ring stage as the host's formula counts it: kBatch super-steps of two rows' 16-byte words
// for 32 lanes, and 4 pairs of scales or biases (8 bytes each) for 32 lanes.
template <class S>
constexpr std::uint32_t kStageBytes = affine_mma::kBatch * 2 * 32 * 16 + 4 * 32 * 8;

// The block's dynamic shared memory (bytes): the warps' rings, x permuted (2 bytes a column),
// each group's sum of x, the warps' sums of two tiles.
template <class S>
std::size_t shared_bytes(const Case& c) {
  static_assert(affine_mma::stage_bytes<S>() == kStageBytes<S>, "a stage as the host counts it");
  const std::size_t groups = c.p.cols / c.p.group_size;
  return std::size_t(c.warps) * affine_mma::kStages * kStageBytes<S> + 2 * c.p.cols + 4 * groups +
         4 * 2 * 16 * c.warps;
}

template <bool SWIGLU, class S>
void run(const Case& c) {
  const AffineParams& p = c.p;
  const std::uint32_t outputs = SWIGLU ? p.rows / 2 : p.rows;
  Buffer<uint> packed("packed", c.packed, Kind::kInput);
  Buffer<S> scales("scales", c.scales, Kind::kInput);
  Buffer<S> biases("biases", c.biases, Kind::kInput);
  Buffer<__nv_bfloat16> x("x", c.x, Kind::kInput);
  // Without ids the kernel must not read them: a one-element buffer, bound and checked only.
  Buffer<uint> ids("ids", p.has_ids ? c.ids : std::vector<std::uint32_t>{0}, Kind::kInput);
  Buffer<__nv_bfloat16> y("y", std::size_t(p.out_rows) * outputs, Kind::kOutput);
  BlockShared shared(shared_bytes<S>(c) / 4);
  metal_emu::dispatch_threadgroups(uint3{c.blocks_x, p.out_rows, 1}, uint3{32 * c.warps, 1, 1},
                                   [&](const metal_emu::ThreadIds& id) {
                                     shared.poison(id);
                                     affine_mma::body<SWIGLU, S>(
                                         packed.data(), scales.data(), biases.data(), x.data(), ids.data(),
                                         y.data(), p, c.experts, id.thread_index_in_threadgroup, c.warps,
                                         id.threadgroup_position_in_grid.x, c.blocks_x,
                                         id.threadgroup_position_in_grid.y,
                                         reinterpret_cast<uint32_t*>(shared.smem));
                                   });
  shared.check();
  guarded::check_all(packed, scales, biases, x, ids, y);
  y.write_f32();
}

}  // namespace

int main() {
  const auto h = guarded::start<13>("affine_mma_cuda_harness", "AMMACUD1");
  Case c;
  c.experts = h[0];
  c.p = AffineParams{h[1], h[2], h[3], h[4], h[5], h[6], h[7]};
  c.swiglu = h[8], c.warps = h[9], c.blocks_x = h[10];
  const std::uint32_t x_type = h[11], scale_type = h[12];
  const AffineParams& p = c.p;
  // The host side's contract (ops/affine/mma.rs checks it).
  if (p.bits != 4) guarded::die("bits must be 4");
  if (p.group_size != 64 && p.group_size != 128) guarded::die("group_size must be 64 or 128");
  if (p.cols % affine_mma::kSuperCols != 0) guarded::die("cols must be a multiple of 128");
  if ((p.cols / p.group_size) % 2 != 0) guarded::die("the group count must be even");
  if (x_type != 2) guarded::die("x must be bf16");
  if (c.warps == 0 || c.warps > affine_mma::kMaxWarps) guarded::die("warps must be 1 to 16");
  if (c.blocks_x == 0) guarded::die("blocks_x must be at least 1");
  if (c.experts == 0 || p.rows == 0 || p.out_rows == 0 || p.x_div == 0) guarded::die("empty shape");
  if (c.swiglu && p.rows % 2 != 0) guarded::die("the SwiGLU takes gate and up rows: an even count");
  const std::size_t stacked = std::size_t(c.experts) * p.rows;
  affine_case::read_weights(stacked, p.cols, p.bits, p.group_size, c.packed, c.scales, c.biases);
  c.x = guarded::read_raw<float>(std::size_t((p.out_rows - 1) / p.x_div + 1) * p.cols);
  if (p.has_ids) c.ids = guarded::read_raw<std::uint32_t>(p.out_rows);
  guarded::expect_end();

  guarded::by_code<float, __half, __nv_bfloat16>(scale_type, "unknown scale_type", [&](auto s) {
    using S = typename decltype(s)::type;
    c.swiglu ? run<true, S>(c) : run<false, S>(c);
  });
  return guarded::finish();
}
