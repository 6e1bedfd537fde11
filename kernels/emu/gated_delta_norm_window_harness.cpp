// Runs the shipped window entries of kernels/gated_delta_norm.metal (gated_delta_norm_window_*)
// on the CPU through metal_emu.h, and on the same inputs T one-token launches of the plain
// entries (gated_delta_norm_*), as the per-token verify window runs them. Used by
// crates/gdn-ops/tests/gated_delta_norm_window_emulation.rs, which holds the two bit for bit.
//
// stdin: gated_delta_norm_harness.cpp's, with the magic "GDNWEMU1" (T >= 2).
// stdout, f32 arrays: the window launch's out [B,T,Hv,Dv], after [T-1,B,Hv,Dv,Dk] and final
// state [B,Hv,Dv,Dk]; then the one-token launches' out [B,T,Hv,Dv] and the state after each
// token [T,B,Hv,Dv,Dk].
//
// The launch geometry is crates/gdn-ops/src/ops/gated_delta_norm/metal.rs's `launch` (the plain
// op's, `after` at buffer 9): threadgroups (B*Hv, 1, 1) of (32, S, 1) threads, 2*S floats of
// threadgroup memory rounded up to 16 bytes; S is the caller's. Memory checks: guarded_buffer.h.

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

template <class InT, class StT>
using Plain = void (*)(const device InT*, const device InT*, const device InT*, const device float*,
                       const device float*, device StT*, const device InT*, const device InT*, device InT*,
                       constant GdnNormParams&, threadgroup float*, uint3, uint3, uint, uint);
template <class InT, class StT>
using Window = void (*)(const device InT*, const device InT*, const device InT*, const device float*,
                        const device float*, device StT*, const device InT*, const device InT*, device InT*,
                        device StT*, constant GdnNormParams&, threadgroup float*, uint3, uint3, uint, uint);

// One launch over the case's tokens on `state` (and `after` for the window entry): the
// output, the inputs' guards checked.
template <class InT, class StT, class Launch>
std::vector<float> launch(const Case& c, Buffer<StT>& state, Launch&& kernel) {
  const GdnNormParams& p = c.p;
  auto in = gdn_case::step_buffers<InT>(c);
  Buffer<InT> z("z", c.z, Kind::kInput);
  Buffer<InT> weight("weight", c.weight, Kind::kInput);
  Buffer<InT> out("out", std::size_t(p.batch) * p.steps * p.value_heads * p.value_dim, Kind::kOutput);
  const std::size_t bytes = (2 * c.simdgroups * sizeof(float) + 15) / 16 * 16;
  const uint3 groups{p.batch * p.value_heads, 1, 1};
  const uint3 per_group{32, c.simdgroups, 1};
  metal_emu::dispatch_threadgroups(groups, per_group, bytes, [&](const metal_emu::ThreadIds& id) {
    kernel((const device InT*)in.q.data(), (const device InT*)in.k.data(), (const device InT*)in.v.data(),
           (const device float*)in.g.data(), (const device float*)in.beta.data(), (device StT*)state.data(),
           (const device InT*)z.data(), (const device InT*)weight.data(), (device InT*)out.data(),
           id.threadgroup_memory_as<float>(), id);
  });
  guarded::check_all(in.q, in.k, in.v, in.g, in.beta, state, z, weight, out);
  std::vector<float> values(out.size());
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(out.data()[i]);
  return values;
}

template <class T>
std::vector<float> floats(Buffer<T>& b) {
  std::vector<float> values(b.size());
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(b.data()[i]);
  return values;
}

void write(const std::vector<float>& v) {
  if (!v.empty() && std::fwrite(v.data(), sizeof(float), v.size(), stdout) != v.size()) guarded::die("short write");
}

// Token t of [B, T, n] values, as [B, 1, n].
std::vector<float> token(const std::vector<float>& x, uint batch, uint steps, uint t, std::size_t n) {
  std::vector<float> out;
  for (uint b = 0; b < batch; ++b) {
    const float* at = x.data() + (std::size_t(b) * steps + t) * n;
    out.insert(out.end(), at, at + n);
  }
  return out;
}

