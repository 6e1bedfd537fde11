// One decode step of gated attention on CUDA: the twin of kernels/attn_decode.metal (which
// describes the maths and the split of the keys), with
// crates/gdn-ops/src/ops/attn_decode/cpu.rs as the reference both must match.
//
// ENTRY POINTS (extern "C"; <t> in {f32, f16, bf16}):
//   attn_decode_<t>(q, gate, keys, values, pos, out, AttnDecodeParams p)
//   block = (32, S) threads (S = p.simdgroups warps, each taking every S-th key), grid =
//   (Nq, B), dynamic shared memory S * (2 + Dh) floats; p.splits = 1.
//   Split-K for long contexts (P = p.splits key ranges, as in the .metal file):
//   attn_decode_split_<t>(q, keys, values, pos, partials, p): block and shared memory as
//   above, grid (Nq, B, P), partials f32 [B, Nq, P, 2 + Dh];
//   attn_decode_combine_<t>(partials, gate, out, p): block (32), grid (Nq, B).
//   B sequences with KV buffers of their own (a table of their addresses, see run_slot):
//   attn_decode_slots_<t>(q, gate, slots, partials, out, p), then, where any sequence is
//   split, attn_decode_combine_slots_<t>(partials, gate, slots, out, p).
// pos is read from device memory (a CUDA graph replays the launch for every token); the
// last attended position is min(pos, cap - 1).
//
// The bodies (attn_decode::run, attn_decode::combine) take their thread and block indices
// and their shared memory as arguments, so that kernels/emu/attn_decode_cuda_harness.cpp runs
// them on the CPU (kernels/emu/cuda/cuda_emu.h).
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 kernels/attn_decode.cu -o attn_decode.ptx

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cfloat>
#include <stdint.h>

#include "params/attn_decode.h"
#include "cuda_convert.h"

namespace attn_decode {

using cuda_convert::from_f32;
using cuda_convert::to_f32;

constexpr uint32_t kMaxPerLane = 8;  // Dh <= 256
constexpr uint32_t kKeys = 4;        // keys a warp works on at once

// A lane's per_lane consecutive values from src as floats, in 16- or 8-byte loads where the
// row allows (per_lane * sizeof(T) a multiple of 16 or 8; rows start 16-byte aligned since
// Dh is a multiple of 32), else one by one.
template <typename T>
__device__ __forceinline__ void load_lane(const T* src, uint32_t per_lane,
                                          float (&dst)[kMaxPerLane]) {
  const uint32_t bytes = per_lane * (uint32_t)sizeof(T);
  if (bytes % 16 == 0) {
#pragma unroll
    for (uint32_t c = 0; c < kMaxPerLane * sizeof(T) / 16; ++c) {
      if (c * 16 >= bytes) break;
      const uint4 raw = *reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(src) + c * 16);
      const T* vals = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (uint32_t t = 0; t < 16 / sizeof(T); ++t) dst[c * (16 / sizeof(T)) + t] = to_f32(vals[t]);
    }
  } else if (bytes % 8 == 0) {
#pragma unroll
    for (uint32_t c = 0; c < kMaxPerLane * sizeof(T) / 8; ++c) {
      if (c * 8 >= bytes) break;
      const uint2 raw = *reinterpret_cast<const uint2*>(reinterpret_cast<const char*>(src) + c * 8);
      const T* vals = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (uint32_t t = 0; t < 8 / sizeof(T); ++t) dst[c * (8 / sizeof(T)) + t] = to_f32(vals[t]);
    }
  } else {
#pragma unroll
    for (uint32_t i = 0; i < kMaxPerLane; ++i) dst[i] = i < per_lane ? to_f32(src[i]) : 0.f;
  }
}

// The attention's output feature at `at`: the merged sum over the softmax total, rounded to T
// as the composed path rounds it, times the sigmoid of its gate.
template <typename T>
__device__ __forceinline__ void store_gated(const T* gate, T* out, size_t at, float acc,
                                            float total) {
  const float attended = to_f32(from_f32<T>(acc / total));
  const float g = to_f32(gate[at]);
  out[at] = from_f32<T>(attended * (1.f / (1.f + expf(-g))));
}

