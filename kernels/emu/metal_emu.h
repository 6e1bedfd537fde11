// Just enough of the Metal Shading Language to compile a shipped .metal kernel as C++ with
// clang (19+) and run it on the CPU. Used by crates/gdn-ops/tests/metal_emulation.rs.
//
// What is faithful, and why:
//  * Address spaces are real clang address spaces, so passing a device pointer where a
//    constant or threadgroup one is expected (or a plain host pointer anywhere) is a compile
//    error, as it is in MSL.
//  * bfloat and half are the compiler's __bf16 and _Float16, so conversions round to nearest
//    even exactly as the GPU and the `half` crate do. (Link with --rtlib=compiler-rt: libgcc
//    12 has no __truncsfbf2.)
//  * A simdgroup's 32 lanes are 32 fibers run in lock step: every simd_sum is a rendezvous
//    of all 32 lanes, and a lane that skips one (divergence), or calls it from a different
//    place, aborts the run instead of being silently summed over.
//  * Attributes ([[kernel]], [[buffer(n)]], [[host_name(..)]], [[thread_position_in_grid]],
//    ...) are ignored; the harness passes the built-ins explicitly.
//
// Include every standard header a translation unit needs BEFORE this one: `device`,
// `constant` and `threadgroup` are macros from here on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <ucontext.h>

#pragma clang diagnostic ignored "-Wunknown-attributes"

#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))

// MSL scalar and vector types live at global scope there too. (glibc already declares
// `uint` the same way; repeating an identical typedef is allowed.)
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
// bfloat, and the macro the Metal compiler defines with it from MSL 3.1 on. With
// METAL_EMU_MSL30 neither exists, as on macOS 13 (MSL 3.0): a shader that uses bfloat outside
// `#if defined(__HAVE_BFLOAT__)` then fails to compile (crates/gdn-ops/tests/msl30_shaders.rs).
#ifndef METAL_EMU_MSL30
typedef __bf16 bfloat;
#define __HAVE_BFLOAT__ 1
#endif
typedef _Float16 half;
typedef uint uint2 __attribute__((ext_vector_type(2)));
typedef uint uint3 __attribute__((ext_vector_type(3)));
typedef float float2 __attribute__((ext_vector_type(2)));
typedef float float4 __attribute__((ext_vector_type(4)));

static_assert(sizeof(ulong) == 8, "MSL ulong is 64-bit");

namespace metal_emu {

constexpr int kSimdWidth = 32;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "metal_emu: %s\n", what);
  std::abort();
}

// One simdgroup in flight: 32 lane fibers and the scheduler context they yield to.
class Simdgroup {
 public:
  explicit Simdgroup(std::size_t stack_bytes = 256 * 1024)
      : stack_bytes_(stack_bytes), stacks_(stack_bytes * kSimdWidth) {}

  // Runs body(lane) for lanes 0..31 to completion, in lock step at every simd_sum.
  template <class Body>
  void run(Body& body) {
    body_ = &body;
    invoke_ = [](void* b, uint lane) { (*static_cast<Body*>(b))(lane); };
    for (int lane = 0; lane < kSimdWidth; ++lane) {
      ucontext_t& c = lanes_[lane];
      if (getcontext(&c) != 0) fail("getcontext failed");
      c.uc_stack.ss_sp = stacks_.data() + stack_bytes_ * lane;
      c.uc_stack.ss_size = stack_bytes_;
      c.uc_link = &scheduler_;
      makecontext(&c, reinterpret_cast<void (*)()>(&Simdgroup::trampoline), 1, lane);
      state_[lane] = kRunnable;
    }
    Simdgroup* outer = current_;
    current_ = this;
    for (;;) {
      // One round: each lane runs until its next simd_sum or its end.
      for (int lane = 0; lane < kSimdWidth; ++lane) {
        if (state_[lane] == kDone) continue;
        lane_ = lane;
        state_[lane] = kRunnable;
        if (swapcontext(&scheduler_, &lanes_[lane]) != 0) fail("swapcontext failed");
      }
      int at_sum = 0;
      for (int lane = 0; lane < kSimdWidth; ++lane) at_sum += state_[lane] == kAtSum;
      if (at_sum == 0) break;
      if (at_sum != kSimdWidth) {
        fail("divergent simdgroup: some lanes reached simd_sum while others returned");
      }
      for (int lane = 1; lane < kSimdWidth; ++lane) {
        if (site_[lane] != site_[0]) fail("divergent simdgroup: lanes called simd_sum from different places");
      }
      reduce();
    }
    current_ = outer;
  }

