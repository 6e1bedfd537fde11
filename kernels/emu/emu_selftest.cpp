// Self-test of metal_emu.h's threadgroup features: small kernels in MSL style run through
// dispatch_threadgroups. Used by crates/gdn-ops/tests/emu_selftest.rs.
//
// stdin: one little-endian u32, the case. Cases 0, 1 and 9 print f32 pairs (the kernel's value,
// then what a plain loop computes) for the test to compare; every other case is a misuse
// that metal_emu must abort on, so it prints nothing and returns only if the emulator let
// the misuse through (exit 5).
//
// Build: clang++-19 -std=c++17 -O2 --rtlib=compiler-rt -I kernels/emu
//        kernels/emu/emu_selftest.cpp -o emu_selftest

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <metal_stdlib>
using namespace metal;

#if !defined(__HAVE_BFLOAT__)
#error "metal_emu.h must define __HAVE_BFLOAT__"
#endif

// ---- Kernels, as they would be written in a .metal file. ----

constexpr uint kSimdgroups = 4;

// Sums x over each threadgroup of 128 threads: simd_sum per simdgroup, the partial sums
// through threadgroup memory, then one simdgroup adds them up. Before writing anything, each
// thread also reports whether its slot of threadgroup memory still held the poison.
[[kernel]] void tg_reduce(const device float* x [[buffer(0)]], device float* sums [[buffer(1)]],
                          device float* poisoned [[buffer(2)]], threadgroup float* partial [[threadgroup(0)]],
                          uint3 group [[threadgroup_position_in_grid]], uint3 pos [[thread_position_in_grid]],
                          uint tid [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                          uint sg [[simdgroup_index_in_threadgroup]]) {
  const float before = partial[tid % kSimdgroups];
  poisoned[pos.x] = before != before ? 1.0f : 0.0f;  // NaN
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const float s = simd_sum(x[pos.x]);
  if (lane == 0) partial[sg] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 0) {
    const float total = simd_sum(lane < kSimdgroups ? partial[lane] : 0.0f);
    if (lane == 0) sums[group.x] = total;
  }
  threadgroup_barrier(mem_flags::mem_none);
  threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
}

constexpr uint kSimdOutputs = 16;