// The largest range maximum among a head's `splits` records (range 0 holds key 0, so it is a
// real score).
__device__ __forceinline__ float records_top(const float* records, uint32_t splits,
                                             uint32_t stride) {
  float top = -FLT_MAX;
  for (uint32_t s = 0; s < splits; ++s) top = fmaxf(top, records[s * stride]);
  return top;
}

// The block's warps' (max, sum, outputs) merged through shared memory (scratch: S * (2 + Dh)
// floats) by warp 0: into the range's record of `partials` (kSplit), else gated into `out`.
// o: a lane's per_lane (<= N) output features.
template <typename T, bool kSplit, uint32_t N>
__device__ __forceinline__ void merge_warps(float m, float l, const float (&o)[N],
                                            uint32_t per_lane, const T* gate, T* out,
                                            float* partials, const AttnDecodeParams p, uint32_t h,
                                            uint32_t b, uint32_t split, uint32_t sg,
                                            uint32_t lane, float* scratch) {
  const uint32_t dh = p.head_dim, groups = p.simdgroups, splits = kSplit ? p.splits : 1;
  const size_t head_at = ((size_t)b * p.q_heads + h) * dh + lane * per_lane;
  // Layout: [S] running maxima, [S] sums, [S][Dh] partial outputs.
  float* maxima = scratch;
  float* sums = scratch + groups;
  float* partial = scratch + 2 * groups;
  if (lane == 0) {
    maxima[sg] = m;
    sums[sg] = l;
  }
  for (uint32_t i = 0; i < per_lane; ++i) partial[sg * dh + lane * per_lane + i] = o[i];
  __syncthreads();
  if (sg != 0) return;
  float top = -FLT_MAX;
  for (uint32_t s = 0; s < groups; ++s) top = fmaxf(top, maxima[s]);
  float total = 0.f;
  for (uint32_t s = 0; s < groups; ++s) total += sums[s] * expf(maxima[s] - top);
  // An empty split range leaves (-FLT_MAX, 0, 0), which the combine pass weighs 0.
  float* record =
      kSplit ? partials + (((size_t)b * p.q_heads + h) * splits + split) * (2 + dh) : partials;
  if (kSplit && lane == 0) {
    record[0] = top;
    record[1] = total;
  }
  for (uint32_t i = 0; i < per_lane; ++i) {
    const uint32_t j = lane * per_lane + i;
    float acc = 0.f;
    for (uint32_t s = 0; s < groups; ++s) acc += partial[s * dh + j] * expf(maxima[s] - top);
    if (kSplit) {
      record[2 + j] = acc;
    } else {
      store_gated(gate, out, head_at + i, acc, total);
    }
  }
}

