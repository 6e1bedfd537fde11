// Runs the shipped kernels/gated_delta_chunk.metal on the CPU through metal_emu.h, with the
// host's split (crates/gdn-ops/src/ops/gated_delta/metal_chunked.rs): the three chunk passes
// over the floor(T / 64) full chunks (with the scratch between them poisoned and checked to be
// written in full), then the tail (T % 64 tokens, copied out contiguous) through
// the recurrence kernel of kernels/gated_delta.metal, on the same state. When a bf16 state
// goes through both kernels they run on an f32 copy, rounded once at the end, so the state
// is rounded once per call as with one kernel. Used by
// crates/gdn-ops/tests/gated_delta_chunk_emulation.rs.
//
// stdin: "GDCEMU01", then the case of gdn_case.h. Inputs are converted to InT / StT here (exactly, when the caller
// already rounded them).
// stdout: f32 arrays y [B,T,Hv,Dv] and the final state [B,Hv,Dv,Dk].
// Memory checks: guarded_buffer.h (every y element must be written by one of the kernels).

#include "gdn_case.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "metal_math.h"

#include "../gated_delta.metal"
#include "../gated_delta_chunk.metal"

namespace {

using guarded::Buffer;
using guarded::Kind;

struct Case : gdn_case::Inputs {
  GdnChunkParams p;
};

// The three passes of one InT/StT instantiation.
template <class InT, class StT>
struct ChunkKernels {
  void (*prep)(const device InT*, const device InT*, const device float*, const device float*, const device float*,
               device float*, device float*, device float*, constant GdnChunkParams&, threadgroup float*, uint3, uint,
               uint, uint);
  void (*state)(const device InT*, const device float*, const device float*, device float*, device float*,
                device StT*, constant GdnChunkParams&, threadgroup float*, uint3, uint, uint, uint);
  void (*out)(const device InT*, const device InT*, const device float*, const device float*, const device float*,
              const device float*, device InT*, constant GdnChunkParams&, threadgroup float*, uint3, uint, uint, uint);
};

template <class InT, class StT>
using StepKernel = void (*)(const device InT*, const device InT*, const device InT*, const device float*,
                            const device float*, device StT*, device InT*, const device float*,
                            constant GdnParams&, uint3, uint);

// Tokens [t0, T) of a [B, T, rest] array, contiguous: the host's narrow + contiguous.
std::vector<float> tail_of(const std::vector<float>& x, uint batch, uint steps, uint t0) {
  const std::size_t rest = x.size() / (std::size_t(batch) * steps);
  std::vector<float> out;
  for (uint b = 0; b < batch; ++b) {
    const float* from = x.data() + (std::size_t(b) * steps + t0) * rest;
    out.insert(out.end(), from, from + std::size_t(steps - t0) * rest);
  }
  return out;
}

// The three chunk passes over p.chunks chunks, in place on `state`, writing those tokens of y,
// with the host's scratch between them (poisoned outputs, each element of which a pass must
// write).
template <class InT, class StT>
void run_chunks(const GdnChunkParams& p, Buffer<InT>& q, Buffer<InT>& k, Buffer<InT>& v, Buffer<float>& g,
                Buffer<float>& beta, Buffer<StT>& state, InT* y, Buffer<float>* mask, ChunkKernels<InT, StT> kernels) {
  const GdnChunkParams params = p;
  constant GdnChunkParams& cp = *(constant GdnChunkParams*)&params;
  const std::size_t heads = std::size_t(p.batch) * p.value_heads, tokens = std::size_t(p.chunks) * kChunk;
  Buffer<float> gcum("gcum", heads * tokens, Kind::kOutput);
  Buffer<float> w("w", heads * tokens * p.key_dim, Kind::kOutput);
  Buffer<float> u("u", heads * tokens * p.value_dim, Kind::kOutput);
  Buffer<float> h("h", heads * p.chunks * p.key_dim * p.value_dim, Kind::kOutput);
  const device float* mask_or_null = mask != nullptr ? (const device float*)mask->data() : nullptr;
  const uint heads32 = p.batch * p.value_heads;
  const uint3 per_group{kThreads, 1, 1};
  metal_emu::dispatch_threadgroups(uint3{p.chunks, 1, heads32}, per_group, kPrepFloats * sizeof(float),
                                   [&](const metal_emu::ThreadIds& id) {
    kernels.prep((const device InT*)k.data(), (const device InT*)v.data(), (const device float*)g.data(),
                 (const device float*)beta.data(), mask_or_null, (device float*)gcum.data(), (device float*)w.data(),
                 (device float*)u.data(), cp, id.threadgroup_memory_as<float>(), id.threadgroup_position_in_grid,
                 id.thread_index_in_threadgroup, id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup);
  });
  metal_emu::dispatch_threadgroups(uint3{p.value_dim / kBlockV, 1, heads32}, per_group, kStateFloats * sizeof(float),
                                   [&](const metal_emu::ThreadIds& id) {
    kernels.state((const device InT*)k.data(), (const device float*)gcum.data(), (const device float*)w.data(),
                  (device float*)u.data(), (device float*)h.data(), (device StT*)state.data(), cp,
                  id.threadgroup_memory_as<float>(), id.threadgroup_position_in_grid, id.thread_index_in_threadgroup,
                  id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup);
  });
  metal_emu::dispatch_threadgroups(uint3{p.chunks, 1, heads32}, per_group, kOutFloats * sizeof(float),
                                   [&](const metal_emu::ThreadIds& id) {
    kernels.out((const device InT*)q.data(), (const device InT*)k.data(), (const device float*)gcum.data(),
                (const device float*)h.data(), (const device float*)u.data(), mask_or_null, (device InT*)y, cp,
                id.threadgroup_memory_as<float>(), id.threadgroup_position_in_grid, id.thread_index_in_threadgroup,
                id.simdgroup_index_in_threadgroup, id.thread_index_in_simdgroup);
  });
  guarded::check_all(gcum, w, u, h);
}

// The recurrence kernel over tokens [t0, T), on contiguous copies, in place on `state`.
template <class InT, class StT>
void run_tail(const Case& c, uint t0, Buffer<StT>& state, InT* y, StepKernel<InT, StT> kernel) {
  const GdnChunkParams& p = c.p;
  const uint tail = p.steps - t0;
  Buffer<InT> q("q tail", tail_of(c.q, p.batch, p.steps, t0), Kind::kInput);
  Buffer<InT> k("k tail", tail_of(c.k, p.batch, p.steps, t0), Kind::kInput);
  Buffer<InT> v("v tail", tail_of(c.v, p.batch, p.steps, t0), Kind::kInput);
  Buffer<float> g("g tail", tail_of(c.g, p.batch, p.steps, t0), Kind::kInput);
  Buffer<float> beta("beta tail", tail_of(c.beta, p.batch, p.steps, t0), Kind::kInput);
  const std::size_t row = std::size_t(p.value_heads) * p.value_dim;
  Buffer<InT> y_tail("y tail", std::size_t(p.batch) * tail * row, Kind::kOutput);
  std::vector<float> mask_tail = p.has_mask != 0 ? tail_of(c.mask, p.batch, p.steps, t0) : std::vector<float>{};
  Buffer<float> mask("mask tail", mask_tail, Kind::kInput);
  const GdnParams params{p.batch, tail, p.key_heads, p.value_heads, p.key_dim, p.value_dim, p.has_mask};
  const uint3 groups{1, (p.value_dim + 3) / 4, p.batch * p.value_heads};
  metal_emu::dispatch_threadgroups(groups, uint3{32, 4, 1}, [&](const metal_emu::ThreadIds& id) {
    kernel((const device InT*)q.data(), (const device InT*)k.data(), (const device InT*)v.data(),
           (const device float*)g.data(), (const device float*)beta.data(), (device StT*)state.data(),
           (device InT*)y_tail.data(), p.has_mask != 0 ? (const device float*)mask.data() : nullptr,
           *(constant GdnParams*)&params, id.thread_position_in_grid, id.thread_index_in_simdgroup);
  });
  guarded::check_all(q, k, v, g, beta, y_tail);
  for (uint b = 0; b < p.batch; ++b) {
    std::memcpy(y + (std::size_t(b) * p.steps + t0) * row, y_tail.data() + std::size_t(b) * tail * row,
                std::size_t(tail) * row * sizeof(InT));
  }
}

template <class InT, class StT>
void run(const Case& c, ChunkKernels<InT, StT> chunk, StepKernel<InT, StT> step, ChunkKernels<InT, float> chunk_f32,
         StepKernel<InT, float> step_f32) {
  const GdnChunkParams& p = c.p;
  auto in = gdn_case::step_buffers<InT>(c);
  Buffer<float> mask("mask", c.mask, Kind::kInput);
  Buffer<float>* mask_ptr = p.has_mask != 0 ? &mask : nullptr;
  Buffer<StT> state("state", c.state, Kind::kInPlace);
  Buffer<InT> y("y", std::size_t(p.batch) * p.steps * p.value_heads * p.value_dim, Kind::kOutput);
  const uint t0 = p.chunks * kChunk;
  const bool tail = t0 < p.steps;
  if (p.chunks == 0) {
    run_tail(c, 0, state, y.data(), step);
  } else if (!tail) {
    run_chunks(p, in.q, in.k, in.v, in.g, in.beta, state, y.data(), mask_ptr, chunk);
  } else if (std::is_same<StT, float>::value) {
    run_chunks(p, in.q, in.k, in.v, in.g, in.beta, state, y.data(), mask_ptr, chunk);
    run_tail(c, t0, state, y.data(), step);
  } else {
    // Both kernels on an f32 copy of the bf16 state, rounded once.
    std::vector<float> widened(state.data(), state.data() + c.state.size());
    Buffer<float> wide("state f32", widened, Kind::kInPlace);
    run_chunks(p, in.q, in.k, in.v, in.g, in.beta, wide, y.data(), mask_ptr, chunk_f32);
    run_tail(c, t0, wide, y.data(), step_f32);
    wide.check();
    for (std::size_t i = 0; i < c.state.size(); ++i) state.data()[i] = StT(wide.data()[i]);
  }
  guarded::check_all(in.q, in.k, in.v, in.g, in.beta, mask, state, y);
  y.write_f32();
  state.write_f32();
}

}  // namespace

