// Runs the bodies of the shipped kernels/gated_delta_chunk.cu (gdn_chunk::{prep,state,out}_kernel,
// one pass after the other) on the CPU through kernels/emu/cuda/cuda_emu.h, with the launch
// geometry of crates/gdn-ops/src/ops/gated_delta/cuda_chunked.rs: blocks of 256 threads, grids
// (chunks, B * Hv), (Dv / 32, B * Hv), (chunks, B * Hv), each pass's shared memory NaN before
// each block (a read of what no thread wrote poisons the result), and the scratch between the
// passes poisoned and checked to be written in full. Only whole chunks: T must be a multiple
// of 64 (the host runs the tail through the recurrence kernel, tested on its own). Used by
// crates/gdn-ops/tests/gated_delta_chunk_cuda_emulation.rs.
//
// stdin: "GDCCUDA1", then the case of gdn_case.h.
// stdout: f32 arrays y [B,T,Hv,Dv] and the final state [B,Hv,Dv,Dk].
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu/cuda -I kernels/emu
//        -I kernels kernels/emu/gated_delta_chunk_cuda_harness.cpp

#include "gdn_case.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_emu.h"
#include "block_shared.h"

// The entry points' extern __shared__ array (never used here: the harness passes its own).
extern "C" {
alignas(128) float gdn_chunk_smem[1];
}

#include "../gated_delta_chunk.cu"

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case : gdn_case::Inputs {
  GdnChunkParams p;
};

template <class InT, class StT>
void run(const Case& c) {
  const GdnChunkParams& p = c.p;
  auto in = gdn_case::step_buffers<InT>(c);
  Buffer<float> mask("mask", c.mask, Kind::kInput);
  Buffer<StT> state("state", c.state, Kind::kInPlace);
  Buffer<InT> y("y", std::size_t(p.batch) * p.steps * p.value_heads * p.value_dim, Kind::kOutput);
  // The host's scratch: poisoned outputs, each element of which a pass must write.
  const std::size_t heads = std::size_t(p.batch) * p.value_heads, tokens = std::size_t(p.chunks) * 64;
  Buffer<float> gcum("gcum", heads * tokens, Kind::kOutput);
  Buffer<float> w("w", heads * tokens * p.key_dim, Kind::kOutput);
  Buffer<float> u("u", heads * tokens * p.value_dim, Kind::kOutput);
  Buffer<float> h("h", heads * p.chunks * p.key_dim * p.value_dim, Kind::kOutput);
  const float* mask_or_null = p.has_mask != 0 ? mask.data() : nullptr;
  const unsigned n_heads = p.batch * p.value_heads;
  const uint3 threads{gdn_chunk::kThreads, 1, 1};
  {
    BlockShared shared(gdn_chunk::prep_smem_floats(int(p.key_dim), int(p.value_dim)));
    metal_emu::dispatch_threadgroups(uint3{p.chunks, n_heads, 1}, threads, [&](const metal_emu::ThreadIds& id) {
      shared.poison(id);
      gdn_chunk::prep_kernel<InT>(in.k.data(), in.v.data(), in.g.data(), in.beta.data(), mask_or_null, gcum.data(), w.data(),
                                  u.data(), p, int(id.thread_index_in_threadgroup), id.threadgroup_position_in_grid.x,
                                  id.threadgroup_position_in_grid.y, shared.smem);
    });
  }
  {
    BlockShared shared(gdn_chunk::state_smem_floats(int(p.key_dim), int(sizeof(InT))));
    metal_emu::dispatch_threadgroups(uint3{p.value_dim / gdn_chunk::kBlockV, n_heads, 1}, threads,
                                     [&](const metal_emu::ThreadIds& id) {
                                       shared.poison(id);
                                       gdn_chunk::state_kernel<InT, StT>(
                                           in.k.data(), gcum.data(), w.data(), u.data(), h.data(), state.data(), p,
                                           int(id.thread_index_in_threadgroup), id.threadgroup_position_in_grid.x,
                                           id.threadgroup_position_in_grid.y, shared.smem);
                                     });
  }
  {
    BlockShared shared(gdn_chunk::out_smem_floats(int(p.key_dim)));
    metal_emu::dispatch_threadgroups(uint3{p.chunks, n_heads, 1}, threads, [&](const metal_emu::ThreadIds& id) {
      shared.poison(id);
      gdn_chunk::out_kernel<InT>(in.q.data(), in.k.data(), gcum.data(), h.data(), u.data(), mask_or_null, y.data(), p,
                                 int(id.thread_index_in_threadgroup), id.threadgroup_position_in_grid.x,
                                 id.threadgroup_position_in_grid.y, shared.smem);
    });
  }
  guarded::check_all(in.q, in.k, in.v, in.g, in.beta, mask, state, gcum, w, u, h, y);
  y.write_f32();
  state.write_f32();
}

}  // namespace

int main() {
  guarded::install_fault_handler("gated_delta_chunk_cuda_harness");
  const gdn_case::Header h = gdn_case::read_header("GDCCUDA1");
  Case c;
  c.p = GdnChunkParams{h.batch, h.steps, h.steps / 64, h.key_heads, h.value_heads, h.key_dim, h.value_dim, h.has_mask};
  const GdnChunkParams& p = c.p;
  // The host side's contract (ops/gated_delta/cuda_chunked.rs checks it).
  if (p.key_dim == 0 || p.key_dim % 16 != 0 || p.key_dim > 256) guarded::die("key_dim must be a multiple of 16, at most 256");
  if (p.value_dim == 0 || p.value_dim % 32 != 0 || p.value_dim > 256) guarded::die("value_dim must be a multiple of 32, at most 256");
  if (p.key_heads == 0 || p.value_heads % p.key_heads != 0) guarded::die("value_heads must be a multiple of key_heads");
  if (p.batch == 0 || p.steps == 0 || p.steps % 64 != 0) guarded::die("steps must be a positive multiple of 64");
  gdn_case::read_inputs(h, c);

  switch (h.in_type * 2 + h.state_type) {
    case 0: run<float, float>(c); break;
    case 1: run<float, __nv_bfloat16>(c); break;
    case 2: run<__half, float>(c); break;
    case 3: run<__half, __nv_bfloat16>(c); break;
    case 4: run<__nv_bfloat16, float>(c); break;
    case 5: run<__nv_bfloat16, __nv_bfloat16>(c); break;
    default: guarded::die("unknown in_type / state_type");
  }
  return guarded::finish();
}