// kSplit: this block takes key range blockIdx.z of p.splits and writes its record to
// `partials`; otherwise it takes every key and writes `out`.
// Block (h, b, split), warp sg, lane; scratch: the block's S * (2 + Dh) shared floats.
template <typename T, bool kSplit>
__device__ void run(const T* q, const T* gate, const T* keys, const T* values,
                    const uint32_t* pos_buf, T* out, float* partials,
                    const AttnDecodeParams p, uint32_t h, uint32_t b, uint32_t split,
                    uint32_t sg, uint32_t lane, float* scratch) {
  if (!kSplit) split = 0;
  // Uniform over the block: all threads reach __syncthreads below, or none does.
  if (h >= p.q_heads || b >= p.batch) return;
  const uint32_t dh = p.head_dim, per_lane = dh / 32, groups = p.simdgroups;
  const uint32_t kvh = h / (p.q_heads / p.kv_heads);
  const uint32_t last = min(pos_buf[0], p.capacity - 1);
  const size_t head_at = ((size_t)b * p.q_heads + h) * dh + lane * per_lane;
  const size_t kv_at = ((size_t)b * p.kv_heads + kvh) * p.capacity * dh + lane * per_lane;
  // This block's keys: begin..end (all of 0..=last without a split).
  const uint32_t splits = kSplit ? p.splits : 1;
  const uint32_t per_split = last / splits + 1;  // ceil((last + 1) / splits)
  const uint32_t begin = kSplit ? min(split * per_split, last + 1) : 0;
  const uint32_t end = min(begin + per_split, last + 1);

  float qv[kMaxPerLane], o[kMaxPerLane];
#pragma unroll
  for (uint32_t i = 0; i < kMaxPerLane; ++i) {
    qv[i] = i < per_lane ? to_f32(q[head_at + i]) : 0.f;
    o[i] = 0.f;
  }
  // A finite floor, as the Metal kernel (fast math there assumes no infinities).
  float m = -FLT_MAX, l = 0.f;
  // The warp takes its keys kKeys at a time: their loads are in flight together and their
  // dot products' shuffles interleave (one key at a time, each key's loads, reduction and
  // exponentials were a chain of ~1 µs, and a split's 64 keys a warp ran one after another).
  // The running max moves once per batch: within rounding of one key at a time.
  for (uint32_t t0 = begin + sg; t0 < end; t0 += kKeys * groups) {
    float s[kKeys];
#pragma unroll
    for (uint32_t u = 0; u < kKeys; ++u) {
      const uint32_t t = t0 + u * groups;
      float kv[kMaxPerLane];
      load_lane(keys + kv_at + (size_t)min(t, end - 1) * dh, per_lane, kv);
      float dot = 0.f;
#pragma unroll
      for (uint32_t i = 0; i < kMaxPerLane; ++i) {
        if (i < per_lane) dot = fmaf(qv[i], kv[i], dot);
      }
      s[u] = dot;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (uint32_t u = 0; u < kKeys; ++u) s[u] += __shfl_xor_sync(0xffffffffu, s[u], off);
    }
    float m_new = m;
#pragma unroll
    for (uint32_t u = 0; u < kKeys; ++u) {
      s[u] = t0 + u * groups < end ? s[u] * p.scale : -FLT_MAX;
      m_new = fmaxf(m_new, s[u]);
    }
    const float rescale = expf(m - m_new);  // 0 at the first batch (m = -FLT_MAX)
    l *= rescale;
#pragma unroll
    for (uint32_t i = 0; i < kMaxPerLane; ++i) o[i] *= rescale;
#pragma unroll
    for (uint32_t u = 0; u < kKeys; ++u) {
      const uint32_t t = t0 + u * groups;
      if (t >= end) break;  // uniform over the warp
      const float w = expf(s[u] - m_new);
      float vv[kMaxPerLane];
      load_lane(values + kv_at + (size_t)t * dh, per_lane, vv);
      l += w;
#pragma unroll
      for (uint32_t i = 0; i < kMaxPerLane; ++i) {
        if (i < per_lane) o[i] = fmaf(w, vv[i], o[i]);
      }
    }
    m = m_new;
  }

  merge_warps<T, kSplit>(m, l, o, per_lane, gate, out, partials, p, h, b, split, sg, lane,
                         scratch);
}

// The merge of a split's records: block (h, b), one warp.
template <typename T>
__device__ void combine(const float* partials, const T* gate, T* out, const AttnDecodeParams p,
                        uint32_t h, uint32_t b, uint32_t lane) {
  if (h >= p.q_heads || b >= p.batch) return;
  const uint32_t dh = p.head_dim, per_lane = dh / 32, splits = p.splits, stride = 2 + dh;
  const float* records = partials + ((size_t)b * p.q_heads + h) * splits * stride;
  const size_t head_at = ((size_t)b * p.q_heads + h) * dh + lane * per_lane;
  const float top = records_top(records, splits, stride);
  float total = 0.f;
  for (uint32_t s = 0; s < splits; ++s) total += records[s * stride + 1] * expf(records[s * stride] - top);
  for (uint32_t i = 0; i < per_lane; ++i) {
    const uint32_t j = lane * per_lane + i;
    float acc = 0.f;
    for (uint32_t s = 0; s < splits; ++s) {
      acc += records[s * stride + 2 + j] * expf(records[s * stride] - top);
    }
    store_gated(gate, out, head_at + i, acc, total);
  }
}