template <class InT, class StT>
void run(const Case& c, Window<InT, StT> window, Plain<InT, StT> plain) {
  const GdnNormParams& p = c.p;
  const std::size_t row = std::size_t(p.value_heads) * p.value_dim;
  const std::size_t state_len = std::size_t(p.batch) * row * p.key_dim;

  // The window entry over the T tokens.
  Buffer<StT> state("state", c.state, Kind::kInPlace);
  Buffer<StT> after("after", (p.steps - 1) * state_len, Kind::kOutput);
  const GdnNormParams params = p;
  const auto out = launch<InT, StT>(c, state, [&](auto q, auto k, auto v, auto g, auto beta, auto s, auto z,
                                                  auto w, auto o, threadgroup float* tg, const auto& id) {
    window(q, k, v, g, beta, s, z, w, o, (device StT*)after.data(), *(constant GdnNormParams*)&params, tg,
           id.threadgroup_position_in_grid, id.threads_per_threadgroup, id.simdgroup_index_in_threadgroup,
           id.thread_index_in_simdgroup);
  });
  guarded::check_all(after);
  write(out);
  write(floats(after));
  write(floats(state));

  // T one-token launches of the plain entry on one state, copied after each.
  Buffer<StT> steps_state("state", c.state, Kind::kInPlace);
  std::vector<float> steps_out(out.size()), states;
  for (uint t = 0; t < p.steps; ++t) {
    Case one = c;
    one.p.steps = 1;
    one.p.z_batch_stride = row;
    one.p.z_token_stride = row;
    const std::size_t qk = std::size_t(p.key_heads) * p.key_dim;
    one.q = token(c.q, p.batch, p.steps, t, qk);
    one.k = token(c.k, p.batch, p.steps, t, qk);
    one.v = token(c.v, p.batch, p.steps, t, row);
    one.g = token(c.g, p.batch, p.steps, t, p.value_heads);
    one.beta = token(c.beta, p.batch, p.steps, t, p.value_heads);
    one.z.clear();
    for (uint b = 0; b < p.batch; ++b) {
      const float* at = c.z.data() + std::size_t(b) * p.z_batch_stride + std::size_t(t) * p.z_token_stride;
      one.z.insert(one.z.end(), at, at + row);
    }
    const GdnNormParams one_params = one.p;
    const auto y = launch<InT, StT>(one, steps_state, [&](auto q, auto k, auto v, auto g, auto beta, auto s,
                                                          auto z, auto w, auto o, threadgroup float* tg,
                                                          const auto& id) {
      plain(q, k, v, g, beta, s, z, w, o, *(constant GdnNormParams*)&one_params, tg, id.threadgroup_position_in_grid,
            id.threads_per_threadgroup, id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup);
    });
    for (uint b = 0; b < p.batch; ++b) {
      std::copy(y.begin() + b * row, y.begin() + (b + 1) * row, steps_out.begin() + (std::size_t(b) * p.steps + t) * row);
    }
    const auto s = floats(steps_state);
    states.insert(states.end(), s.begin(), s.end());
  }
  write(steps_out);
  write(states);
}

}  // namespace

int main() {
  const auto h = guarded::start<12>("gated_delta_norm_window_harness", "GDNWEMU1");
  const float eps = guarded::read_f32_word();
  Case c;
  c.p = GdnNormParams{h[0], h[1], h[2], h[3], h[4], h[5], h[9], h[10], eps, h[11]};
  if (h[11] > 1) guarded::die("sigmoid_gate must be 0 or 1");
  const std::uint32_t in_type = h[6], st_type = h[7];
  c.simdgroups = h[8];
  const GdnNormParams& p = c.p;
  if (p.key_dim == 0 || p.key_dim % 32 != 0 || p.key_dim > 256) guarded::die("key_dim must be a multiple of 32, at most 256");
  if (p.key_heads == 0 || p.value_heads % p.key_heads != 0) guarded::die("value_heads must be a multiple of key_heads");
  if (c.simdgroups == 0 || c.simdgroups > 32 || (p.value_dim + c.simdgroups - 1) / c.simdgroups > 8) {
    guarded::die("1 to 32 simdgroups of at most 8 rows each");
  }
  if (p.batch == 0 || p.steps < 2 || p.value_dim == 0) guarded::die("a window has two tokens or more");
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
    case 0: run<float, float>(c, gated_delta_norm_window_f32_f32, gated_delta_norm_f32_f32); break;
    case 1: run<float, bfloat>(c, gated_delta_norm_window_f32_bf16, gated_delta_norm_f32_bf16); break;
    case 2: run<half, float>(c, gated_delta_norm_window_f16_f32, gated_delta_norm_f16_f32); break;
    case 3: run<half, bfloat>(c, gated_delta_norm_window_f16_bf16, gated_delta_norm_f16_bf16); break;
    case 4: run<bfloat, float>(c, gated_delta_norm_window_bf16_f32, gated_delta_norm_bf16_f32); break;
    case 5: run<bfloat, bfloat>(c, gated_delta_norm_window_bf16_bf16, gated_delta_norm_bf16_bf16); break;
    default: guarded::die("unknown in_type / state_type");
  }
  return guarded::finish();
}
