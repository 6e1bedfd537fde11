// dispatchThreadgroups for metal_emu.h: the built-ins each thread sees, the threadgroup
// memory a kernel's [[threadgroup(0)]] argument points to, and the loop over the grid, one
// whole threadgroup at a time. Included by metal_emu.h only.
#pragma once

namespace metal_emu {

// The built-ins one thread of a dispatch sees.
struct ThreadIds {
  uint3 thread_position_in_grid;
  uint3 thread_position_in_threadgroup;
  uint3 threadgroup_position_in_grid;
  uint3 threads_per_threadgroup;
  uint3 threadgroups_per_grid;
  uint thread_index_in_threadgroup;
  uint thread_index_in_simdgroup;
  uint simdgroup_index_in_threadgroup;
  uint simdgroups_per_threadgroup;
  // This threadgroup's memory (setThreadgroupMemoryLength:atIndex:0); null when the dispatch
  // asked for none.
  threadgroup char* threadgroup_memory;

  // The same memory as the kernel argument's type, e.g. threadgroup_memory_as<float>().
  template <class T>
  threadgroup T* threadgroup_memory_as() const {
    return (threadgroup T*)threadgroup_memory;
  }
};

// One threadgroup's memory, reused for every threadgroup of a dispatch but refilled with
// 0xFF bytes before each (a NaN in float, half and bfloat), so that a read of memory no
// thread of this threadgroup wrote poisons the result. It ends at an inaccessible page: a
// read or write past its end faults.
class ThreadgroupMemory {
 public:
  explicit ThreadgroupMemory(std::size_t bytes) : bytes_(bytes) {
    if (bytes > kMaxThreadgroupMemory) {
      fail("%zu bytes of threadgroup memory requested; Metal allows at most %zu", bytes, kMaxThreadgroupMemory);
    }
    if (bytes % 16 != 0) fail("threadgroup memory length %zu is not a multiple of 16 bytes, as Metal requires", bytes);
    if (bytes == 0) return;
    const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
    body_ = (bytes + page - 1) / page * page;
    void* m = mmap(nullptr, body_ + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail("cannot map threadgroup memory");
    base_ = static_cast<char*>(m);
    if (mprotect(base_ + body_, page, PROT_NONE) != 0) fail("mprotect failed");
    page_ = page;
  }
  ThreadgroupMemory(const ThreadgroupMemory&) = delete;
  ThreadgroupMemory& operator=(const ThreadgroupMemory&) = delete;
  ~ThreadgroupMemory() {
    if (base_ != nullptr) munmap(base_, body_ + page_);
  }

  // Fresh contents for the next threadgroup.
  threadgroup char* fresh() {
    if (base_ == nullptr) return nullptr;
    char* data = base_ + body_ - bytes_;
    std::memset(data, 0xFF, bytes_);
    return (threadgroup char*)data;
  }

 private:
  std::size_t bytes_, body_ = 0, page_ = 0;
  char* base_ = nullptr;
};

// dispatchThreadgroups(groups, per_group) with threadgroup_bytes of threadgroup memory:
// calls thread(ids) for every thread, all threads of one threadgroup as fibers under one
// scheduler (so barriers and simdgroup functions rendezvous), one threadgroup at a time.
template <class Thread>
void dispatch_threadgroups(uint3 groups, uint3 per_group, std::size_t threadgroup_bytes, Thread&& thread) {
  const unsigned long long group_threads =
      (unsigned long long)per_group.x * per_group.y * per_group.z;
  if (group_threads == 0 || group_threads > kMaxThreadsPerThreadgroup) {
    fail("%llu threads per threadgroup; Metal allows 1 to %u", group_threads, kMaxThreadsPerThreadgroup);
  }
  // Partial simdgroups exist on Metal, but the emulator's simdgroup functions assume 32 lanes.
  if (group_threads % kSimdWidth != 0) fail("threads per threadgroup must be a multiple of 32");
  ThreadgroupMemory memory(threadgroup_bytes);
  Threadgroup tg{static_cast<unsigned>(group_threads)};
  for (uint gz = 0; gz < groups.z; ++gz)
    for (uint gy = 0; gy < groups.y; ++gy)
      for (uint gx = 0; gx < groups.x; ++gx) {
        threadgroup char* shared = memory.fresh();
        auto body = [&](unsigned linear) {
          ThreadIds ids;
          ids.thread_position_in_threadgroup =
              uint3{linear % per_group.x, (linear / per_group.x) % per_group.y, linear / (per_group.x * per_group.y)};
          ids.threadgroup_position_in_grid = uint3{gx, gy, gz};
          ids.thread_position_in_grid =
              ids.threadgroup_position_in_grid * per_group + ids.thread_position_in_threadgroup;
          ids.threads_per_threadgroup = per_group;
          ids.threadgroups_per_grid = groups;
          ids.thread_index_in_threadgroup = linear;
          ids.thread_index_in_simdgroup = linear % kSimdWidth;
          ids.simdgroup_index_in_threadgroup = linear / kSimdWidth;
          ids.simdgroups_per_threadgroup = uint(group_threads / kSimdWidth);
          ids.threadgroup_memory = shared;
          thread(ids);
        };
        tg.run(body);
      }
}

// The same without threadgroup memory.
template <class Thread>
void dispatch_threadgroups(uint3 groups, uint3 per_group, Thread&& thread) {
  dispatch_threadgroups(groups, per_group, 0, static_cast<Thread&&>(thread));
}

}  // namespace metal_emu