// The split pass for long contexts (the host's choice: ops/attn_decode/long_context.rs):
// run<T, true>'s maths in its order, the same keys a warp, the same four-key batches, the same
// bits, with the loads issued early. ptxas turns run's value loads, each behind its
// `t >= end` break and its exponential, into four round trips to L2 after the keys' one: five
// a batch (ncu at 16k positions: 59% of stalls on global loads). Here a batch's value rows are
// loaded with its keys (clamped to the range, as the keys are; an out-of-range row is loaded
// and not used), and the next batch's keys as soon as this batch's dot products have consumed
// the key registers, before the shuffles, exponentials and value sums: one round trip a batch,
// partly hidden. With kHeads = 2 a warp serves two query heads of its KV head from each row it
// loads (half the L2 -> SM bytes, the loads' addresses and conversions shared), each head's
// maths still in run's order. Rows of exactly 16 bytes a lane (Dh 256 in 16-bit types, Dh 128
// in f32), held as loaded and converted at use. Any other row width leaves its records
// unwritten: the host never launches it. Measured: docs/perf-notes-gpu.md, "loads in flight
// at long contexts".
template <typename T>
__device__ __forceinline__ uint4 load_row16(const T* src) {
  return *reinterpret_cast<const uint4*>(src);
}

template <typename T>
__device__ __forceinline__ float row16_at(const uint4& raw, uint32_t i) {
  return to_f32(reinterpret_cast<const T*>(&raw)[i]);
}

template <typename T, uint32_t kHeads>
__device__ void run_pipelined(const T* q, const T* keys, const T* values,
                              const uint32_t* pos_buf, float* partials,
                              const AttnDecodeParams p, uint32_t pair, uint32_t b, uint32_t split,
                              uint32_t sg, uint32_t lane, float* scratch) {
  constexpr uint32_t kPer = 16 / sizeof(T);  // a lane's features: one 16-byte load a row
  // Query heads h0 .. h0 + kHeads - 1, of one KV head (the host takes kHeads > 1 only where
  // they divide the group).
  const uint32_t h0 = pair * kHeads;
  if (h0 >= p.q_heads || b >= p.batch || p.head_dim != 32 * kPer) return;
  const uint32_t dh = p.head_dim, groups = p.simdgroups;
  const uint32_t kvh = h0 / (p.q_heads / p.kv_heads);
  const uint32_t last = min(pos_buf[0], p.capacity - 1);
  const size_t kv_at = ((size_t)b * p.kv_heads + kvh) * p.capacity * dh + lane * kPer;
  const uint32_t splits = p.splits;
  const uint32_t per_split = last / splits + 1;
  const uint32_t begin = min(split * per_split, last + 1);
  const uint32_t end = min(begin + per_split, last + 1);
  const uint32_t stride = kKeys * groups;

  // q held in its type too (converted at each use, to the same floats): 4 registers a head,
  // not 8. Read element by element: the host aligns the KV buffers to 16 bytes, not q.
  uint4 qr[kHeads];
  float o[kHeads][kPer], m[kHeads], l[kHeads];
#pragma unroll
  for (uint32_t g = 0; g < kHeads; ++g) {
    const size_t head_at = ((size_t)b * p.q_heads + h0 + g) * dh + lane * kPer;
#pragma unroll
    for (uint32_t i = 0; i < kPer; ++i) {
      reinterpret_cast<T*>(&qr[g])[i] = q[head_at + i];
      o[g][i] = 0.f;
    }
    m[g] = -FLT_MAX;
    l[g] = 0.f;
  }
  uint4 kr[kKeys];
  uint32_t t0 = begin + sg;
  if (t0 < end) {
#pragma unroll
    for (uint32_t u = 0; u < kKeys; ++u)
      kr[u] = load_row16(keys + kv_at + (size_t)min(t0 + u * groups, end - 1) * dh);
  }
  for (; t0 < end; t0 += stride) {
    uint4 vr[kKeys];
#pragma unroll
    for (uint32_t u = 0; u < kKeys; ++u)
      vr[u] = load_row16(values + kv_at + (size_t)min(t0 + u * groups, end - 1) * dh);
    float s[kHeads][kKeys];
#pragma unroll
    for (uint32_t g = 0; g < kHeads; ++g) {
#pragma unroll
      for (uint32_t u = 0; u < kKeys; ++u) {
        float dot = 0.f;
#pragma unroll
        for (uint32_t i = 0; i < kPer; ++i)
          dot = fmaf(row16_at<T>(qr[g], i), row16_at<T>(kr[u], i), dot);
        s[g][u] = dot;
      }
    }
    if (t0 + stride < end) {
#pragma unroll
      for (uint32_t u = 0; u < kKeys; ++u)
        kr[u] = load_row16(keys + kv_at + (size_t)min(t0 + stride + u * groups, end - 1) * dh);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (uint32_t g = 0; g < kHeads; ++g) {
#pragma unroll
        for (uint32_t u = 0; u < kKeys; ++u)
          s[g][u] += __shfl_xor_sync(0xffffffffu, s[g][u], off);
      }
    }
#pragma unroll
    for (uint32_t g = 0; g < kHeads; ++g) {
      float m_new = m[g];
#pragma unroll
      for (uint32_t u = 0; u < kKeys; ++u) {
        s[g][u] = t0 + u * groups < end ? s[g][u] * p.scale : -FLT_MAX;
        m_new = fmaxf(m_new, s[g][u]);
      }
      const float rescale = expf(m[g] - m_new);
      l[g] *= rescale;
#pragma unroll
      for (uint32_t i = 0; i < kPer; ++i) o[g][i] *= rescale;
#pragma unroll
      for (uint32_t u = 0; u < kKeys; ++u) {
        if (t0 + u * groups < end) {  // uniform over the warp; as run's break
          const float w = expf(s[g][u] - m_new);
          l[g] += w;
#pragma unroll
          for (uint32_t i = 0; i < kPer; ++i) o[g][i] = fmaf(w, row16_at<T>(vr[u], i), o[g][i]);
        }
      }
      m[g] = m_new;
    }
  }
  // One head's records at a time through the block's scratch.
#pragma unroll
  for (uint32_t g = 0; g < kHeads; ++g) {
    if (g > 0) __syncthreads();  // warp 0 has read the previous head's scratch
    merge_warps<T, true>(m[g], l[g], o[g], kPer, nullptr, static_cast<T*>(nullptr), partials, p,
                         h0 + g, b, split, sg, lane, scratch);
  }
}

