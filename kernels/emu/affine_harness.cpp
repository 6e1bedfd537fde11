// Runs the shipped kernels/affine.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/affine_emulation.rs.
//
// stdin, little-endian: "AFFEMU01", then u32 kernel (0 qmv, 1 dequant, 2 qmv_swiglu, 3 qmv_pass: the
// dense products of out_rows = 2..8 rows in one pass, no ids, x_div 1), value_type (qmv: InT,
// dequant: OutT; 0 f32, 1 f16, 2 bf16), scale_type (same codes), experts E, rows R, cols K,
// bits, group_size, out_rows M, x_div, has_ids, x_rows X; then packed u32 [E*R, K*bits/32],
// f32 scales and biases [E*R, K/group_size], for qmv f32 x [X, K], and when has_ids u32 ids
// [M]. Inputs are converted to the instantiation's InT / ScT here (exactly, when the caller
// already rounded them).
// stdout: f32 [M, R] (qmv, qmv_pass), [M, R/2] (qmv_swiglu) or [M, K] (dequant). qmv_swiglu is read
// like qmv (it takes the same inputs).
//
// The launch geometry and the AffineParams the host passes are reproduced here; they must
// match crates/gdn-ops/src/metal/affine.rs (QMV_ROWS_PER_SIMDGROUP = 4, QMV_SIMDGROUPS = 2,
// DEQUANT_THREADS = 64, DEQUANT_VALUES_PER_THREAD = 8; params.rows is R for qmv, E*R for
// dequant). Change both together.
//
// Memory checks and exit codes: kernels/emu/guarded_buffer.h (every buffer guarded on both
// sides with an inaccessible page after it, inputs read-only, outputs poisoned).
//
// Build: clang++-19 -std=c++17 -O2 -ffp-contract=off --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/affine_harness.cpp -o affine_harness
// (-ffp-contract=off: the dequant check is bit for bit against the reference's separate
// multiply and add.)

#include "guarded_buffer.h"
#include "affine_case.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../affine.metal"

