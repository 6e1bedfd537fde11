// The entry points of the verify window's recurrence: T tokens in one launch, the state after each kept (ops/gated_delta_norm_window). The body is kernels/gated_delta_norm.cu's; the
// entries live in a module of their own so that a process that never runs them never
// JIT-compiles them (see GDN_NORM_DECODE_KERNELS there).
//
// Compile for candle: nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/gated_delta_norm_window.cu

#define GDN_NORM_NO_ENTRY_POINTS
#include "gated_delta_norm.cu"

GDN_NORM_FOR_TYPES(GDN_NORM_WINDOW_KERNELS)
