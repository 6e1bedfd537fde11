// Runs the shipped kernels/hyper_connection.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/hyper_connection_emulation.rs.
//
// stdin, little-endian: "HCONEMU1", u32 kernel (0 hc_inject_norm, 1 hc_mix, 2 hc_act, 3 hc_up_mix),
// type (0 f32,
// 1 f16, 2 bf16), tokens N, streams S, cols H, has_inject, has_norm, f32 eps, u32 threads per
// threadgroup (hc_inject_norm: the host's row_threads(H); hc_mix, hc_act: MIX_THREADS), slots K
// (hc_inject_norm: y from K slot outputs, 0 for y itself); then f32
// values converted to the instantiation's type here (exactly, when the caller rounded them);
// hc_up_mix has 4 more u32 header words first: the scale type (0 f32, 1 f16, 2 bf16), rank R,
// bits and group size:
//   hc_inject_norm: hs [N, S, H], y [N, H] (K = 0) or [N, K, H] and gate [N, S] (if
//                   has_inject), weight [S, H] (f32, if has_norm), slot weights [N, K] (f32, if
//                   K > 0);
//   hc_mix:         up [N, S, H], normed [N, S, H];
//   hc_act:         d [N, H] (the down product's output, R = H here);
//   hc_up_mix:      u32 packed words [S * H, R * bits / 32], f32 scales and biases
//                   [S * H, R / group] (converted to the scale type), d [N, R], normed [N, S, H].
// stdout: hc_inject_norm: f32 sum [N, S, H] (if has_inject), then normed [N, S, H] (if
// has_norm); hc_mix and hc_up_mix: f32 x [N, H]; hc_act: f32 a [N, H].
//
// The launch geometry is crates/gdn-ops/src/ops/hyper_connection/metal.rs's. Unused slots
// are unbound (null): a kernel that touches them faults. Buffers are guarded
// (guarded_buffer.h).
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/hyper_connection_harness.cpp -o hyper_connection_harness

#include "guarded_buffer.h"
#include "metal_math.h"

#include "../hyper_connection.metal"

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  uint tokens, streams, cols, has_inject, has_norm, threads, slots;
  float eps;
};

template <class T>
using InjectKernel = void (*)(const device T*, const device T*, const device T*,
                              const device float*, const device float*, device T*, device T*,
                              constant HcInjectNormParams&, threadgroup float*, uint3, uint, uint3,
                              uint, uint);
template <class T>
using MixKernel = void (*)(const device T*, const device T*, device T*, constant HcMixParams&,
                           uint);

template <class T>
void run_inject(const Case& c, InjectKernel<T> kernel) {
  const std::size_t rows = std::size_t(c.tokens) * c.streams, n = rows * c.cols;
  const std::size_t y_len = std::size_t(c.tokens) * (c.slots ? c.slots : 1) * c.cols;
  const std::size_t slot_len = std::size_t(c.tokens) * c.slots;
  Buffer<T> hs("hs", n, Kind::kInput);
  Buffer<T> y("y", c.has_inject ? y_len : 0, Kind::kInput);
  Buffer<T> gate("gate", c.has_inject ? rows : 0, Kind::kInput);
  Buffer<float> weight("weight", c.has_norm ? std::size_t(c.streams) * c.cols : 0, Kind::kInput);
  Buffer<float> slot_weights("slot_weights", slot_len, Kind::kInput);
  Buffer<T> sum("sum", c.has_inject ? n : 0, Kind::kOutput);
  Buffer<T> normed("normed", c.has_norm ? n : 0, Kind::kOutput);
  hs.fill(guarded::read_raw<float>(n));
  y.fill(guarded::read_raw<float>(c.has_inject ? y_len : 0));
  gate.fill(guarded::read_raw<float>(c.has_inject ? rows : 0));
  weight.fill(guarded::read_raw<float>(c.has_norm ? std::size_t(c.streams) * c.cols : 0));
  slot_weights.fill(guarded::read_raw<float>(slot_len));
  guarded::expect_end();
  const HcInjectNormParams params{c.tokens,   c.streams,   c.cols, c.has_inject,
                                  c.has_norm, c.eps,       c.slots};
  metal_emu::dispatch_threadgroups(
      uint3{uint(rows), 1, 1}, uint3{c.threads, 1, 1}, 32 * sizeof(float),
      [&](const metal_emu::ThreadIds& id) {
        kernel((const device T*)hs.data(), c.has_inject ? (const device T*)y.data() : nullptr,
               c.has_inject ? (const device T*)gate.data() : nullptr,
               c.has_norm ? (const device float*)weight.data() : nullptr,
               c.slots ? (const device float*)slot_weights.data() : nullptr,
               c.has_inject ? (device T*)sum.data() : nullptr,
               c.has_norm ? (device T*)normed.data() : nullptr,
               *(constant HcInjectNormParams*)&params, id.threadgroup_memory_as<float>(),
               id.threadgroup_position_in_grid, id.thread_index_in_threadgroup,
               id.threads_per_threadgroup, id.thread_index_in_simdgroup,
               id.simdgroup_index_in_threadgroup);
      });
  guarded::check_all(hs, y, gate, weight, slot_weights, sum, normed);
  sum.write_f32();
  normed.write_f32();
}

