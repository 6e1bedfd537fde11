// Programmatic dependent launch (Hopper, sm_90+), shared by every kernel of kernels/*.cu.
//
// The host launches our kernels with the programmatic-stream-serialization attribute
// (crates/gdn-ops/src/backend/cuda.rs, `launch`): a kernel may then be scheduled while the
// kernel before it in the stream is still running, instead of after it has drained. What that
// saves is the gap between two dependent kernels, a few µs, paid ~490 times a decode step.
// In exchange every kernel must wait for its predecessor before it reads or writes memory, so
// `cuda_pdl::enter()` is the first statement of every entry point:
//   1. griddepcontrol.wait: returns once the previous grid has completed and its writes are
//      visible (at once when the launch had no programmatic dependency, e.g. after one of
//      candle's kernels, or when the attribute is off);
//   2. griddepcontrol.launch_dependents: from now on the next kernel may be scheduled. Issued
//      only after the wait, so that at most one kernel waits behind a running one (a kernel
//      that released its successor at its very start would let a chain of waiting grids
//      take SM slots from the one doing the work).
// Because every kernel waits at its top, the completion order is the stream order, as without
// the attribute: a kernel reading what any earlier kernel wrote sees it.
// Elsewhere (older arch, the C++ emulation of kernels/emu/) both are nothing.
#pragma once

namespace cuda_pdl {

__device__ __forceinline__ void enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace cuda_pdl