int main() {
  guarded::install_fault_handler("gated_delta_chunk_harness");
  const gdn_case::Header h = gdn_case::read_header("GDCEMU01");
  Case c;
  c.p = GdnChunkParams{h.batch, h.steps, h.steps / kChunk, h.key_heads, h.value_heads, h.key_dim, h.value_dim, h.has_mask};
  const GdnChunkParams& p = c.p;
  // The host side's contract (ops/gated_delta/metal_chunked.rs checks it).
  if (p.key_dim == 0 || p.key_dim % 32 != 0 || p.key_dim > 256) guarded::die("key_dim must be a multiple of 32, at most 256");
  if (p.value_dim == 0 || p.value_dim % kBlockV != 0) guarded::die("value_dim must be a multiple of 32");
  if (p.key_heads == 0 || p.value_heads % p.key_heads != 0) guarded::die("value_heads must be a multiple of key_heads");
  if (p.batch == 0 || p.steps == 0) guarded::die("the host launches nothing for an empty call");
  gdn_case::read_inputs(h, c);

#define GDN_PASSES(InT, StT, in, st) \
  ChunkKernels<InT, StT> { gated_delta_chunk_prep_##in, gated_delta_chunk_state_##in##_##st, gated_delta_chunk_out_##in }
  switch (h.in_type * 2 + h.state_type) {
    case 0: run<float, float>(c, GDN_PASSES(float, float, f32, f32), gated_delta_step_f32_f32, GDN_PASSES(float, float, f32, f32), gated_delta_step_f32_f32); break;
    case 1: run<float, bfloat>(c, GDN_PASSES(float, bfloat, f32, bf16), gated_delta_step_f32_bf16, GDN_PASSES(float, float, f32, f32), gated_delta_step_f32_f32); break;
    case 2: run<half, float>(c, GDN_PASSES(half, float, f16, f32), gated_delta_step_f16_f32, GDN_PASSES(half, float, f16, f32), gated_delta_step_f16_f32); break;
    case 3: run<half, bfloat>(c, GDN_PASSES(half, bfloat, f16, bf16), gated_delta_step_f16_bf16, GDN_PASSES(half, float, f16, f32), gated_delta_step_f16_f32); break;
    case 4: run<bfloat, float>(c, GDN_PASSES(bfloat, float, bf16, f32), gated_delta_step_bf16_f32, GDN_PASSES(bfloat, float, bf16, f32), gated_delta_step_bf16_f32); break;
    case 5: run<bfloat, bfloat>(c, GDN_PASSES(bfloat, bfloat, bf16, bf16), gated_delta_step_bf16_bf16, GDN_PASSES(bfloat, float, bf16, f32), gated_delta_step_bf16_f32); break;
    default: guarded::die("unknown in_type / state_type");
  }
#undef GDN_PASSES
  return guarded::finish();
}