template <class T>
using ActKernel = void (*)(const device T*, device T*, constant HcActParams&, uint);

template <class T>
void run_act(const Case& c, ActKernel<T> kernel) {
  const std::size_t n = std::size_t(c.tokens) * c.cols;
  Buffer<T> d("d", n, Kind::kInput);
  Buffer<T> a("a", n, Kind::kOutput);
  d.fill(guarded::read_raw<float>(n));
  guarded::expect_end();
  const HcActParams params{uint(n), c.streams};
  const uint groups = uint((n + c.threads - 1) / c.threads);
  metal_emu::dispatch_threadgroups(uint3{groups, 1, 1}, uint3{c.threads, 1, 1}, 0,
                                   [&](const metal_emu::ThreadIds& id) {
                                     kernel((const device T*)d.data(), (device T*)a.data(),
                                            *(constant HcActParams*)&params,
                                            id.thread_position_in_grid.x);
                                   });
  guarded::check_all(d, a);
  a.write_f32();
}

template <class T>
void run_mix(const Case& c, MixKernel<T> kernel) {
  const std::size_t n = std::size_t(c.tokens) * c.streams * c.cols;
  const std::size_t out = std::size_t(c.tokens) * c.cols;
  Buffer<T> up("up", n, Kind::kInput);
  Buffer<T> normed("normed", n, Kind::kInput);
  Buffer<T> x("x", out, Kind::kOutput);
  up.fill(guarded::read_raw<float>(n));
  normed.fill(guarded::read_raw<float>(n));
  guarded::expect_end();
  const HcMixParams params{c.tokens, c.streams, c.cols};
  const uint groups = uint((out + c.threads - 1) / c.threads);
  metal_emu::dispatch_threadgroups(uint3{groups, 1, 1}, uint3{c.threads, 1, 1}, 0,
                                   [&](const metal_emu::ThreadIds& id) {
                                     kernel((const device T*)up.data(),
                                            (const device T*)normed.data(), (device T*)x.data(),
                                            *(constant HcMixParams*)&params,
                                            id.thread_position_in_grid.x);
                                   });
  guarded::check_all(up, normed, x);
  x.write_f32();
}

struct UpMixShape {
  uint scale_type, rank, bits, group_size;
};

template <class T, class S>
using UpMixKernel = void (*)(const device uint*, const device S*, const device S*,
                             const device T*, const device T*, device T*,
                             constant HcUpMixParams&, threadgroup float*, uint3, uint, uint3, uint,
                             uint);

template <class T, class S>
void run_up_mix(const Case& c, const UpMixShape& u, UpMixKernel<T, S> kernel) {
  const std::size_t rows = std::size_t(c.streams) * c.cols;
  const std::size_t words = rows * u.rank * u.bits / 32, groups = rows * (u.rank / u.group_size);
  const std::size_t n = std::size_t(c.tokens) * c.streams * c.cols;
  Buffer<uint> packed("packed", words, Kind::kInput);
  Buffer<S> scales("scales", groups, Kind::kInput);
  Buffer<S> biases("biases", groups, Kind::kInput);
  Buffer<T> d("d", std::size_t(c.tokens) * u.rank, Kind::kInput);
  Buffer<T> normed("normed", n, Kind::kInput);
  Buffer<T> x("x", std::size_t(c.tokens) * c.cols, Kind::kOutput);
  packed.fill(guarded::read_raw<std::uint32_t>(words));
  scales.fill(guarded::read_raw<float>(groups));
  biases.fill(guarded::read_raw<float>(groups));
  d.fill(guarded::read_raw<float>(std::size_t(c.tokens) * u.rank));
  normed.fill(guarded::read_raw<float>(n));
  guarded::expect_end();
  const HcUpMixParams params{c.tokens, c.streams, c.cols, u.rank, u.bits, u.group_size};
  const uint warps = c.threads / 32;
  const uint bytes = (u.rank * 4 + 15) / 16 * 16;
  metal_emu::dispatch_threadgroups(
      uint3{(c.cols + warps - 1) / warps, c.tokens, 1}, uint3{c.threads, 1, 1}, bytes,
      [&](const metal_emu::ThreadIds& id) {
        kernel((const device uint*)packed.data(), (const device S*)scales.data(),
               (const device S*)biases.data(), (const device T*)d.data(),
               (const device T*)normed.data(), (device T*)x.data(),
               *(constant HcUpMixParams*)&params, id.threadgroup_memory_as<float>(),
               id.threadgroup_position_in_grid, id.thread_index_in_threadgroup,
               id.threads_per_threadgroup, id.thread_index_in_simdgroup,
               id.simdgroup_index_in_threadgroup);
      });
  guarded::check_all(packed, scales, biases, d, normed, x);
  x.write_f32();
}

