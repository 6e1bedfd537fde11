// The entry points of the one-pass dense products of 2..8 activation rows
// (`affine_stream_rows_*`, opt-in: QWEN_GDN_DENSE_ROWS=one-pass). The body
// (affine_stream::rows_body) and the entries' documentation are kernels/affine_stream.cu's;
// the entries live in a module of their own so that a process that never runs them never
// JIT-compiles them.
//
// Compile for candle: nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/affine_stream_rows.cu

#define AFFINE_STREAM_NO_ENTRY_POINTS
#include "affine_stream.cu"

CUDA_FOR_FLOAT_TYPE_PAIRS(AFFINE_STREAM_ROWS_FOR_TYPES)
