// Metal's barriers for metal_emu.h. threadgroup_barrier is a rendezvous of every thread of
// the threadgroup (see metal_emu_fibers.h): Metal requires all of them to reach the same
// barrier, so a thread that returns while others wait, or waits at a different barrier,
// aborts the run. Fibers share one address space and run one at a time, so the memory
// ordering the flags ask for holds trivially; they only have to agree. Included by
// metal_emu.h only.
#pragma once

namespace metal {

enum class mem_flags : unsigned {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
};

constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(unsigned(a) | unsigned(b)); }

// The Site argument is filled in at the kernel's call (see metal_emu_fibers.h).
inline void threadgroup_barrier(mem_flags flags, metal_emu::Site site = metal_emu::Site::here()) {
  metal_emu::Threadgroup::current("threadgroup_barrier").barrier(site, unsigned(flags));
}

// A rendezvous of the simdgroup only.
inline void simdgroup_barrier(mem_flags flags, metal_emu::Site site = metal_emu::Site::here()) {
  metal_emu::simd_collective<bool>("simdgroup_barrier", &metal_emu::simd_rendezvous, false, unsigned(flags), site);
}

}  // namespace metal
