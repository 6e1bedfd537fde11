// Runs the shipped kernels/gdn_conv_prep.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/gdn_conv_prep_emulation.rs.
//
// stdin, little-endian: "GCPEMU02", then u32 type (0 f32, 1 f16, 2 bf16), batch B, tokens
// S >= 1, Hk, Dk, Hv, Dv, K, then the batch and token strides of qkv, b and a (six u32); f32
// q_scale, k_scale, norm_eps; then f32 arrays qkv, b and a (each spanning its rows at its
// strides), conv_state [B, K-1, C], taps [K, C], dt_bias [Hv], neg_a_exp [Hv], with
// C = 2*Hk*Dk + Hv*Dv. Values between the rows of qkv, b and a (a view's gaps) are whatever
// the caller put there: NaN, so that a read of one poisons a result. Inputs are converted to
// InT here (exactly, when the caller already rounded them).
// stdout: f32 arrays q [B, S, Hk, Dk], k [B, S, Hk, Dk], v [B, S, Hv, Dv], g [B, S, Hv],
// beta [B, S, Hv], conv_state [B, K-1, C] after the chunk.
//
// As the host does: for S = 1 the state is advanced in place (next_state is conv_state), for
// S > 1 conv_state is read-only (a guarded input: a write to it fails the run) and the new
// state goes to its own buffer.
//
// The launch geometry is crates/gdn-ops/src/ops/gdn_conv_prep/metal.rs's
// (SLOTS_PER_THREADGROUP = 4); change both together. Memory checks: guarded_buffer.h.

#include "guarded_buffer.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "metal_math.h"

#include "../gdn_conv_prep.metal"

namespace {

using guarded::Buffer;
using guarded::Kind;

constexpr uint kSlotsPerThreadgroup = 4;

struct Case {
  ConvPrepParams p;
  std::vector<float> qkv, b, a, state, taps, dt_bias, neg_a_exp;
};

// The signature every gdn_conv_prep_{t} kernel must have for its InT: a kernel named for
// another type does not convert to it, and fails to compile.
template <class InT>
using Kernel = void (*)(const device InT*, const device InT*, const device InT*, const device InT*,
                        device InT*, const device InT*, const device float*, const device float*,
                        device InT*, device InT*, device InT*, device float*, device float*,
                        constant ConvPrepParams&, uint3, uint);

template <class InT>
void run(const Case& c, Kernel<InT> kernel) {
  const ConvPrepParams& p = c.p;
  Buffer<InT> qkv("qkv", c.qkv, Kind::kInput);
  Buffer<InT> b("b", c.b, Kind::kInput);
  Buffer<InT> a("a", c.a, Kind::kInput);
  const bool in_place = p.tokens == 1;
  Buffer<InT> state("conv_state", c.state, in_place ? Kind::kInPlace : Kind::kInput);
  Buffer<InT> fresh("next_state", in_place ? 0 : c.state.size(), Kind::kOutput);
  Buffer<InT>& next = in_place ? state : fresh;
  Buffer<InT> taps("taps", c.taps, Kind::kInput);
  Buffer<float> dt_bias("dt_bias", c.dt_bias, Kind::kInput);
  Buffer<float> neg_a_exp("neg_a_exp", c.neg_a_exp, Kind::kInput);
  const std::size_t rows = std::size_t(p.batch) * p.tokens;
  const std::size_t qk = rows * p.key_heads * p.key_dim;
  const std::size_t gates = rows * p.value_heads;
  Buffer<InT> q("q", qk, Kind::kOutput);
  Buffer<InT> k("k", qk, Kind::kOutput);
  Buffer<InT> v("v", gates * p.value_dim, Kind::kOutput);
  Buffer<float> g("g", gates, Kind::kOutput);
  Buffer<float> beta("beta", gates, Kind::kOutput);
  const ConvPrepParams params = p;

  const uint slots = 2 * p.key_heads + p.value_heads;
  const uint3 groups{p.tokens, (slots + kSlotsPerThreadgroup - 1) / kSlotsPerThreadgroup, p.batch};
  const uint3 per_group{32, kSlotsPerThreadgroup, 1};
  metal_emu::dispatch_threadgroups(groups, per_group, [&](const metal_emu::ThreadIds& id) {
    kernel((const device InT*)qkv.data(), (const device InT*)b.data(), (const device InT*)a.data(),
           (const device InT*)state.data(), (device InT*)next.data(), (const device InT*)taps.data(), (const device float*)dt_bias.data(),
           (const device float*)neg_a_exp.data(), (device InT*)q.data(), (device InT*)k.data(),
           (device InT*)v.data(), (device float*)g.data(), (device float*)beta.data(),
           *(constant ConvPrepParams*)&params, id.thread_position_in_grid, id.thread_index_in_simdgroup);
  });

  guarded::check_all(qkv, b, a, state);
  if (!in_place) fresh.check();
  guarded::check_all(taps, dt_bias, neg_a_exp, q, k, v, g, beta);
  q.write_f32();
  k.write_f32();
  v.write_f32();
  g.write_f32();
  beta.write_f32();
  next.write_f32();
}

// Elements a view of [batch, tokens] rows of `len` values at these strides spans.
std::size_t span(uint batch, uint tokens, uint batch_stride, uint token_stride, uint len) {
  if (batch == 0 || tokens == 0) return 0;
  return std::size_t(batch - 1) * batch_stride + std::size_t(tokens - 1) * token_stride + len;
}

}  // namespace

