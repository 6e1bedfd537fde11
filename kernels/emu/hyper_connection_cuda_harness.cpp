// Runs the bodies of the shipped kernels/hyper_connection.cu on the CPU through
// kernels/emu/cuda/cuda_emu.h, with the launch geometries of
// crates/gdn-ops/src/ops/hyper_connection/cuda.rs: hc_inject_norm (inject_norm_body) one block
// a stream row of the given threads, 32 floats of shared memory for the block sum; hc_up_mix
// (up_mix_body) blocks of threads / 32 warps, one output value a warp, grid (ceil(H / warps),
// N), R floats of shared memory (NaN before each block). Used by
// crates/gdn-ops/tests/hyper_connection_emulation.rs.
//
// stdin and stdout: those of kernels/emu/hyper_connection_harness.cpp (the Metal kernels'), so
// that one test drives both; kernels 0 (hc_inject_norm) and 3 (hc_up_mix) only (hc_act and
// hc_mix are one value a thread: nothing a warp shares).
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        kernels/emu/hyper_connection_cuda_harness.cpp

#include "guarded_buffer.h"

#include <cstdint>
#include <cstring>

#include "cuda_emu.h"
#include "block_shared.h"

#include "../hyper_connection.cu"

// The entry points' extern __shared__ array: never used here (the bodies get BlockShared's).
namespace hyper_connection {
alignas(16) float hc_up_mix_act[1];
}

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  uint tokens, streams, cols, has_inject, has_norm, threads, slots;
  float eps;
};

template <class T>
void run_inject(const Case& c) {
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
  const HcInjectNormParams p{c.tokens, c.streams, c.cols, c.has_inject, c.has_norm, c.eps, c.slots};
  BlockShared shared(32);
  metal_emu::dispatch_threadgroups(uint3{uint(rows), 1, 1}, uint3{c.threads, 1, 1}, [&](const metal_emu::ThreadIds& id) {
    shared.poison(id);
    hyper_connection::inject_norm_body<T>(
        hs.data(), c.has_inject ? y.data() : nullptr, c.has_inject ? gate.data() : nullptr,
        c.has_norm ? weight.data() : nullptr, c.slots ? slot_weights.data() : nullptr,
        c.has_inject ? sum.data() : nullptr, c.has_norm ? normed.data() : nullptr, p,
        id.threadgroup_position_in_grid.x, id.thread_index_in_threadgroup, c.threads, shared.smem);
  });
  guarded::check_all(hs, y, gate, weight, slot_weights, sum, normed, shared);
  sum.write_f32();
  normed.write_f32();
}

struct UpMixShape {
  uint scale_type, rank, bits, group_size;
};

template <class T, class S>
void run_up_mix(const Case& c, const UpMixShape& u) {
  const std::size_t rows = std::size_t(c.streams) * c.cols;
  const std::size_t words = rows * u.rank * u.bits / 32, groups = rows * (u.rank / u.group_size);
  const std::size_t n = std::size_t(c.tokens) * c.streams * c.cols;
  Buffer<uint32_t> packed("packed", words, Kind::kInput);
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
  const HcUpMixParams p{c.tokens, c.streams, c.cols, u.rank, u.bits, u.group_size};
  const uint warps = c.threads / 32;
  BlockShared shared(u.rank);
  metal_emu::dispatch_threadgroups(
      uint3{(c.cols + warps - 1) / warps, c.tokens, 1}, uint3{c.threads, 1, 1}, [&](const metal_emu::ThreadIds& id) {
        shared.poison(id);
        const uint j = id.threadgroup_position_in_grid.x * warps + id.simdgroup_index_in_threadgroup;
        hyper_connection::up_mix_body<T, S>(packed.data(), scales.data(), biases.data(), d.data(), normed.data(),
                                            x.data(), p, id.threadgroup_position_in_grid.y, j,
                                            id.thread_index_in_threadgroup, c.threads,
                                            id.thread_index_in_simdgroup, shared.smem);
      });
  guarded::check_all(packed, scales, biases, d, normed, x, shared);
  x.write_f32();
}

// Every (activation, scale) pair of hc_up_mix, by their type codes.
void up_mix(const Case& c, uint type) {
  UpMixShape u;
  guarded::read_words(&u.scale_type, 4);
  if ((u.bits != 2 && u.bits != 4 && u.bits != 8) || u.rank == 0 || u.rank > 8192 ||
      u.group_size == 0 || u.group_size % (32 / u.bits) != 0 || u.rank % u.group_size != 0)
    guarded::die("bad up matrix");
  guarded::by_code<float, __half, __nv_bfloat16>(type, "unknown type", [&](auto t) {
    guarded::by_code<float, __half, __nv_bfloat16>(u.scale_type, "unknown scale type", [&](auto s) {
      run_up_mix<typename decltype(t)::type, typename decltype(s)::type>(c, u);
    });
  });
}

}  // namespace

int main() {
  const auto h = guarded::start<10>("hyper_connection_cuda_harness", "HCONEMU1");
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
  if ((kernel != 0 && kernel != 3) || c.tokens == 0 || c.streams == 0 || c.cols == 0 ||
      c.has_inject > 1 || c.has_norm > 1)
    guarded::die("bad header (the CUDA harness runs hc_inject_norm and hc_up_mix)");
  if (c.threads == 0 || c.threads % 32 != 0 || c.threads > 1024)
    guarded::die("threads must be whole warps, at most 1024");
  if (kernel == 0) {
    if (c.cols > 8 * c.threads) guarded::die("a row's threads hold 8 columns each");
    if (!c.has_inject && !c.has_norm) guarded::die("neither an injection nor a norm");
    if (c.slots && !c.has_inject) guarded::die("slots without an injection");
    guarded::by_code<float, __half, __nv_bfloat16>(type, "unknown type",
                                                   [&](auto t) { run_inject<typename decltype(t)::type>(c); });
  } else {
    up_mix(c, type);
  }
  return guarded::finish();
}
