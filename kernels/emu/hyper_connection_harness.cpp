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

#include "hyper_connection_case.h"

namespace {

using hyper_connection_case::Case;

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
  hyper_connection_case::Inject<T> b(c);
  metal_emu::dispatch_threadgroups(
      uint3{uint(b.rows(c)), 1, 1}, uint3{c.threads, 1, 1}, 32 * sizeof(float),
      [&](const metal_emu::ThreadIds& id) {
        kernel((const device T*)b.hs.data(), c.has_inject ? (const device T*)b.y.data() : nullptr,
               c.has_inject ? (const device T*)b.gate.data() : nullptr,
               c.has_norm ? (const device float*)b.weight.data() : nullptr,
               c.slots ? (const device float*)b.slot_weights.data() : nullptr,
               c.has_inject ? (device T*)b.sum.data() : nullptr,
               c.has_norm ? (device T*)b.normed.data() : nullptr,
               *(constant HcInjectNormParams*)&b.params, id.threadgroup_memory_as<float>(),
               id.threadgroup_position_in_grid, id.thread_index_in_threadgroup,
               id.threads_per_threadgroup, id.thread_index_in_simdgroup,
               id.simdgroup_index_in_threadgroup);
      });
  guarded::check_all(b.hs, b.y, b.gate, b.weight, b.slot_weights, b.sum, b.normed);
  b.sum.write_f32();
  b.normed.write_f32();
}

template <class T>
using ActKernel = void (*)(const device T*, device T*, constant HcActParams&, uint);

template <class T>
void run_act(const Case& c, ActKernel<T> kernel) {
  const std::size_t n = std::size_t(c.tokens) * c.cols;
  guarded::Buffer<T> d("d", n, guarded::Kind::kInput);
  guarded::Buffer<T> a("a", n, guarded::Kind::kOutput);
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
  guarded::Buffer<T> up("up", n, guarded::Kind::kInput);
  guarded::Buffer<T> normed("normed", n, guarded::Kind::kInput);
  guarded::Buffer<T> x("x", out, guarded::Kind::kOutput);
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

template <class T, class S>
using UpMixKernel = void (*)(const device uint*, const device S*, const device S*,
                             const device T*, const device T*, device T*,
                             constant HcUpMixParams&, threadgroup float*, uint3, uint, uint3, uint,
                             uint);

template <class T, class S>
void run_up_mix(const Case& c, const hyper_connection_case::UpMixShape& u,
                UpMixKernel<T, S> kernel) {
  hyper_connection_case::UpMix<T, S> b(c, u);
  const uint warps = c.threads / 32;
  const uint bytes = (u.rank * 4 + 15) / 16 * 16;
  metal_emu::dispatch_threadgroups(
      uint3{(c.cols + warps - 1) / warps, c.tokens, 1}, uint3{c.threads, 1, 1}, bytes,
      [&](const metal_emu::ThreadIds& id) {
        kernel((const device uint*)b.packed.data(), (const device S*)b.scales.data(),
               (const device S*)b.biases.data(), (const device T*)b.d.data(),
               (const device T*)b.normed.data(), (device T*)b.x.data(),
               *(constant HcUpMixParams*)&b.params, id.threadgroup_memory_as<float>(),
               id.threadgroup_position_in_grid, id.thread_index_in_threadgroup,
               id.threads_per_threadgroup, id.thread_index_in_simdgroup,
               id.simdgroup_index_in_threadgroup);
      });
  guarded::check_all(b.packed, b.scales, b.biases, b.d, b.normed, b.x);
  b.x.write_f32();
}

// Every (activation, scale) instantiation of hc_up_mix, by their type codes.
void up_mix(const Case& c) {
  const hyper_connection_case::UpMixShape u = hyper_connection_case::read_up_mix_shape();
  switch (c.type * 3 + u.scale_type) {
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
  const Case c = hyper_connection_case::read("hyper_connection_harness");
  if (c.kernel == 0) {
    guarded::by_type(c.type, hc_inject_norm_f32, hc_inject_norm_f16, hc_inject_norm_bf16,
                     [&](auto t, auto k) { run_inject<typename decltype(t)::type>(c, k); });
  } else if (c.kernel == 3) {
    up_mix(c);
  } else if (c.kernel == 2) {
    guarded::by_type(c.type, hc_act_f32, hc_act_f16, hc_act_bf16,
                     [&](auto t, auto k) { run_act<typename decltype(t)::type>(c, k); });
  } else if (c.kernel == 1) {
    guarded::by_type(c.type, hc_mix_f32, hc_mix_f16, hc_mix_bf16,
                     [&](auto t, auto k) { run_mix<typename decltype(t)::type>(c, k); });
  } else {
    guarded::die("the Metal kernels have no cluster form");
  }
  return guarded::finish();
}