// The combine pass with a thread per feature: block (h, b) of Dh threads, each merging its
// feature over the ranges in combine's order (the same bits as combine, whose lanes walk
// Dh / 32 features one after another, 32 ranges a feature at 16k positions: 15 µs a layer).
template <typename T>
__device__ void combine_wide(const float* partials, const T* gate, T* out,
                             const AttnDecodeParams p, uint32_t h, uint32_t b, uint32_t j) {
  if (h >= p.q_heads || b >= p.batch || j >= p.head_dim) return;
  const uint32_t dh = p.head_dim, splits = p.splits, stride = 2 + dh;
  const float* records = partials + ((size_t)b * p.q_heads + h) * splits * stride;
  const size_t at = ((size_t)b * p.q_heads + h) * dh + j;
  const float top = records_top(records, splits, stride);
  float total = 0.f, acc = 0.f;
  for (uint32_t s = 0; s < splits; ++s) {
    const float weight = expf(records[s * stride] - top);
    total += records[s * stride + 1] * weight;
    acc += records[s * stride + 2 + j] * weight;
  }
  store_gated(gate, out, at, acc, total);
}

// B sequences in one launch (attn_decode_slots_<t>, attn_decode_combine_slots_<t>): sequence
// b's KV buffers, position, capacity, key ranges and passes come from row b of a table; its
// blocks run the body its own launch (attn_decode_<t> or a split pair, the host's choice per
// sequence: ops/attn_decode_slots/cuda.rs) runs, on its q, gate and out rows and its own
// records, with b = 0 and p.capacity, p.splits its own: the same bits as that launch.
// A row of the table: eight-byte words, as the host writes them.
struct Slot {
  const void* keys;    // [1, Nkv, cap, Dh] T
  const void* values;  // [1, Nkv, cap, Dh] T
  const uint32_t* pos;
  uint64_t capacity;
  uint64_t splits;  // its key ranges (1: the one-pass body)
  uint64_t passes;  // kSingle, kShipped, kPipelined or kPairs
};
constexpr uint64_t kSingle = 0, kShipped = 1, kPipelined = 2, kPairs = 3;

