// Runs the shipped kernels/gated_rms_norm.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/gated_rms_norm_emulation.rs.
//
// stdin, little-endian: "GRNEMU01", then u32 type (0 f32, 1 f16, 2 bf16), B, T, Hv, Dv,
// z_batch_stride, z_token_stride; f32 eps; then f32 arrays y [B, T, Hv, Dv], z (a view:
// (B-1)*z_batch_stride + (T-1)*z_token_stride + Hv*Dv values, the gaps NaN), weight [Dv].
// Inputs are converted to InT here (exactly, when the caller already rounded them).
// stdout: f32 out [B, T, Hv, Dv].
//
// The launch geometry is crates/gdn-ops/src/ops/gated_rms_norm/metal.rs's
// (ROWS_PER_THREADGROUP = 4); change both together. Memory checks: guarded_buffer.h.

#include "guarded_buffer.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "metal_math.h"

#include "../gated_rms_norm.metal"

namespace {

using guarded::Buffer;
using guarded::Kind;

constexpr uint kRowsPerThreadgroup = 4;

struct Case {
  GatedRmsNormParams p;
  uint batch;
  std::vector<float> y, z, weight;
};

// The signature every gated_rms_norm_{t} kernel must have for its InT.
template <class InT>
using Kernel = void (*)(const device InT*, const device InT*, const device InT*, device InT*,
                        constant GatedRmsNormParams&, uint3, uint);

template <class InT>
void run(const Case& c, Kernel<InT> kernel) {
  const GatedRmsNormParams& p = c.p;
  Buffer<InT> y("y", c.y, Kind::kInput);
  Buffer<InT> z("z", c.z, Kind::kInput);
  Buffer<InT> weight("weight", c.weight, Kind::kInput);
  Buffer<InT> out("out", std::size_t(p.rows) * p.value_dim, Kind::kOutput);
  const GatedRmsNormParams params = p;

  const uint3 groups{1, (p.rows + kRowsPerThreadgroup - 1) / kRowsPerThreadgroup, 1};
  const uint3 per_group{32, kRowsPerThreadgroup, 1};
  metal_emu::dispatch_threadgroups(groups, per_group, [&](const metal_emu::ThreadIds& id) {
    kernel((const device InT*)y.data(), (const device InT*)z.data(), (const device InT*)weight.data(),
           (device InT*)out.data(), *(constant GatedRmsNormParams*)&params, id.thread_position_in_grid,
           id.thread_index_in_simdgroup);
  });

  guarded::check_all(y, z, weight, out);
  out.write_f32();
}

}  // namespace

int main() {
  const auto h = guarded::start<7>("gated_rms_norm_harness", "GRNEMU01");
  const float eps = guarded::read_f32_word();
  const std::uint32_t type = h[0], batch = h[1], tokens = h[2], heads = h[3], dim = h[4];
  Case c;
  c.batch = batch;
  c.p = GatedRmsNormParams{batch * tokens * heads, tokens, heads, dim, h[5], h[6], eps};
  const GatedRmsNormParams& p = c.p;
  if (p.rows == 0 || dim == 0) guarded::die("the host launches nothing for an empty y");
  const std::size_t row_len = std::size_t(heads) * dim;
  if ((tokens > 1 && p.z_token_stride < row_len) || (batch > 1 && p.z_batch_stride < std::size_t(tokens - 1) * p.z_token_stride + row_len)) {
    guarded::die("z's tokens must not overlap");
  }
  c.y = guarded::read_raw<float>(std::size_t(p.rows) * dim);
  c.z = guarded::read_raw<float>(std::size_t(batch - 1) * p.z_batch_stride + std::size_t(tokens - 1) * p.z_token_stride + row_len);
  c.weight = guarded::read_raw<float>(dim);
  guarded::expect_end();

  guarded::by_type(type, gated_rms_norm_f32, gated_rms_norm_f16, gated_rms_norm_bf16,
                   [&](auto t, auto kernel) { run<typename decltype(t)::type>(c, kernel); });
  return guarded::finish();
}
