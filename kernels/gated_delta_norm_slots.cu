// The entry points of the batched step's recurrence: one launch for B sequences, each state addressed through the slot table (ops/gated_delta_norm_slots). The body is kernels/gated_delta_norm.cu's; the
// entries live in a module of their own so that a process that never runs them never
// JIT-compiles them (see GDN_NORM_DECODE_KERNELS there).
//
// Compile for candle: nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/gated_delta_norm_slots.cu

#define GDN_NORM_NO_ENTRY_POINTS
#include "gated_delta_norm.cu"

GDN_NORM_FOR_TYPES(GDN_NORM_SLOTS_KERNELS)
