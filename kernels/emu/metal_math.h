// The Metal math functions the fused decode kernels call, for their emulation harnesses
// (include after metal_emu.h or <metal_stdlib> and <cmath>, before the .metal file):
//  * FLT_MAX and the other <float.h> limits, which <metal_stdlib> has;
//  * float overloads of exp, log, fabs and sqrt at global scope (libstdc++'s <math.h> puts
//    std's there), so that unqualified calls in a kernel stay in float;
//  * metal::rsqrt, max, min and precise::cos/sin, which standard C++ lacks or names
//    differently;
//  * metal::as_type, the bit cast between types of one size (what a kernel tests a float's
//    bits with, where fast math may fold isfinite away).
// Metal's own (fast math by default) may be a few ulp off these correctly rounded ones; the
// tests' gates allow for that, and the kernels use `precise::` where accuracy at large
// arguments matters (RoPE angles).
#pragma once

#include <math.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace metal {

inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline uint min(uint a, uint b) { return a < b ? a : b; }

template <class To, class From>
inline To as_type(From x) {
  static_assert(sizeof(To) == sizeof(From), "as_type between types of one size");
  To to;
  std::memcpy(&to, &x, sizeof to);
  return to;
}

namespace precise {
inline float cos(float x) { return std::cos(x); }
inline float sin(float x) { return std::sin(x); }
}  // namespace precise

}  // namespace metal

static_assert(std::is_same<decltype(exp(1.0f)), float>::value, "exp(float) must stay in float");
static_assert(std::is_same<decltype(log(1.0f)), float>::value, "log(float) must stay in float");
static_assert(std::is_same<decltype(fabs(1.0f)), float>::value, "fabs(float) must stay in float");