// Every simdgroup function once per lane, into out[thread * kSimdOutputs + i].
[[kernel]] void simd_ops(const device float* x [[buffer(0)]], device float* out [[buffer(1)]],
                         uint gid [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  const float v = x[gid];
  simdgroup_barrier(mem_flags::mem_none);
  device float* o = out + gid * kSimdOutputs;
  o[0] = simd_max(v);
  o[1] = simd_min(v);
  o[2] = simd_broadcast(v, 7);
  o[3] = simd_shuffle(v, (lane * 5 + 3) % 32);
  o[4] = simd_shuffle_xor(v, 5);
  o[5] = simd_shuffle_down(v, 3);
  o[6] = simd_shuffle_up(v, 3);
  o[7] = simd_prefix_exclusive_sum(v);
  o[8] = simd_prefix_inclusive_sum(v);
  o[9] = simd_is_first() ? 1.0f : 0.0f;
  o[10] = float(simd_sum(int(v)));
  o[11] = float(simd_max(uint(v) + 100u));
  o[12] = simd_broadcast_first(v);
  o[13] = simd_any(v > 30.0f) ? 1.0f : 0.0f;
  o[14] = simd_all(v > -1.0f) ? 1.0f : 0.0f;
  o[15] = float(simd_shuffle_xor(half(v), 16));
}

// Simdgroup 1 leaves before the barrier the others wait at.
[[kernel]] void early_return(device float* out [[buffer(0)]], uint sg [[simdgroup_index_in_threadgroup]],
                             uint tid [[thread_index_in_threadgroup]]) {
  if (sg == 1) return;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = 1.0f;
}

// Two simdgroups wait at two different barriers.
[[kernel]] void split_barrier(device float* out [[buffer(0)]], uint sg [[simdgroup_index_in_threadgroup]],
                              uint tid [[thread_index_in_threadgroup]]) {
  if (sg == 0) {
    out[tid] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  } else {
    out[tid] = 2.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
}

// Lane 0 skips the simd_max its simdgroup waits at.
[[kernel]] void divergent_simd(device float* out [[buffer(0)]], uint gid [[thread_position_in_grid]],
                               uint lane [[thread_index_in_simdgroup]]) {
  if (lane != 0) out[gid] = simd_max(float(gid));
}

// The xor mask differs between lanes.
[[kernel]] void varying_mask(device float* out [[buffer(0)]], uint gid [[thread_position_in_grid]],
                             uint lane [[thread_index_in_simdgroup]]) {
  out[gid] = simd_shuffle_xor(float(gid), lane % 2);
}

// Writes one float past the end of its threadgroup memory.
[[kernel]] void overrun(threadgroup float* scratch [[threadgroup(0)]], uint tid [[thread_index_in_threadgroup]],
                        uint3 size [[threads_per_threadgroup]]) {
  scratch[tid + size.x] = 1.0f;
}

// ---- Simdgroup matrices. ----

constexpr uint kMatM = 16, kMatN = 16, kMatK = 24;
constexpr uint kMatResults = 3;

// Three products, each [kMatM, kMatN], written to out[r * kMatM * kMatN + ...]; simdgroup s
// computes rows 8s..8s+7:
//  0: a * b in float, b loaded transposed from bt = b^T, accumulated from a zero fill;
//  1: a as half (addressed through matrix_origin) times b as bfloat, into float;
//  2: the diagonal matrix 2 times the first k-tile of a times b (simdgroup_multiply twice),
//     stored transposed into threadgroup memory and copied out after a barrier.
[[kernel]] void matrix_ops(const device float* a [[buffer(0)]], const device float* bt [[buffer(1)]],
                           const device half* ah [[buffer(2)]], const device bfloat* bh [[buffer(3)]],
                           device float* out [[buffer(4)]], threadgroup float* tile [[threadgroup(0)]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint tid [[thread_index_in_threadgroup]]) {
  const simdgroup_float8x8 two(2.0f);
  for (uint j = 0; j < kMatN / 8; ++j) {
    simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_float8x8 mixed = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint k = 0; k < kMatK; k += 8) {
      simdgroup_float8x8 x, y;
      simdgroup_load(x, a + sg * 8 * kMatK + k, kMatK);
      simdgroup_load(y, bt + j * 8 * kMatK + k, kMatK, ulong2(0), true);
      simdgroup_multiply_accumulate(acc, x, y, acc);
      simdgroup_half8x8 xh;
      simdgroup_bfloat8x8 yh;
      simdgroup_load(xh, ah, kMatK, ulong2(k, sg * 8));
      simdgroup_load(yh, bh + k * kMatN + j * 8, kMatN);
      simdgroup_multiply_accumulate(mixed, xh, yh, mixed);
    }
    simdgroup_store(acc, out + sg * 8 * kMatN + j * 8, kMatN);
    simdgroup_store(mixed, out + kMatM * kMatN + sg * 8 * kMatN + j * 8, kMatN);
    simdgroup_float8x8 x, y, first;
    simdgroup_load(x, a + sg * 8 * kMatK, kMatK);
    simdgroup_load(y, bt + j * 8 * kMatK, kMatK, ulong2(0), true);
    simdgroup_multiply(first, x, y);
    simdgroup_multiply(first, two, first);
    // Transposed at (row 8j, column 8s) of the transposed result, i.e. back in place.
    simdgroup_store(first, tile, kMatM, ulong2(sg * 8, j * 8), true);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint i = tid; i < kMatM * kMatN; i += 64) {
    const uint r = i / kMatN, c = i % kMatN;
    out[2 * kMatM * kMatN + i] = tile[c * kMatM + r];
  }
}

// Each lane fills its matrix with its own lane index, then stores it.
[[kernel]] void lane_dependent_matrix(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  const simdgroup_float8x8 m = make_filled_simdgroup_matrix<float, 8, 8>(float(lane));
  simdgroup_store(m, out);
}

// Each lane loads from its own address.
[[kernel]] void lane_dependent_load(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 m;
  simdgroup_load(m, out + lane);
  simdgroup_store(m, out + 64);
}

// ---- Host side. ----

namespace {

using metal_emu::dispatch_threadgroups;
using metal_emu::ThreadIds;

void emit(float kernel_value, float expected) {
  const float pair[2] = {kernel_value, expected};
  if (std::fwrite(pair, sizeof(float), 2, stdout) != 2) std::exit(1);
}

// Small integers, so that every sum is exact whatever the order.
std::vector<float> inputs(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = float((i * 37 + 11) % 32);
  return x;
}

void run_tg_reduce() {
  constexpr uint kGroups = 3, kThreads = 32 * kSimdgroups;
  const std::vector<float> x = inputs(kGroups * kThreads);
  std::vector<float> sums(kGroups, -1.0f), poisoned(x.size(), -1.0f);
  dispatch_threadgroups(uint3{kGroups, 1, 1}, uint3{kThreads, 1, 1}, 16, [&](const ThreadIds& id) {
    tg_reduce((const device float*)x.data(), (device float*)sums.data(), (device float*)poisoned.data(),
              id.threadgroup_memory_as<float>(), id.threadgroup_position_in_grid, id.thread_position_in_grid,
              id.thread_index_in_threadgroup, id.thread_index_in_simdgroup, id.simdgroup_index_in_threadgroup);
  });
  for (uint g = 0; g < kGroups; ++g) {
    float expected = 0.0f;
    for (uint t = 0; t < kThreads; ++t) expected += x[g * kThreads + t];
    emit(sums[g], expected);
  }
  // Every threadgroup, not only the first, starts with poisoned memory.
  for (float p : poisoned) emit(p, 1.0f);
}

void run_simd_ops() {
  constexpr uint kThreads = 64;
  const std::vector<float> x = inputs(kThreads);
  std::vector<float> out(kThreads * kSimdOutputs, -1.0f);
  dispatch_threadgroups(uint3{1, 1, 1}, uint3{kThreads, 1, 1}, [&](const ThreadIds& id) {
    simd_ops((const device float*)x.data(), (device float*)out.data(), id.thread_position_in_grid.x,
             id.thread_index_in_simdgroup);
  });
  for (uint t = 0; t < kThreads; ++t) {
    const uint lane = t % 32, base = t - lane;
    const float* sg = &x[base];
    float mx = sg[0], mn = sg[0], below = 0.0f;
    int isum = 0;
    bool any = false, all = true;
    for (uint i = 0; i < 32; ++i) {
      mx = std::fmax(mx, sg[i]);
      mn = std::fmin(mn, sg[i]);
      isum += int(sg[i]);
      any = any || sg[i] > 30.0f;
      all = all && sg[i] > -1.0f;
      if (i < lane) below += sg[i];
    }
    const float expected[kSimdOutputs] = {
        mx,
        mn,
        sg[7],
        sg[(lane * 5 + 3) % 32],
        sg[lane ^ 5],
        lane + 3 < 32 ? sg[lane + 3] : sg[lane],
        lane >= 3 ? sg[lane - 3] : sg[lane],
        below,
        below + sg[lane],
        lane == 0 ? 1.0f : 0.0f,
        float(isum),
        mx + 100.0f,
        sg[0],
        any ? 1.0f : 0.0f,
        all ? 1.0f : 0.0f,
        sg[lane ^ 16],
    };
    for (uint i = 0; i < kSimdOutputs; ++i) emit(out[t * kSimdOutputs + i], expected[i]);
  }
}

void run_matrix_ops() {
  std::vector<float> a(kMatM * kMatK), b(kMatK * kMatN), bt(kMatN * kMatK);
  // Small integers (and their halves), exact in half and bfloat and in every sum.
  for (uint i = 0; i < a.size(); ++i) a[i] = float(int((i * 7 + 3) % 9) - 4);
  for (uint i = 0; i < b.size(); ++i) b[i] = float(int((i * 5 + 1) % 11) - 5) * 0.5f;
  for (uint k = 0; k < kMatK; ++k)
    for (uint n = 0; n < kMatN; ++n) bt[n * kMatK + k] = b[k * kMatN + n];
  std::vector<half> ah(a.begin(), a.end());
  std::vector<bfloat> bh(b.size());
  for (uint i = 0; i < b.size(); ++i) bh[i] = bfloat(b[i]);
  std::vector<float> out(kMatResults * kMatM * kMatN, -1.0f);
  dispatch_threadgroups(uint3{1, 1, 1}, uint3{64, 1, 1}, kMatM * kMatN * sizeof(float), [&](const ThreadIds& id) {
    matrix_ops((const device float*)a.data(), (const device float*)bt.data(), (const device half*)ah.data(),
               (const device bfloat*)bh.data(), (device float*)out.data(), id.threadgroup_memory_as<float>(),
               id.simdgroup_index_in_threadgroup, id.thread_index_in_threadgroup);
  });
  for (uint r = 0; r < kMatResults; ++r)
    for (uint m = 0; m < kMatM; ++m)
      for (uint n = 0; n < kMatN; ++n) {
        float expected = 0.0f;
        for (uint k = 0; k < (r == 2 ? 8 : kMatK); ++k) expected += a[m * kMatK + k] * b[k * kMatN + n];
        emit(out[(r * kMatM + m) * kMatN + n], r == 2 ? 2.0f * expected : expected);
      }
}

// A misuse: dispatches kernel on 64 threads with `bytes` of threadgroup memory.
template <class Kernel>
void misuse(uint threads, std::size_t bytes, Kernel&& kernel) {
  std::vector<float> out(threads, 0.0f);
  dispatch_threadgroups(uint3{1, 1, 1}, uint3{threads, 1, 1}, bytes,
                        [&](const ThreadIds& id) { kernel((device float*)out.data(), id); });
}

}  // namespace

int main() {
  std::uint32_t which = 0;
  if (std::fread(&which, sizeof which, 1, stdin) != 1) {
    std::fprintf(stderr, "emu_selftest: no case on stdin\n");
    return 2;
  }
  switch (which) {
    case 0: run_tg_reduce(); break;
    case 1: run_simd_ops(); break;
    case 2:
      misuse(64, 0, [](device float* out, const ThreadIds& id) {
        early_return(out, id.simdgroup_index_in_threadgroup, id.thread_index_in_threadgroup);
      });
      return 5;
    case 3:
      misuse(64, 0, [](device float* out, const ThreadIds& id) {
        split_barrier(out, id.simdgroup_index_in_threadgroup, id.thread_index_in_threadgroup);
      });
      return 5;
    case 4:
      misuse(64, 32 * 1024 + 16, [](device float*, const ThreadIds&) {});
      return 5;
    case 5:
      misuse(64, 0, [](device float* out, const ThreadIds& id) {
        divergent_simd(out, id.thread_position_in_grid.x, id.thread_index_in_simdgroup);
      });
      return 5;
    case 6:
      misuse(64, 0, [](device float* out, const ThreadIds& id) {
        varying_mask(out, id.thread_position_in_grid.x, id.thread_index_in_simdgroup);
      });
      return 5;
    case 7:
      misuse(1056, 0, [](device float*, const ThreadIds&) {});
      return 5;
    case 8:
      misuse(64, 64 * sizeof(float), [](device float*, const ThreadIds& id) {
        overrun(id.threadgroup_memory_as<float>(), id.thread_index_in_threadgroup, id.threads_per_threadgroup);
      });
      return 5;
    case 9: run_matrix_ops(); break;
    case 10:
      misuse(64, 0, [](device float* out, const ThreadIds& id) {
        lane_dependent_matrix(out, id.thread_index_in_simdgroup);
      });
      return 5;
    case 11:
      misuse(128, 0, [](device float* out, const ThreadIds& id) {
        lane_dependent_load(out, id.thread_index_in_simdgroup);
      });
      return 5;
    default:
      std::fprintf(stderr, "emu_selftest: unknown case %u\n", which);
      return 2;
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}
