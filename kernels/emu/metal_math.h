// The Metal math functions the GDN decode kernels call, for their emulation (include before
// the .metal file): float overloads of exp, log, fabs and sqrt at global scope (libstdc++'s
// <math.h> puts std's there), and metal::rsqrt, which standard C++ lacks. Metal's own may be
// a few ulp off these correctly rounded ones; the tests' gates allow for that.
#pragma once

#include <math.h>

#include <cmath>
#include <type_traits>

namespace metal {
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
}  // namespace metal

static_assert(std::is_same<decltype(exp(1.0f)), float>::value, "exp(float) must stay in float");
static_assert(std::is_same<decltype(log(1.0f)), float>::value, "log(float) must stay in float");
static_assert(std::is_same<decltype(fabs(1.0f)), float>::value, "fabs(float) must stay in float");
