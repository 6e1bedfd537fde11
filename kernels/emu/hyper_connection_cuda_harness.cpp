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

#include "cuda_emu.h"
#include "block_shared.h"

#include "../hyper_connection.cu"

// The entry points' extern __shared__ array: never used here (the bodies get BlockShared's).
namespace hyper_connection {
alignas(16) float hc_up_mix_act[1];
}

#include "hyper_connection_case.h"

namespace {

using hyper_connection_case::Case;

template <class T>
void run_inject(const Case& c) {
  hyper_connection_case::Inject<T> b(c);
  BlockShared shared(32);
  metal_emu::dispatch_threadgroups(uint3{uint(b.rows(c)), 1, 1}, uint3{c.threads, 1, 1}, [&](const metal_emu::ThreadIds& id) {
    shared.poison(id);
    hyper_connection::inject_norm_body<T>(
        b.hs.data(), c.has_inject ? b.y.data() : nullptr, c.has_inject ? b.gate.data() : nullptr,
        c.has_norm ? b.weight.data() : nullptr, c.slots ? b.slot_weights.data() : nullptr,
        c.has_inject ? b.sum.data() : nullptr, c.has_norm ? b.normed.data() : nullptr, b.params,
        id.threadgroup_position_in_grid.x, id.thread_index_in_threadgroup, c.threads, shared.smem);
  });
  guarded::check_all(b.hs, b.y, b.gate, b.weight, b.slot_weights, b.sum, b.normed, shared);
  b.sum.write_f32();
  b.normed.write_f32();
}

template <class T, class S>
void run_up_mix(const Case& c, const hyper_connection_case::UpMixShape& u) {
  hyper_connection_case::UpMix<T, S> b(c, u);
  const uint warps = c.threads / 32;
  BlockShared shared(u.rank);
  metal_emu::dispatch_threadgroups(
      uint3{(c.cols + warps - 1) / warps, c.tokens, 1}, uint3{c.threads, 1, 1}, [&](const metal_emu::ThreadIds& id) {
        shared.poison(id);
        const uint j = id.threadgroup_position_in_grid.x * warps + id.simdgroup_index_in_threadgroup;
        hyper_connection::up_mix_body<T, S>(b.packed.data(), b.scales.data(), b.biases.data(), b.d.data(),
                                            b.normed.data(), b.x.data(), b.params, id.threadgroup_position_in_grid.y,
                                            j, id.thread_index_in_threadgroup, c.threads,
                                            id.thread_index_in_simdgroup, shared.smem);
      });
  guarded::check_all(b.packed, b.scales, b.biases, b.d, b.normed, b.x, shared);
  b.x.write_f32();
}

}  // namespace

int main() {
  const Case c = hyper_connection_case::read("hyper_connection_cuda_harness");
  if (c.kernel != 0 && c.kernel != 3) guarded::die("the CUDA harness runs hc_inject_norm and hc_up_mix");
  guarded::by_code<float, __half, __nv_bfloat16>(c.type, "unknown type", [&](auto t) {
    using T = typename decltype(t)::type;
    if (c.kernel == 0) {
      run_inject<T>(c);
      return;
    }
    const hyper_connection_case::UpMixShape u = hyper_connection_case::read_up_mix_shape();
    guarded::by_code<float, __half, __nv_bfloat16>(u.scale_type, "unknown scale type", [&](auto s) {
      run_up_mix<T, typename decltype(s)::type>(c, u);
    });
  });
  return guarded::finish();
}