// Every (activation, scale) instantiation of hc_up_mix, by their type codes.
void up_mix(const Case& c, uint type) {
  UpMixShape u;
  guarded::read_words(&u.scale_type, 4);
  if (u.scale_type > 2 || type > 2) guarded::die("unknown type");
  if ((u.bits != 2 && u.bits != 4 && u.bits != 8) || u.rank == 0 || u.rank > 8192 ||
      u.group_size == 0 || u.group_size % (32 / u.bits) != 0 || u.rank % u.group_size != 0)
    guarded::die("bad up matrix");
  switch (type * 3 + u.scale_type) {
    case 0: run_up_mix<float, float>(c, u, hc_up_mix_f32_f32); break;
    case 1: run_up_mix<float, half>(c, u, hc_up_mix_f32_f16); break;
    case 2: run_up_mix<float, bfloat>(c, u, hc_up_mix_f32_bf16); break;
    case 3: run_up_mix<half, float>(c, u, hc_up_mix_f16_f32); break;
    case 4: run_up_mix<half, half>(c, u, hc_up_mix_f16_f16); break;
    case 5: run_up_mix<half, bfloat>(c, u, hc_up_mix_f16_bf16); break;
    case 6: run_up_mix<bfloat, float>(c, u, hc_up_mix_bf16_f32); break;
    case 7: run_up_mix<bfloat, half>(c, u, hc_up_mix_bf16_f16); break;
    default: run_up_mix<bfloat, bfloat>(c, u, hc_up_mix_bf16_bf16); break;
  }
}

}  // namespace

int main() {
  const auto h = guarded::start<10>("hyper_connection_harness", "HCONEMU1");
  const std::uint32_t kernel = h[0], type = h[1];
  Case c;
  c.tokens = h[2];
  c.streams = h[3];
  c.cols = h[4];
  c.has_inject = h[5];
  c.has_norm = h[6];
  std::memcpy(&c.eps, &h[7], 4);
  c.threads = h[8];
  c.slots = h[9];
  if (kernel > 3 || type > 2 || c.tokens == 0 || c.streams == 0 || c.cols == 0 ||
      c.has_inject > 1 || c.has_norm > 1)
    guarded::die("bad header");
  if (c.threads == 0 || c.threads % 32 != 0 || c.threads > 1024)
    guarded::die("threads must be whole simdgroups, at most 1024");
  if (kernel == 0) {
    if (c.cols > 8 * c.threads) guarded::die("a row's threads hold 8 columns each");
    if (!c.has_inject && !c.has_norm) guarded::die("neither an injection nor a norm");
    if (c.slots && !c.has_inject) guarded::die("slots without an injection");
    guarded::by_type(type, hc_inject_norm_f32, hc_inject_norm_f16, hc_inject_norm_bf16,
                     [&](auto t, auto k) { run_inject<typename decltype(t)::type>(c, k); });
  } else if (kernel == 3) {
    up_mix(c, type);
  } else if (kernel == 2) {
    guarded::by_type(type, hc_act_f32, hc_act_f16, hc_act_bf16,
                     [&](auto t, auto k) { run_act<typename decltype(t)::type>(c, k); });
  } else {
    guarded::by_type(type, hc_mix_f32, hc_mix_f16, hc_mix_bf16,
                     [&](auto t, auto k) { run_mix<typename decltype(t)::type>(c, k); });
  }
  return guarded::finish();
}
