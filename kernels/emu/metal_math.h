// The Metal math functions the attention and norm kernels call, for their emulation
// harnesses: f32 versions from the C library. Metal's own (fast math by default) may differ
// by a few ulp; the tests' tolerances allow for it, and `precise::` is what the kernels use
// where accuracy at large arguments matters (RoPE angles).
//
// Include after metal_emu.h (or <metal_stdlib>) and <cmath>, before the .metal file.
#pragma once

#include <cmath>

namespace metal {

inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline float exp(float x) { return std::exp(x); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline uint min(uint a, uint b) { return a < b ? a : b; }

namespace precise {
inline float cos(float x) { return std::cos(x); }
inline float sin(float x) { return std::sin(x); }
}  // namespace precise

}  // namespace metal