namespace {

using namespace guarded;

struct Case {
  uint kernel, experts, rows, cols, bits, group_size, out_rows, x_div, has_ids, x_rows;
  std::vector<std::uint32_t> packed, ids;
  std::vector<float> scales, biases, x;
};

// The signatures every affine_qmv_{in}_{sc} / affine_dequant_{out}_{sc} kernel must have for
// its types: a kernel named for other types does not convert to it, and fails to compile.
template <class InT, class ScT>
using QmvKernel = void (*)(const device uint*, const device ScT*, const device ScT*, const device InT*,
                           const device uint*, device InT*, constant AffineParams&, uint3, uint, uint);
template <class OutT, class ScT>
using DequantKernel = void (*)(const device uint*, const device ScT*, const device ScT*, const device uint*,
                               device OutT*, constant AffineParams&, uint3);

// Mirrors QMV_ROWS_PER_SIMDGROUP and QMV_SIMDGROUPS, DEQUANT_THREADS and
// DEQUANT_VALUES_PER_THREAD of crates/gdn-ops/src/metal/affine.rs.
constexpr uint kQmvRowsPerSimdgroup = 4;
constexpr uint kQmvSimdgroups = 2;
constexpr uint kDequantThreads = 64;
constexpr uint kDequantValuesPerThread = 8;

// swiglu: affine_qmv_swiglu_*, whose y holds R/2 activations per output row.
template <class InT, class ScT>
void run_qmv(const Case& c, QmvKernel<InT, ScT> kernel, bool swiglu) {
  const uint y_cols = swiglu ? c.rows / 2 : c.rows;
  Buffer<uint> w("w", c.packed.size(), Kind::kInput);
  Buffer<ScT> scales("scales", c.scales.size(), Kind::kInput);
  Buffer<ScT> biases("biases", c.biases.size(), Kind::kInput);
  Buffer<InT> x("x", c.x.size(), Kind::kInput);
  Buffer<uint> ids("ids", c.ids.size(), Kind::kInput);
  Buffer<InT> y("y", std::size_t(c.out_rows) * y_cols, Kind::kOutput);
  w.fill(c.packed);
  scales.fill(c.scales);
  biases.fill(c.biases);
  x.fill(c.x);
  ids.fill(c.ids);
  // Host: params(m, m.rows, out_rows, x_div, ids.is_some()).
  const AffineParams params{c.rows, c.cols, c.bits, c.group_size, c.out_rows, c.x_div, c.has_ids};

  const uint rows_per_group = kQmvRowsPerSimdgroup * kQmvSimdgroups;
  const uint3 groups{(y_cols + rows_per_group - 1) / rows_per_group, c.out_rows, 1};
  const uint3 per_group{32, kQmvSimdgroups, 1};
  metal_emu::dispatch_threadgroups(groups, per_group, [&](const metal_emu::ThreadIds& id) {
    kernel((const device uint*)w.data(), (const device ScT*)scales.data(), (const device ScT*)biases.data(),
           (const device InT*)x.data(),
           // Unbound without ids: a read would fault.
           c.has_ids != 0 ? (const device uint*)ids.data() : nullptr, (device InT*)y.data(),
           *(constant AffineParams*)&params, id.threadgroup_position_in_grid, id.simdgroup_index_in_threadgroup,
           id.thread_index_in_simdgroup);
  });

  guarded::check_all(w, scales, biases, x, ids, y);
  y.write_f32();
}

template <class InT, class ScT>
using PassKernel = void (*)(const device uint*, const device ScT*, const device ScT*, const device InT*,
                            device InT*, constant AffineParams&, uint3, uint, uint);

// affine_qmv_pass_*: the M = out_rows (2..8) dense rows in one pass, one threadgroup row.
template <class InT, class ScT>
void run_qmv_pass(const Case& c, PassKernel<InT, ScT> kernel) {
  Buffer<uint> w("w", c.packed.size(), Kind::kInput);
  Buffer<ScT> scales("scales", c.scales.size(), Kind::kInput);
  Buffer<ScT> biases("biases", c.biases.size(), Kind::kInput);
  Buffer<InT> x("x", c.x.size(), Kind::kInput);
  Buffer<InT> y("y", std::size_t(c.out_rows) * c.rows, Kind::kOutput);
  w.fill(c.packed);
  scales.fill(c.scales);
  biases.fill(c.biases);
  x.fill(c.x);
  // Host: AffineParams::new(m, m.rows, rows, 1, false).
  const AffineParams params{c.rows, c.cols, c.bits, c.group_size, c.out_rows, 1, 0};
  const uint rows_per_group = kQmvRowsPerSimdgroup * kQmvSimdgroups;
  const uint3 groups{(c.rows + rows_per_group - 1) / rows_per_group, 1, 1};
  const uint3 per_group{32, kQmvSimdgroups, 1};
  metal_emu::dispatch_threadgroups(groups, per_group, [&](const metal_emu::ThreadIds& id) {
    kernel((const device uint*)w.data(), (const device ScT*)scales.data(), (const device ScT*)biases.data(),
           (const device InT*)x.data(), (device InT*)y.data(), *(constant AffineParams*)&params,
           id.threadgroup_position_in_grid, id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup);
  });
  guarded::check_all(w, scales, biases, x, y);
  y.write_f32();
}

template <class OutT, class ScT>
void run_dequant(const Case& c, DequantKernel<OutT, ScT> kernel) {
  Buffer<uint> w("w", c.packed.size(), Kind::kInput);
  Buffer<ScT> scales("scales", c.scales.size(), Kind::kInput);
  Buffer<ScT> biases("biases", c.biases.size(), Kind::kInput);
  Buffer<uint> ids("ids", c.ids.size(), Kind::kInput);
  Buffer<OutT> out("out", std::size_t(c.out_rows) * c.cols, Kind::kOutput);
  w.fill(c.packed);
  scales.fill(c.scales);
  biases.fill(c.biases);
  ids.fill(c.ids);
  // Host: params(m, m.experts * m.rows, count, 1, ids.is_some()).
  const AffineParams params{c.experts * c.rows, c.cols, c.bits, c.group_size, c.out_rows, 1, c.has_ids};

  const uint per_group_values = kDequantThreads * kDequantValuesPerThread;
  const uint3 groups{(c.cols + per_group_values - 1) / per_group_values, c.out_rows, 1};
  const uint3 per_group{kDequantThreads, 1, 1};
  metal_emu::dispatch_threadgroups(groups, per_group, [&](const metal_emu::ThreadIds& id) {
    kernel((const device uint*)w.data(), (const device ScT*)scales.data(), (const device ScT*)biases.data(),
           c.has_ids != 0 ? (const device uint*)ids.data() : nullptr, (device OutT*)out.data(),
           *(constant AffineParams*)&params, id.thread_position_in_grid);
  });

  guarded::check_all(w, scales, biases, ids, out);
  out.write_f32();
}

}  // namespace

