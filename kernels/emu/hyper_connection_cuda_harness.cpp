// Runs the bodies of the shipped kernels/hyper_connection.cu on the CPU through
// kernels/emu/cuda/cuda_emu.h, with the launch geometries of
// crates/gdn-ops/src/ops/hyper_connection/cuda.rs: hc_inject_norm (inject_norm_body) one block
// a stream row of the given threads, 32 floats of shared memory for the block sum; hc_up_mix
// (up_mix_body) blocks of threads / 32 warps, one output value a warp, grid (ceil(H / warps),
// N), R floats of shared memory (NaN before each block). Used by
// crates/gdn-ops/tests/hyper_connection_emulation.rs.
//
// hc_inject_norm_cluster (kernel 4, inject_norm_cluster_body) a row over kClusterBlocks blocks
// of the given threads (the host's inject_cluster_threads), 32 floats of shared memory a
// block; the emulator runs no clusters, so the blocks' partial sums of squares are exchanged
// as distributed shared memory would, over two passes of the grid: the first records each
// block's partial (its outputs, normalised by the partial alone, are all written again), the
// second gives every block the row's partials in rank order (in_rank_order, the kernel's
// sum) and checks that the block's own partial came out as in the first. What this leaves
// unchecked is the cluster API alone: __cluster_dims__, this_cluster().sync(),
// map_shared_rank and the arrive/wait that keeps a block's shared memory alive.
//
// stdin and stdout: those of kernels/emu/hyper_connection_harness.cpp (the Metal kernels'), so
// that one test drives both; kernels 0 (hc_inject_norm), 3 (hc_up_mix) and 4 only (hc_act
// and hc_mix are one value a thread: nothing a warp shares).
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        kernels/emu/hyper_connection_cuda_harness.cpp

#include "guarded_buffer.h"

#include <limits>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

// The emulator runs no thread-block clusters: the cluster entry points are left out (their
// column work is inject_norm_cols, which the one-block body runs here).
#define HYPER_CONNECTION_NO_CLUSTER
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

template <class T>
void run_inject_cluster(const Case& c) {
  hyper_connection_case::Inject<T> b(c);
  constexpr uint kBlocks = hyper_connection::kClusterBlocks;
  const std::size_t rows = b.rows(c);
  BlockShared shared(32);
  std::vector<float> partials(rows * kBlocks, std::numeric_limits<float>::quiet_NaN());
  for (int pass = 0; pass < 2; ++pass) {
    metal_emu::dispatch_threadgroups(uint3{uint(rows * kBlocks), 1, 1}, uint3{c.threads, 1, 1}, [&](const metal_emu::ThreadIds& id) {
      shared.poison(id);
      const uint block = id.threadgroup_position_in_grid.x, tid = id.thread_index_in_threadgroup;
      const float* row_partials = &partials[std::size_t(block / kBlocks) * kBlocks];
      auto row_squares = [&](float own) {
        if (pass == 0) {
          if (tid == 0) partials[block] = own;
          return own;
        }
        if (own != partials[block]) guarded::die("a block's partial sum changed between the passes");
        return hyper_connection::in_rank_order<kBlocks>([&](uint rank) { return row_partials[rank]; });
      };
      hyper_connection::inject_norm_cluster_body<T>(
          b.hs.data(), c.has_inject ? b.y.data() : nullptr, c.has_inject ? b.gate.data() : nullptr,
          c.has_norm ? b.weight.data() : nullptr, c.slots ? b.slot_weights.data() : nullptr,
          c.has_inject ? b.sum.data() : nullptr, c.has_norm ? b.normed.data() : nullptr, b.params, block, tid,
          c.threads, shared.smem, row_squares);
    });
  }
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
  if (c.kernel != 0 && c.kernel != 3 && c.kernel != 4)
    guarded::die("the CUDA harness runs hc_inject_norm, hc_up_mix and hc_inject_norm_cluster");
  guarded::by_code<float, __half, __nv_bfloat16>(c.type, "unknown type", [&](auto t) {
    using T = typename decltype(t)::type;
    if (c.kernel == 0) {
      run_inject<T>(c);
      return;
    }
    if (c.kernel == 4) {
      run_inject_cluster<T>(c);
      return;
    }
    const hyper_connection_case::UpMixShape u = hyper_connection_case::read_up_mix_shape();
    guarded::by_code<float, __half, __nv_bfloat16>(u.scale_type, "unknown scale type", [&](auto s) {
      run_up_mix<T, typename decltype(s)::type>(c, u);
    });
  });
  return guarded::finish();
}
