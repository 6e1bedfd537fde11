// A block's shared memory for the CUDA harnesses: `floats` floats, 128-byte aligned as
// __align__(128) extern __shared__ memory, in a guarded buffer (writes past its slack are
// caught by check()), and NaN before each block, so that a read of what no thread of the
// block wrote poisons the result. Include after guarded_buffer.h and cuda_emu.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

struct BlockShared {
  guarded::Buffer<float> buffer;
  float* smem;
  std::size_t floats;

  explicit BlockShared(std::size_t n)
      : buffer("shared memory", n + 32, guarded::Kind::kInPlace),
        smem(reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(buffer.data()) + 127) & ~std::uintptr_t(127))),
        floats(n) {
    buffer.fill(std::vector<float>(n + 32, 0.f));
  }
  BlockShared(const BlockShared&) = delete;
  BlockShared& operator=(const BlockShared&) = delete;

  // Call first thing in every thread of a block: thread 0 runs first, and poisons.
  void poison(const metal_emu::ThreadIds& id) {
    if (id.thread_index_in_threadgroup == 0) {
      for (std::size_t i = 0; i < floats; ++i) smem[i] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  void check() const { buffer.check(); }
};
