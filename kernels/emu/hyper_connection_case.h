// One hyper-connection case as kernels/emu/hyper_connection_harness.cpp (the .metal kernels)
// and kernels/emu/hyper_connection_cuda_harness.cpp (the .cu bodies) read it from stdin: the
// header, then each kernel's inputs in guarded buffers of the instantiation's types (the input
// format is in hyper_connection_harness.cpp's header comment). Include after guarded_buffer.h
// and the kernel file (for the parameter structs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hyper_connection_case {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  std::uint32_t kernel, type;
  uint tokens, streams, cols, has_inject, has_norm, threads, slots;
  float eps;
};

// The header of `harness`'s input, checked as both harnesses need it.
inline Case read(const char* harness) {
  const auto h = guarded::start<10>(harness, "HCONEMU1");
  Case c;
  c.kernel = h[0];
  c.type = h[1];
  c.tokens = h[2];
  c.streams = h[3];
  c.cols = h[4];
  c.has_inject = h[5];
  c.has_norm = h[6];
  std::memcpy(&c.eps, &h[7], 4);
  c.threads = h[8];
  c.slots = h[9];
  if (c.kernel > 4 || c.type > 2 || c.tokens == 0 || c.streams == 0 || c.cols == 0 ||
      c.has_inject > 1 || c.has_norm > 1)
    guarded::die("bad header");
  if (c.threads == 0 || c.threads % 32 != 0 || c.threads > 1024)
    guarded::die("threads must be whole simdgroups, at most 1024");
  // Kernel 4: hc_inject_norm_cluster (the CUDA harness only), a row over 8 blocks.
  if (c.kernel == 0 || c.kernel == 4) {
    const uint blocks = c.kernel == 4 ? 8 : 1;
    if ((c.cols + blocks - 1) / blocks > 8 * c.threads) guarded::die("a block's threads hold 8 columns each");
    if (!c.has_inject && !c.has_norm) guarded::die("neither an injection nor a norm");
    if (c.slots && !c.has_inject) guarded::die("slots without an injection");
  }
  return c;
}

// hc_inject_norm's buffers, inputs filled; sum and normed empty where not asked for.
template <class T>
struct Inject {
  Buffer<T> hs, y, gate;
  Buffer<float> weight, slot_weights;
  Buffer<T> sum, normed;
  HcInjectNormParams params;

  explicit Inject(const Case& c)
      : hs("hs", rows(c) * c.cols, Kind::kInput),
        y("y", c.has_inject ? y_len(c) : 0, Kind::kInput),
        gate("gate", c.has_inject ? rows(c) : 0, Kind::kInput),
        weight("weight", c.has_norm ? std::size_t(c.streams) * c.cols : 0, Kind::kInput),
        slot_weights("slot_weights", std::size_t(c.tokens) * c.slots, Kind::kInput),
        sum("sum", c.has_inject ? rows(c) * c.cols : 0, Kind::kOutput),
        normed("normed", c.has_norm ? rows(c) * c.cols : 0, Kind::kOutput),
        params{c.tokens, c.streams, c.cols, c.has_inject, c.has_norm, c.eps, c.slots} {
    hs.fill(guarded::read_raw<float>(hs.size()));
    y.fill(guarded::read_raw<float>(y.size()));
    gate.fill(guarded::read_raw<float>(gate.size()));
    weight.fill(guarded::read_raw<float>(weight.size()));
    slot_weights.fill(guarded::read_raw<float>(slot_weights.size()));
    guarded::expect_end();
  }
  static std::size_t rows(const Case& c) { return std::size_t(c.tokens) * c.streams; }
  static std::size_t y_len(const Case& c) {
    return std::size_t(c.tokens) * (c.slots ? c.slots : 1) * c.cols;
  }
};

// hc_up_mix's shape: the 4 more header words.
struct UpMixShape {
  uint scale_type, rank, bits, group_size;
};

inline UpMixShape read_up_mix_shape() {
  UpMixShape u;
  guarded::read_words(&u.scale_type, 4);
  if (u.scale_type > 2) guarded::die("unknown type");
  if ((u.bits != 2 && u.bits != 4 && u.bits != 8) || u.rank == 0 || u.rank > 8192 ||
      u.group_size == 0 || u.group_size % (32 / u.bits) != 0 || u.rank % u.group_size != 0)
    guarded::die("bad up matrix");
  return u;
}

// hc_up_mix's buffers, inputs filled.
template <class T, class S>
struct UpMix {
  Buffer<std::uint32_t> packed;
  Buffer<S> scales, biases;
  Buffer<T> d, normed, x;
  HcUpMixParams params;

  UpMix(const Case& c, const UpMixShape& u)
      : packed("packed", rows(c) * u.rank * u.bits / 32, Kind::kInput),
        scales("scales", rows(c) * (u.rank / u.group_size), Kind::kInput),
        biases("biases", rows(c) * (u.rank / u.group_size), Kind::kInput),
        d("d", std::size_t(c.tokens) * u.rank, Kind::kInput),
        normed("normed", std::size_t(c.tokens) * rows(c), Kind::kInput),
        x("x", std::size_t(c.tokens) * c.cols, Kind::kOutput),
        params{c.tokens, c.streams, c.cols, u.rank, u.bits, u.group_size} {
    packed.fill(guarded::read_raw<std::uint32_t>(packed.size()));
    scales.fill(guarded::read_raw<float>(scales.size()));
    biases.fill(guarded::read_raw<float>(biases.size()));
    d.fill(guarded::read_raw<float>(d.size()));
    normed.fill(guarded::read_raw<float>(normed.size()));
    guarded::expect_end();
  }
  static std::size_t rows(const Case& c) { return std::size_t(c.streams) * c.cols; }
};

}  // namespace hyper_connection_case