// The sequence's own launch parameters: one sequence, its capacity and ranges.
__device__ __forceinline__ AttnDecodeParams slot_params(AttnDecodeParams p, const Slot& s) {
  p.batch = 1;
  p.capacity = (uint32_t)s.capacity;
  p.splits = (uint32_t)s.splits;
  return p;
}

// Block (x, b, split): x a query head (a head pair's index for kPairs, whose blocks past
// Nq / 2 return), split one of the sequence's ranges (blocks past them return). p.splits: the
// most ranges of any sequence, the stride of each sequence's records in `partials`.
template <typename T>
__device__ void run_slot(const T* q, const T* gate, const Slot* slots, float* partials, T* out,
                         const AttnDecodeParams p, uint32_t x, uint32_t b, uint32_t split,
                         uint32_t sg, uint32_t lane, float* scratch) {
  if (b >= p.batch) return;
  const Slot s = slots[b];
  // Uniform over the block: all threads reach the bodies' __syncthreads, or none does.
  if (split >= s.splits) return;
  const AttnDecodeParams one = slot_params(p, s);
  const size_t rows = (size_t)b * p.q_heads * p.head_dim;
  float* records = partials + (size_t)b * p.q_heads * p.splits * (2 + p.head_dim);
  const T* keys = static_cast<const T*>(s.keys);
  const T* values = static_cast<const T*>(s.values);
  if (s.passes == kSingle) {
    run<T, false>(q + rows, gate + rows, keys, values, s.pos, out + rows, nullptr, one, x, 0, 0,
                  sg, lane, scratch);
  } else if (s.passes == kShipped) {
    run<T, true>(q + rows, nullptr, keys, values, s.pos, nullptr, records, one, x, 0, split, sg,
                 lane, scratch);
  } else if (s.passes == kPipelined) {
    run_pipelined<T, 1>(q + rows, keys, values, s.pos, records, one, x, 0, split, sg, lane,
                        scratch);
  } else if (s.passes == kPairs) {
    run_pipelined<T, 2>(q + rows, keys, values, s.pos, records, one, x, 0, split, sg, lane,
                        scratch);
  }
}

// The combine of every split sequence: block (h, b) of Dh threads; a sequence of one range
// was written by run_slot. kShipped merges as combine (its first warp), the others as
// combine_wide, as their own launches do.
template <typename T>
__device__ void combine_slot(const float* partials, const T* gate, const Slot* slots, T* out,
                             const AttnDecodeParams p, uint32_t h, uint32_t b, uint32_t j) {
  if (b >= p.batch) return;
  const Slot s = slots[b];
  if (s.passes == kSingle) return;
  const AttnDecodeParams one = slot_params(p, s);
  const size_t rows = (size_t)b * p.q_heads * p.head_dim;
  const float* records = partials + (size_t)b * p.q_heads * p.splits * (2 + p.head_dim);
  if (s.passes == kShipped) {
    if (j < 32) combine<T>(records, gate + rows, out + rows, one, h, 0, j);
  } else {
    combine_wide<T>(records, gate + rows, out + rows, one, h, 0, j);
  }
}

}  // namespace attn_decode

// Four blocks of 8 warps (the host's SIMDGROUPS) resident per SM: at most 64 registers a
// thread. The four-key batches asked for 72, three blocks per SM, and the 16 heads x 33
// key ranges of a split at 16k positions (528 blocks, one wave of 4 x 132) took two waves.
#define ATTN_DECODE_BOUNDS __launch_bounds__(256, 4)
// The long-context split pass (attn_decode::run_pipelined) over HEADS query heads a block:
// the arguments of attn_decode_split_<t>, grid (Nq / HEADS, B, P). pipelined: 64 registers
// (28 bytes of spills outside the loads), four blocks an SM; pair: 107, no spills, two blocks
// an SM (Qwen3-Next's 8 pairs x 32 ranges: 256 blocks, all resident on 132 SMs).
#define ATTN_DECODE_PIPELINED(TN, T, NAME, HEADS, BLOCKS_PER_SM)                           \
  extern "C" __global__ void __launch_bounds__(256, BLOCKS_PER_SM)                        \
      attn_decode_split_##NAME##_##TN(                                                    \
      const T* q, const T* keys, const T* values, const uint32_t* pos, float* partials,    \
      const AttnDecodeParams p) {                                                          \
    extern __shared__ float attn_decode_scratch[];                                         \
    attn_decode::run_pipelined<T, HEADS>(q, keys, values, pos, partials, p, blockIdx.x,   \
                                             blockIdx.y, blockIdx.z, threadIdx.y,          \
                                             threadIdx.x, attn_decode_scratch);            \
  }
