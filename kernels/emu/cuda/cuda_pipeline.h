// Stand-in for CUDA's <cuda_pipeline.h> primitives (asynchronous global -> shared copies,
// cp.async) on the emulator of cuda_emu.h. A copy is not made when it is issued: the
// destination is filled with 0xFF bytes (NaN in f32, f16 and bf16) and the copy queued in the
// calling thread's open batch; __pipeline_commit closes the batch, and
// __pipeline_wait_prior(n) makes the copies of every closed batch of the calling thread but
// the n newest. So a kernel that reads a destination before the issuing thread has waited
// for it (or without the barrier after that wait, when the reader runs first), or that issues
// copies over data another thread still reads, reads NaN and fails its comparison, as a
// race on the GPU would make it fail at random. The size is 4, 8 or 16 bytes, with both
// addresses aligned to it, as cp.async requires.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace cuda_pipeline_emu {

struct Copy {
  void* dst;
  const void* src;
  std::size_t size;
};

struct ThreadQueue {
  std::vector<std::vector<Copy>> closed;  // oldest first
  std::vector<Copy> open;
};

inline ThreadQueue& queue() {
  static std::vector<ThreadQueue> queues;
  metal_emu::Threadgroup& tg = metal_emu::Threadgroup::current("__pipeline_*");
  if (queues.size() < tg.threads()) queues.resize(tg.threads());
  return queues[tg.thread_index()];
}

}  // namespace cuda_pipeline_emu

inline void __pipeline_memcpy_async(void* dst, const void* src, std::size_t size, std::size_t zfill = 0) {
  if (size != 4 && size != 8 && size != 16) metal_emu::fail("__pipeline_memcpy_async: size %zu is not 4, 8 or 16", size);
  if (zfill != 0) metal_emu::fail("__pipeline_memcpy_async: zfill is not emulated");
  if (reinterpret_cast<std::uintptr_t>(dst) % size != 0 || reinterpret_cast<std::uintptr_t>(src) % size != 0) {
    metal_emu::fail("__pipeline_memcpy_async: %p <- %p is not aligned to %zu bytes", dst, src, size);
  }
  std::memset(dst, 0xFF, size);
  cuda_pipeline_emu::queue().open.push_back({dst, src, size});
}

inline void __pipeline_commit() {
  cuda_pipeline_emu::ThreadQueue& q = cuda_pipeline_emu::queue();
  q.closed.push_back(std::move(q.open));
  q.open.clear();
}

inline void __pipeline_wait_prior(std::size_t prior) {
  cuda_pipeline_emu::ThreadQueue& q = cuda_pipeline_emu::queue();
  while (q.closed.size() > prior) {
    for (const cuda_pipeline_emu::Copy& c : q.closed.front()) std::memcpy(c.dst, c.src, c.size);
    q.closed.erase(q.closed.begin());
  }
}