  // The calling lane's contribution; returns once all 32 lanes have contributed.
  static float sum(float x, const void* site) {
    Simdgroup* sg = current_;
    if (sg == nullptr) fail("simd_sum called outside a simdgroup");
    const int lane = sg->lane_;
    sg->slot_[lane] = x;
    sg->site_[lane] = site;
    sg->state_[lane] = kAtSum;
    if (swapcontext(&sg->lanes_[lane], &sg->scheduler_) != 0) fail("swapcontext failed");
    return sg->result_;
  }

 private:
  enum LaneState { kRunnable, kAtSum, kDone };

  static void trampoline(int lane) {
    Simdgroup* sg = current_;
    sg->invoke_(sg->body_, uint(lane));
    sg->state_[lane] = kDone;
    // Returning resumes uc_link, the scheduler.
  }

  // A butterfly over lanes (xor 16, 8, 4, 2, 1), the shape of a hardware shuffle
  // reduction. Every lane ends with bitwise the same value, since a + b == b + a.
  void reduce() {
    float v[kSimdWidth];
    for (int i = 0; i < kSimdWidth; ++i) v[i] = slot_[i];
    for (int off = kSimdWidth / 2; off > 0; off /= 2) {
      float next[kSimdWidth];
      for (int i = 0; i < kSimdWidth; ++i) next[i] = v[i] + v[i ^ off];
      for (int i = 0; i < kSimdWidth; ++i) v[i] = next[i];
    }
    result_ = v[0];
  }

  static inline thread_local Simdgroup* current_ = nullptr;

  std::size_t stack_bytes_;
  std::vector<char> stacks_;
  ucontext_t scheduler_{};
  ucontext_t lanes_[kSimdWidth]{};
  LaneState state_[kSimdWidth]{};
  float slot_[kSimdWidth]{};
  const void* site_[kSimdWidth]{};
  float result_ = 0.0f;
  int lane_ = 0;
  void* body_ = nullptr;
  void (*invoke_)(void*, uint) = nullptr;
};

// The built-ins one thread of a dispatch sees.
struct ThreadIds {
  uint3 thread_position_in_grid;
  uint3 thread_position_in_threadgroup;
  uint3 threadgroup_position_in_grid;
  uint3 threads_per_threadgroup;
  uint thread_index_in_threadgroup;
  uint thread_index_in_simdgroup;
  uint simdgroup_index_in_threadgroup;
};

// dispatchThreadgroups(groups, threads_per_group): calls thread(ids) for every thread, one
// simdgroup (32 consecutive threads of a threadgroup, x fastest) at a time.
template <class Thread>
void dispatch_threadgroups(uint3 groups, uint3 per_group, Thread&& thread) {
  const uint group_threads = per_group.x * per_group.y * per_group.z;
  if (group_threads % kSimdWidth != 0) fail("threads per threadgroup must be a multiple of 32");
  Simdgroup sg;
  for (uint gz = 0; gz < groups.z; ++gz)
    for (uint gy = 0; gy < groups.y; ++gy)
      for (uint gx = 0; gx < groups.x; ++gx)
        for (uint first = 0; first < group_threads; first += kSimdWidth) {
          auto lane_body = [&](uint lane) {
            const uint linear = first + lane;
            ThreadIds ids;
            ids.thread_position_in_threadgroup =
                uint3{linear % per_group.x, (linear / per_group.x) % per_group.y,
                      linear / (per_group.x * per_group.y)};
            ids.threadgroup_position_in_grid = uint3{gx, gy, gz};
            ids.thread_position_in_grid = ids.threadgroup_position_in_grid * per_group +
                                          ids.thread_position_in_threadgroup;
            ids.threads_per_threadgroup = per_group;
            ids.thread_index_in_threadgroup = linear;
            ids.thread_index_in_simdgroup = lane;
            ids.simdgroup_index_in_threadgroup = first / kSimdWidth;
            thread(ids);
          };
          sg.run(lane_body);
        }
}

}  // namespace metal_emu

namespace metal {

// Not inline-able into the caller, so that the return address identifies the call site.
__attribute__((noinline)) inline float simd_sum(float x) {
  return metal_emu::Simdgroup::sum(x, __builtin_return_address(0));
}

}  // namespace metal
