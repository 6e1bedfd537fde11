// Runs the shipped kernels/gated_delta_norm.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/gated_delta_norm_emulation.rs.
//
// stdin, little-endian: "GDNNEMU1", then u32 batch, steps, key_heads, value_heads, key_dim,
// value_dim, in_type (0 f32, 1 f16, 2 bf16), state_type (0 f32, 1 bf16), simdgroups S,
// z_batch_stride, z_token_stride, sigmoid_gate (0 silu, 1 sigmoid); f32 eps; then f32 arrays q, k [B,T,Hk,Dk], v [B,T,Hv,Dv],
// g, beta [B,T,Hv], state [B,Hv,Dv,Dk], z (a view: (B-1)*z_batch_stride +
// (T-1)*z_token_stride + Hv*Dv values, the gaps NaN), weight [Dv]. Inputs are converted to
// the instantiation's InT / StT here (exactly, when the caller already rounded them).
// stdout: f32 arrays out [B,T,Hv,Dv] and the final state [B,Hv,Dv,Dk].
//
// The launch geometry is crates/gdn-ops/src/ops/gated_delta_norm/metal.rs's: threadgroups
// (B*Hv, 1, 1) of (32, S, 1) threads, 2*S floats of threadgroup memory rounded up to 16
// bytes; S is the caller's, so that several are tested. Memory checks: guarded_buffer.h.

#include "guarded_buffer.h"
#include "gdn_case.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "metal_math.h"

#include "../gated_delta_norm.metal"

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  GdnNormParams p;
  uint simdgroups;
  std::vector<float> q, k, v, g, beta, state, z, weight;
};

// The signature every gated_delta_norm_{in}_{st} kernel must have for its InT and StT.
template <class InT, class StT>
using Kernel = void (*)(const device InT*, const device InT*, const device InT*, const device float*,
                        const device float*, device StT*, const device InT*, const device InT*, device InT*,
                        constant GdnNormParams&, threadgroup float*, uint3, uint3, uint, uint);

template <class InT, class StT>
void run(const Case& c, Kernel<InT, StT> kernel) {
  const GdnNormParams& p = c.p;
  auto in = gdn_case::step_buffers<InT>(c);
  Buffer<StT> state("state", c.state, Kind::kInPlace);
  Buffer<InT> z("z", c.z, Kind::kInput);
  Buffer<InT> weight("weight", c.weight, Kind::kInput);
  Buffer<InT> out("out", std::size_t(p.batch) * p.steps * p.value_heads * p.value_dim, Kind::kOutput);
  const GdnNormParams params = p;

  const std::size_t bytes = (2 * c.simdgroups * sizeof(float) + 15) / 16 * 16;
  const uint3 groups{p.batch * p.value_heads, 1, 1};
  const uint3 per_group{32, c.simdgroups, 1};
  metal_emu::dispatch_threadgroups(groups, per_group, bytes, [&](const metal_emu::ThreadIds& id) {
    kernel((const device InT*)in.q.data(), (const device InT*)in.k.data(), (const device InT*)in.v.data(),
           (const device float*)in.g.data(), (const device float*)in.beta.data(), (device StT*)state.data(),
           (const device InT*)z.data(), (const device InT*)weight.data(), (device InT*)out.data(),
           *(constant GdnNormParams*)&params, id.threadgroup_memory_as<float>(), id.threadgroup_position_in_grid,
           id.threads_per_threadgroup, id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup);
  });

  guarded::check_all(in.q, in.k, in.v, in.g, in.beta, state, z, weight, out);
  out.write_f32();
  state.write_f32();
}

}  // namespace

int main() {
  const auto h = guarded::start<12>("gated_delta_norm_harness", "GDNNEMU1");
  const float eps = guarded::read_f32_word();
  Case c;
  c.p = GdnNormParams{h[0], h[1], h[2], h[3], h[4], h[5], h[9], h[10], eps, h[11]};
  if (h[11] > 1) guarded::die("sigmoid_gate must be 0 or 1");
  const std::uint32_t in_type = h[6], st_type = h[7];
  c.simdgroups = h[8];
  const GdnNormParams& p = c.p;
  // The host side's contract (ops/gated_delta_norm checks it).
  if (p.key_dim == 0 || p.key_dim % 32 != 0 || p.key_dim > 256) guarded::die("key_dim must be a multiple of 32, at most 256");
  if (p.key_heads == 0 || p.value_heads % p.key_heads != 0) guarded::die("value_heads must be a multiple of key_heads");
  if (c.simdgroups == 0 || c.simdgroups > 32 || (p.value_dim + c.simdgroups - 1) / c.simdgroups > 8) {
    guarded::die("1 to 32 simdgroups of at most 8 rows each");
  }
  if (p.batch == 0 || p.steps == 0 || p.value_dim == 0) guarded::die("the host launches nothing for an empty call");
  const std::size_t bt = std::size_t(p.batch) * p.steps;
  const std::size_t row = std::size_t(p.value_heads) * p.value_dim;
  c.q = guarded::read_raw<float>(bt * p.key_heads * p.key_dim);
  c.k = guarded::read_raw<float>(bt * p.key_heads * p.key_dim);
  c.v = guarded::read_raw<float>(bt * row);
  c.g = guarded::read_raw<float>(bt * p.value_heads);
  c.beta = guarded::read_raw<float>(bt * p.value_heads);
  c.state = guarded::read_raw<float>(std::size_t(p.batch) * row * p.key_dim);
  c.z = guarded::read_raw<float>(std::size_t(p.batch - 1) * p.z_batch_stride + std::size_t(p.steps - 1) * p.z_token_stride + row);
  c.weight = guarded::read_raw<float>(p.value_dim);
  guarded::expect_end();

  switch (in_type * 2 + st_type) {
    case 0: run<float, float>(c, gated_delta_norm_f32_f32); break;
    case 1: run<float, bfloat>(c, gated_delta_norm_f32_bf16); break;
    case 2: run<half, float>(c, gated_delta_norm_f16_f32); break;
    case 3: run<half, bfloat>(c, gated_delta_norm_f16_bf16); break;
    case 4: run<bfloat, float>(c, gated_delta_norm_bf16_f32); break;
    case 5: run<bfloat, bfloat>(c, gated_delta_norm_bf16_bf16); break;
    default: guarded::die("unknown in_type / state_type");
  }
  return guarded::finish();
}