int main() {
  install_fault_handler("affine_harness");

  std::uint32_t h[12];
  read_header("AFFEMU01", h);
  Case c;
  const std::uint32_t value_type = h[1], scale_type = h[2];
  c.kernel = h[0];
  c.experts = h[3];
  c.rows = h[4];
  c.cols = h[5];
  c.bits = h[6];
  c.group_size = h[7];
  c.out_rows = h[8];
  c.x_div = h[9];
  c.has_ids = h[10];
  c.x_rows = h[11];

  // The host side's contract (crates/gdn-ops/src/affine_tensor.rs checks it).
  affine_case::check_metal_bits(c.bits);
  if (c.group_size == 0 || c.group_size % 8 != 0 || c.cols % c.group_size != 0) die("cols must be a multiple of group_size, itself a multiple of 8");
  if (c.kernel > 3) die("unknown kernel");
  if (c.kernel == 3 && (c.has_ids != 0 || c.x_div != 1 || c.experts != 1 || c.out_rows < 2 || c.out_rows > 8))
    die("qmv_pass: dense products of 2 to 8 rows (no ids, x_div 1, one expert)");
  if (c.kernel == 2 && c.rows % 2 != 0) die("swiglu: rows must be even (gate rows, then up rows)");
  if (c.has_ids > 1) die("has_ids must be 0 or 1");
  const std::size_t stacked = std::size_t(c.experts) * c.rows;
  affine_case::read_weights(stacked, c.cols, c.bits, c.group_size, c.packed, c.scales, c.biases);
  if (c.kernel != 1) {
    if (c.x_div == 0 || c.out_rows == 0 || (c.out_rows - 1) / c.x_div >= c.x_rows) die("qmv: x has too few rows");
    c.x = read_raw<float>(std::size_t(c.x_rows) * c.cols);
  } else if (c.x_rows != 0 || c.x_div != 1) {
    die("dequant takes no x (x_rows 0, x_div 1)");
  }
  c.ids = read_raw<std::uint32_t>(c.has_ids != 0 ? c.out_rows : 0);
  if (c.kernel != 1) {
    // The qmv kernel does not know E, so it cannot check: ids come from the router's top-k.
    for (std::uint32_t e : c.ids) {
      if (e >= c.experts) die("qmv: expert id out of range");
    }
    if (c.has_ids == 0 && c.experts != 1) die("qmv without ids uses expert 0: pass experts = 1");
  }
  expect_end();

  const std::uint32_t which = value_type * 3 + scale_type;
  if (value_type > 2 || scale_type > 2) die("unknown value_type / scale_type");
  if (c.kernel == 0) {
    switch (which) {
      case 0: run_qmv<float, float>(c, affine_qmv_f32_f32, false); break;
      case 1: run_qmv<float, half>(c, affine_qmv_f32_f16, false); break;
      case 2: run_qmv<float, bfloat>(c, affine_qmv_f32_bf16, false); break;
      case 3: run_qmv<half, float>(c, affine_qmv_f16_f32, false); break;
      case 4: run_qmv<half, half>(c, affine_qmv_f16_f16, false); break;
      case 5: run_qmv<half, bfloat>(c, affine_qmv_f16_bf16, false); break;
      case 6: run_qmv<bfloat, float>(c, affine_qmv_bf16_f32, false); break;
      case 7: run_qmv<bfloat, half>(c, affine_qmv_bf16_f16, false); break;
      case 8: run_qmv<bfloat, bfloat>(c, affine_qmv_bf16_bf16, false); break;
    }
  } else if (c.kernel == 3) {
    switch (which) {
      case 0: run_qmv_pass<float, float>(c, affine_qmv_pass_f32_f32); break;
      case 1: run_qmv_pass<float, half>(c, affine_qmv_pass_f32_f16); break;
      case 2: run_qmv_pass<float, bfloat>(c, affine_qmv_pass_f32_bf16); break;
      case 3: run_qmv_pass<half, float>(c, affine_qmv_pass_f16_f32); break;
      case 4: run_qmv_pass<half, half>(c, affine_qmv_pass_f16_f16); break;
      case 5: run_qmv_pass<half, bfloat>(c, affine_qmv_pass_f16_bf16); break;
      case 6: run_qmv_pass<bfloat, float>(c, affine_qmv_pass_bf16_f32); break;
      case 7: run_qmv_pass<bfloat, half>(c, affine_qmv_pass_bf16_f16); break;
      case 8: run_qmv_pass<bfloat, bfloat>(c, affine_qmv_pass_bf16_bf16); break;
    }
  } else if (c.kernel == 2) {
    switch (which) {
      case 0: run_qmv<float, float>(c, affine_qmv_swiglu_f32_f32, true); break;
      case 1: run_qmv<float, half>(c, affine_qmv_swiglu_f32_f16, true); break;
      case 2: run_qmv<float, bfloat>(c, affine_qmv_swiglu_f32_bf16, true); break;
      case 3: run_qmv<half, float>(c, affine_qmv_swiglu_f16_f32, true); break;
      case 4: run_qmv<half, half>(c, affine_qmv_swiglu_f16_f16, true); break;
      case 5: run_qmv<half, bfloat>(c, affine_qmv_swiglu_f16_bf16, true); break;
      case 6: run_qmv<bfloat, float>(c, affine_qmv_swiglu_bf16_f32, true); break;
      case 7: run_qmv<bfloat, half>(c, affine_qmv_swiglu_bf16_f16, true); break;
      case 8: run_qmv<bfloat, bfloat>(c, affine_qmv_swiglu_bf16_bf16, true); break;
    }
  } else {
    switch (which) {
      case 0: run_dequant<float, float>(c, affine_dequant_f32_f32); break;
      case 1: run_dequant<float, half>(c, affine_dequant_f32_f16); break;
      case 2: run_dequant<float, bfloat>(c, affine_dequant_f32_bf16); break;
      case 3: run_dequant<half, float>(c, affine_dequant_f16_f32); break;
      case 4: run_dequant<half, half>(c, affine_dequant_f16_f16); break;
      case 5: run_dequant<half, bfloat>(c, affine_dequant_f16_bf16); break;
      case 6: run_dequant<bfloat, float>(c, affine_dequant_bf16_f32); break;
      case 7: run_dequant<bfloat, half>(c, affine_dequant_bf16_f16); break;
      case 8: run_dequant<bfloat, bfloat>(c, affine_dequant_bf16_bf16); break;
    }
  }
  return guarded::finish();
}
