// Runs the shipped kernels/moe_combine.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/moe_combine_emulation.rs.
//
// stdin, little-endian: "COMBEMU2", then u32 in_type (0 f32, 1 f16, 2 bf16), tokens N,
// slots S, hidden H, has_norm, f32 eps, u32 has_residual, gathered, down_rows; then f32 down
// ([down_rows, H] when gathered, else [N, S, H]), when gathered u32 rows [N, S], f32 weights
// [N, S], when has_residual f32 residual [N, H], and when has_norm f32 norm_weight [H].
// Activations are converted to InT here (exactly, when the caller already rounded them).
// stdout: f32 sum [N, H], then (has_norm) f32 normed [N, H].
//
// The launch geometry is ops/moe_combine/metal.rs's: threadgroups (N, 1, 1), threads
// (256, 1, 1), 32 bytes of threadgroup memory. Memory checks and exit codes: kernels/emu/guarded_buffer.h.
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/moe_combine_harness.cpp -o moe_combine_harness

#include "guarded_buffer.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "metal_emu.h"

#include "../moe_combine.metal"

namespace {

using namespace guarded;

template <class InT>
using CombineKernel = void (*)(const device InT*, const device uint*, const device float*, const device InT*,
                               const device InT*, device InT*, device InT*, constant MoeCombineParams&,
                               threadgroup float*, uint3, uint, uint3, uint, uint);


struct Case {
  uint tokens, slots, hidden, has_norm, threads;
  float eps;
  uint has_residual, gathered, down_rows;
  std::vector<float> down, weights, residual, norm_weight;
  std::vector<std::uint32_t> rows;
};

template <class InT>
void run(const Case& c, CombineKernel<InT> kernel) {
  const std::size_t out_len = std::size_t(c.tokens) * c.hidden;
  Buffer<InT> down("down", c.down.size(), Kind::kInput);
  Buffer<std::uint32_t> rows("rows", c.rows.size(), Kind::kInput);
  Buffer<float> weights("weights", c.weights.size(), Kind::kInput);
  Buffer<InT> residual("residual", c.residual.size(), Kind::kInput);
  Buffer<InT> norm_weight("norm_weight", c.norm_weight.size(), Kind::kInput);
  Buffer<InT> sum("sum", out_len, Kind::kOutput);
  Buffer<InT> normed("normed", c.has_norm != 0 ? out_len : 0, Kind::kOutput);
  down.fill(c.down);
  rows.fill(c.rows);
  weights.fill(c.weights);
  residual.fill(c.residual);
  norm_weight.fill(c.norm_weight);
  const MoeCombineParams params{c.tokens, c.slots, c.hidden, c.has_norm, c.eps, c.has_residual, c.gathered, c.down_rows};
  // The host's combine_threads(H), passed by the test.
  const uint3 per_group{c.threads, 1, 1};
  const std::size_t scratch_bytes = 32 * sizeof(float);
  metal_emu::dispatch_threadgroups(uint3{c.tokens, 1, 1}, per_group, scratch_bytes, [&](const metal_emu::ThreadIds& id) {
    // Unbound when unused (no rows unless gathered, no residual, no norm): a read would fault.
    kernel((const device InT*)down.data(), c.gathered != 0 ? (const device uint*)rows.data() : nullptr,
           (const device float*)weights.data(),
           c.has_residual != 0 ? (const device InT*)residual.data() : nullptr,
           c.has_norm != 0 ? (const device InT*)norm_weight.data() : nullptr, (device InT*)sum.data(),
           c.has_norm != 0 ? (device InT*)normed.data() : nullptr, *(constant MoeCombineParams*)&params,
           id.threadgroup_memory_as<float>(), id.threadgroup_position_in_grid, id.thread_index_in_threadgroup,
           id.threads_per_threadgroup, id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup);
  });
  guarded::check_all(down, rows, weights, residual, norm_weight, sum, normed);
  sum.write_f32();
  normed.write_f32();
}

}  // namespace

int main() {
  const auto h = guarded::start<10>("moe_combine_harness", "COMBEMU2");
  Case c{h[1], h[2], h[3], h[4], h[9], 0.0f, h[6], h[7], h[8], {}, {}, {}, {}, {}};
  std::memcpy(&c.eps, &h[5], 4);
  if (c.slots == 0 || c.hidden == 0) die("slots and hidden must be positive");
  if (c.threads == 0 || c.threads % 32 != 0 || c.threads > 512) die("threads must be whole simdgroups, at most 512");
  if (c.has_norm > 1 || c.has_residual > 1 || c.gathered > 1) die("flags must be 0 or 1");
  const std::size_t pairs = std::size_t(c.tokens) * c.slots;
  c.down = read_raw<float>((c.gathered != 0 ? std::size_t(c.down_rows) : pairs) * c.hidden);
  c.rows = read_raw<std::uint32_t>(c.gathered != 0 ? pairs : 0);
  c.weights = read_raw<float>(pairs);
  c.residual = read_raw<float>(c.has_residual != 0 ? std::size_t(c.tokens) * c.hidden : 0);
  c.norm_weight = read_raw<float>(c.has_norm != 0 ? c.hidden : 0);
  guarded::expect_end();
  guarded::by_type(h[0], moe_combine_f32, moe_combine_f16, moe_combine_bf16,
                   [&](auto t, auto kernel) { run<typename decltype(t)::type>(c, kernel); });
  return guarded::finish();
}
