// The decode profile's spin (crates/gdn-ops/src/profile/cuda.rs): one thread that busy-waits
// `cycles` SM clock cycles. Queued on a drained stream ahead of the op being timed, it keeps
// the GPU busy while the host queues the start event and the op's launches, so that the
// events around the op measure its GPU time and not the host's launch latency.
//
// ENTRY POINT (extern "C"):
//   profile_spin(long long cycles)   grid = block = 1 thread.
//
// Compile for candle:  nvcc -ptx -arch=sm_90 -O3 kernels/profile_spin.cu -o profile_spin.ptx

extern "C" __global__ void profile_spin(long long cycles) {
  const long long start = clock64();
  // volatile: the loop must not be folded away.
  volatile long long now = start;
  while (now - start < cycles) now = clock64();
}
