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
//  * Every thread of a threadgroup is a fiber, all of one threadgroup under one scheduler
//    (metal_emu_fibers.h), one threadgroup at a time. Simdgroup functions (simd_sum, simd_max,
//    simd_min, simd_prefix_{ex,in}clusive_sum for float/half/int/uint; simd_broadcast,
//    simd_broadcast_first, simd_shuffle, simd_shuffle_xor, simd_shuffle_down,
//    simd_shuffle_up for any scalar or vector; simd_any, simd_all, simd_is_first,
//    simdgroup_barrier; metal_emu_simd.h) are rendezvous of the 32 lanes, and
//    threadgroup_barrier(mem_flags::...) one of every thread of the threadgroup
//    (metal_emu_barrier.h). Simdgroup matrices (simdgroup_{float,half,bfloat}8x8 with load,
//    store, multiply, multiply_accumulate; metal_emu_simdgroup_matrix.h) are rendezvous too. A thread that skips one (divergence), reaches it from a
//    different place in the source (file:line:column of the call, so the optimizer's
//    duplicating or merging calls changes nothing; calls inside one helper share a place),
//    or returns while others wait aborts the run with a message, where a GPU would hang or
//    compute garbage; so do a broadcast lane, shuffle mask or delta that differ between
//    lanes, and a lane index past 31. Threads run in index order between rendezvous, so a
//    missing barrier can go unnoticed when the writer runs first.
//  * Threadgroup memory (a kernel argument `threadgroup T* p [[threadgroup(0)]]`):
//    dispatch_threadgroups(groups, per_group, bytes, thread) gives each threadgroup `bytes`
//    of fresh memory, filled with 0xFF (NaN in float, half and bfloat) so that reading what
//    no thread wrote poisons the result, ending at an inaccessible page; ThreadIds::
//    threadgroup_memory (or threadgroup_memory_as<T>()) passes it to the kernel. More than
//    32 KB, a length that is not a multiple of 16, or more than 1024 threads per threadgroup
//    abort (metal_emu_dispatch.h). `threadgroup float buf[N];` declared inside a kernel
//    does not compile here (C++ has no address-space locals): take it as that argument.
//  * `threadgroup` also has to work inside the argument attribute [[threadgroup(0)]], where
//    an address-space macro would leave `(0)` behind and fail to parse. So it expands to the
//    address space followed by `volatile`, and `volatile(...)` is a function-like macro that
//    swallows the index: in declarations `volatile` stays the keyword, so threadgroup
//    pointers are volatile-qualified here (copying a whole struct out of threadgroup memory
//    does not compile; elements and vectors do).
//  * __HAVE_BFLOAT__ is defined with bfloat, as Metal compilers do where it exists (not with
//    METAL_EMU_MSL30, which plays macOS 13).
//  * Attributes ([[kernel]], [[buffer(n)]], [[host_name(..)]], [[thread_position_in_grid]],
//    ...) are ignored; the harness passes the built-ins explicitly.
//
// Include every standard header a translation unit needs BEFORE this one: `device`,
// `constant` and `threadgroup` are macros from here on.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#pragma clang diagnostic ignored "-Wunknown-attributes"
#pragma clang diagnostic ignored "-Wkeyword-macro"

#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
// See the header comment: [[threadgroup(0)]] becomes [[__attribute__((address_space(3)))]],
// an unknown (ignored) attribute.
#define threadgroup __attribute__((address_space(3))) volatile
#define volatile(...)


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

#include "metal_emu_fibers.h"
#include "metal_emu_dispatch.h"
#include "metal_emu_simd.h"
#include "metal_emu_simdgroup_matrix.h"
#include "metal_emu_barrier.h"