// The slot entries (attn_decode::run_slot, combine_slot): grid (Nq, B, p.splits) of (32, S)
// threads with the one-pass kernel's shared memory, then grid (Nq, B) of Dh threads. Two
// blocks an SM: the pair body's 107 registers fit, the others' run as they would at four.
#define ATTN_DECODE_SLOTS(TN, T)                                                           \
  extern "C" __global__ void __launch_bounds__(256, 2) attn_decode_slots_##TN(            \
      const T* q, const T* gate, const attn_decode::Slot* slots, float* partials, T* out,  \
      const AttnDecodeParams p) {                                                          \
    extern __shared__ float attn_decode_scratch[];                                         \
    attn_decode::run_slot<T>(q, gate, slots, partials, out, p, blockIdx.x, blockIdx.y,     \
                             blockIdx.z, threadIdx.y, threadIdx.x, attn_decode_scratch);   \
  }                                                                                        \
  extern "C" __global__ void attn_decode_combine_slots_##TN(                               \
      const float* partials, const T* gate, const attn_decode::Slot* slots, T* out,        \
      const AttnDecodeParams p) {                                                          \
    attn_decode::combine_slot<T>(partials, gate, slots, out, p, blockIdx.x, blockIdx.y,    \
                                 threadIdx.x);                                             \
  }
#define ATTN_DECODE_ENTRY(TN, T)                                                           \
  extern "C" __global__ void ATTN_DECODE_BOUNDS attn_decode_##TN(const T* q, const T* gate, const T* keys,    \
                                              const T* values, const uint32_t* pos, T* out, \
                                              const AttnDecodeParams p) {                  \
    extern __shared__ float attn_decode_scratch[];                                         \
    attn_decode::run<T, false>(q, gate, keys, values, pos, out, nullptr, p, blockIdx.x,    \
                               blockIdx.y, 0, threadIdx.y, threadIdx.x, attn_decode_scratch); \
  }                                                                                        \
  extern "C" __global__ void ATTN_DECODE_BOUNDS attn_decode_split_##TN(const T* q, const T* keys,             \
                                                    const T* values, const uint32_t* pos,  \
                                                    float* partials,                       \
                                                    const AttnDecodeParams p) {            \
    extern __shared__ float attn_decode_scratch[];                                         \
    attn_decode::run<T, true>(q, nullptr, keys, values, pos, nullptr, partials, p,         \
                              blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.y, threadIdx.x, \
                              attn_decode_scratch);                                        \
  }                                                                                        \
  extern "C" __global__ void attn_decode_combine_##TN(const float* partials, const T* gate, \
                                                      T* out, const AttnDecodeParams p) {  \
    attn_decode::combine<T>(partials, gate, out, p, blockIdx.x, blockIdx.y, threadIdx.x);  \
  }                                                                                        \
  ATTN_DECODE_PIPELINED(TN, T, pipelined, 1, 4)                                            \
  ATTN_DECODE_PIPELINED(TN, T, pair, 2, 2)                                                 \
  extern "C" __global__ void attn_decode_combine_wide_##TN(const float* partials,          \
                                                           const T* gate, T* out,          \
                                                           const AttnDecodeParams p) {     \
    attn_decode::combine_wide<T>(partials, gate, out, p, blockIdx.x, blockIdx.y, threadIdx.x); \
  }                                                                                        \
  ATTN_DECODE_SLOTS(TN, T)

ATTN_DECODE_ENTRY(f32, float)
ATTN_DECODE_ENTRY(f16, __half)
ATTN_DECODE_ENTRY(bf16, __nv_bfloat16)