int main() {
  const auto h = guarded::start<14>("gdn_conv_prep_harness", "GCPEMU02");
  float scales[3];
  if (std::fread(scales, sizeof(float), 3, stdin) != 3) guarded::die("short header");
  Case c;
  const std::uint32_t type = h[0];
  c.p = ConvPrepParams{h[1], h[2], h[3],  h[4],  h[5],  h[6],      h[7],      h[8],
                       h[9], h[10], h[11], h[12], h[13], scales[0], scales[1], scales[2]};
  const ConvPrepParams& p = c.p;
  // The host side's contract (ops/gdn_conv_prep checks it).
  auto dim_ok = [](uint d) { return d != 0 && d % 32 == 0 && d <= 256; };
  if (!dim_ok(p.key_dim) || !dim_ok(p.value_dim)) guarded::die("head dims must be multiples of 32 up to 256");
  if (p.key_heads == 0 || p.value_heads % p.key_heads != 0) guarded::die("value_heads must be a multiple of key_heads");
  if (p.kernel_size < 2 || p.kernel_size > 8) guarded::die("kernel_size must be 2 to 8");
  const uint channels = 2 * p.key_heads * p.key_dim + p.value_heads * p.value_dim;
  if (p.tokens == 0) guarded::die("the host launches nothing for an empty chunk");
  // Rows must not overlap: tokens inside a batch row, batch rows after all their tokens.
  auto rows_ok = [&](uint batch_stride, uint token_stride, uint len) {
    return (p.tokens == 1 || token_stride >= len) &&
           (p.batch == 1 || batch_stride >= std::size_t(p.tokens - 1) * token_stride + len);
  };
  if (!rows_ok(p.qkv_batch_stride, p.qkv_token_stride, channels) ||
      !rows_ok(p.b_batch_stride, p.b_token_stride, p.value_heads) ||
      !rows_ok(p.a_batch_stride, p.a_token_stride, p.value_heads)) {
    guarded::die("rows must not overlap");
  }
  c.qkv = guarded::read_raw<float>(span(p.batch, p.tokens, p.qkv_batch_stride, p.qkv_token_stride, channels));
  c.b = guarded::read_raw<float>(span(p.batch, p.tokens, p.b_batch_stride, p.b_token_stride, p.value_heads));
  c.a = guarded::read_raw<float>(span(p.batch, p.tokens, p.a_batch_stride, p.a_token_stride, p.value_heads));
  c.state = guarded::read_raw<float>(std::size_t(p.batch) * (p.kernel_size - 1) * channels);
  c.taps = guarded::read_raw<float>(std::size_t(p.kernel_size) * channels);
  c.dt_bias = guarded::read_raw<float>(p.value_heads);
  c.neg_a_exp = guarded::read_raw<float>(p.value_heads);
  guarded::expect_end();

  guarded::by_type(type, gdn_conv_prep_f32, gdn_conv_prep_f16, gdn_conv_prep_bf16,
                   [&](auto t, auto kernel) { run<typename decltype(t)::type>(c, kernel); });
  return guarded::finish();
}
