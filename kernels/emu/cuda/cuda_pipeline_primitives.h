// Stand-in for CUDA's <cuda_pipeline_primitives.h> (see cuda_emu.h): the asynchronous copies
// to shared memory (cp.async) that kernels/affine_grouped.cu and kernels/gated_delta_chunk.cu
// double-buffer with.
//
// A copy is deferred, as on the GPU: __pipeline_memcpy_async fills the destination with 0xFF
// bytes (NaN in f32, f16 and bf16) and records the copy in the calling thread's open batch,
// __pipeline_commit closes the batch as a group, and __pipeline_wait_prior(n) performs the
// thread's oldest groups until at most n remain. So a kernel that reads a copy's destination
// before its own thread waited for it (or before a barrier after every copying thread waited),
// or that issues a copy over data another thread still reads, reads NaN and fails its
// comparison, as the race would make it fail at random on the GPU. Sizes are 4, 8 or 16 bytes, source and destination aligned to
// the size, and zfill (the trailing bytes written as zeros instead of copied) at most the size,
// as cp.async requires; anything else aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace cuda_emu_pipeline {

struct Copy {
  void* dst;
  const void* src;
  std::size_t size, zfill;
};

struct Thread {
  std::vector<Copy> open;
  std::vector<std::vector<Copy>> groups;  // committed, oldest first
};

// Per thread of the threadgroup running now (one threadgroup runs at a time).
inline std::vector<Thread>& threads() {
  static std::vector<Thread> all;
  metal_emu::Threadgroup& tg = metal_emu::Threadgroup::current("__pipeline_*");
  if (all.size() < tg.threads()) all.resize(tg.threads());
  return all;
}

inline Thread& me() { return threads()[metal_emu::Threadgroup::current("__pipeline_*").thread_index()]; }

inline void perform(const Copy& c) {
  std::memcpy(c.dst, c.src, c.size - c.zfill);
  std::memset(static_cast<char*>(c.dst) + (c.size - c.zfill), 0, c.zfill);
}

}  // namespace cuda_emu_pipeline

inline void __pipeline_memcpy_async(void* dst, const void* src, std::size_t size, std::size_t zfill = 0) {
  if (size != 4 && size != 8 && size != 16) metal_emu::fail("__pipeline_memcpy_async: %zu bytes (4, 8 or 16)", size);
  if (reinterpret_cast<std::uintptr_t>(dst) % size != 0 || reinterpret_cast<std::uintptr_t>(src) % size != 0)
    metal_emu::fail("__pipeline_memcpy_async: %p <- %p not aligned to %zu bytes", dst, src, size);
  if (zfill > size) metal_emu::fail("__pipeline_memcpy_async: zfill %zu > size %zu", zfill, size);
  std::memset(dst, 0xFF, size);
  cuda_emu_pipeline::me().open.push_back({dst, src, size, zfill});
}

inline void __pipeline_commit() {
  cuda_emu_pipeline::Thread& t = cuda_emu_pipeline::me();
  t.groups.push_back(std::move(t.open));
  t.open.clear();
}

inline void __pipeline_wait_prior(std::size_t prior) {
  cuda_emu_pipeline::Thread& t = cuda_emu_pipeline::me();
  while (t.groups.size() > prior) {
    for (const cuda_emu_pipeline::Copy& c : t.groups.front()) cuda_emu_pipeline::perform(c);
    t.groups.erase(t.groups.begin());
  }
}
