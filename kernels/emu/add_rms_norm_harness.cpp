// Runs the shipped kernels/add_rms_norm.metal on the CPU through metal_emu.h. Used by
// crates/gdn-ops/tests/add_rms_norm_emulation.rs.
//
// stdin, little-endian: "ARMSEMU1", u32 type (0 f32, 1 f16, 2 bf16), rows N, cols H,
// has_delta, f32 eps, u32 threads per threadgroup (the host's row_threads(H)); then f32 residual [N, H], delta [N, H] (if has_delta), weight [H],
// converted to the instantiation's type here (exactly, when the caller rounded them).
// stdout: f32 normed [N, H], then sum [N, H] if has_delta.
//
// The launch geometry is crates/gdn-ops/src/ops/add_rms_norm/metal.rs's: threadgroups
// (N, 1, 1) of (threads, 1, 1) threads, 32 floats of threadgroup memory. Without a delta the delta and sum slots are unbound
// (null): a kernel that touches them faults. Buffers are guarded (guarded_buffer.h).
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/add_rms_norm_harness.cpp -o add_rms_norm_harness

#include "guarded_buffer.h"
#include "metal_math.h"

#include "../add_rms_norm.metal"

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case {
  uint rows, cols, has_delta, threads;
  float eps;
  std::vector<float> residual, delta, weight;
};

template <class T>
using Kernel = void (*)(const device T*, const device T*, const device T*, device T*, device T*,
                        constant AddRmsNormParams&, threadgroup float*, uint3, uint, uint3, uint, uint);

template <class T>
void run(const Case& c, Kernel<T> kernel) {
  const std::size_t n = std::size_t(c.rows) * c.cols;
  Buffer<T> residual("residual", n, Kind::kInput);
  Buffer<T> delta("delta", c.has_delta ? n : 0, Kind::kInput);
  Buffer<T> weight("weight", c.cols, Kind::kInput);
  Buffer<T> sum("sum", c.has_delta ? n : 0, Kind::kOutput);
  Buffer<T> normed("normed", n, Kind::kOutput);
  residual.fill(c.residual);
  delta.fill(c.delta);
  weight.fill(c.weight);
  const AddRmsNormParams params{c.rows, c.cols, c.has_delta, c.eps};
  metal_emu::dispatch_threadgroups(uint3{c.rows, 1, 1}, uint3{c.threads, 1, 1}, 32 * sizeof(float), [&](const metal_emu::ThreadIds& id) {
    kernel((const device T*)residual.data(), c.has_delta ? (const device T*)delta.data() : nullptr,
           (const device T*)weight.data(), c.has_delta ? (device T*)sum.data() : nullptr,
           (device T*)normed.data(), *(constant AddRmsNormParams*)&params, id.threadgroup_memory_as<float>(),
           id.threadgroup_position_in_grid, id.thread_index_in_threadgroup, id.threads_per_threadgroup,
           id.thread_index_in_simdgroup, id.simdgroup_index_in_threadgroup);
  });
  guarded::check_all(residual, delta, weight, sum, normed);
  normed.write_f32();
  sum.write_f32();
}

}  // namespace

int main() {
  const auto h = guarded::start<6>("add_rms_norm_harness", "ARMSEMU1");
  Case c;
  const std::uint32_t type = h[0];
  c.rows = h[1];
  c.cols = h[2];
  c.has_delta = h[3];
  std::memcpy(&c.eps, &h[4], 4);
  c.threads = h[5];
  if (c.has_delta > 1 || type > 2 || c.rows == 0 || c.cols == 0) guarded::die("bad header");
  if (c.threads == 0 || c.threads % 32 != 0 || c.threads > 1024 || c.cols > 8 * c.threads)
    guarded::die("threads must be whole simdgroups, at most 1024, holding 8 columns each");
  const std::size_t n = std::size_t(c.rows) * c.cols;
  c.residual = guarded::read_raw<float>(n);
  c.delta = guarded::read_raw<float>(c.has_delta ? n : 0);
  c.weight = guarded::read_raw<float>(c.cols);
  guarded::expect_end();
  guarded::by_type(type, add_rms_norm_f32, add_rms_norm_f16, add_rms_norm_bf16,
                   [&](auto t, auto kernel) { run<typename decltype(t)::type>(c, kernel); });
  return guarded::finish();
}
