#!/usr/bin/env python3
"""JIT-compiles PTX modules into the driver's cache, one process per module, in parallel.

A fresh GPU machine compiles each PTX module the first time a process loads it, one module at
a time inside that process: our largest modules (affine_stream, gated_delta_norm: ~20 MB of
PTX each) take minutes, so a bench's first step can spend most of a call's budget compiling.
The driver keys its cache (CUDA_CACHE_PATH) by the PTX text, so loading the very bytes that the
binary embeds (the build's OUT_DIR *.ptx), each in its own process, fills the cache for the
binary at the cost of the slowest module. Used by the device scripts before the first test:

  python3 scripts/gpu/jit-prime.py DIR/*.ptx
"""
import ctypes
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def load(path):
    cuda = ctypes.CDLL("libcuda.so.1")
    if cuda.cuInit(0) != 0:
        return path, "cuInit failed", 0.0
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    cuda.cuCtxSetCurrent(ctx)
    with open(path, "rb") as f:
        image = f.read() + b"\0"
    module = ctypes.c_void_p()
    start = time.time()
    rc = cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image))
    return path, rc, time.time() - start


def main():
    paths = sorted(sys.argv[1:], key=os.path.getsize, reverse=True)
    start = time.time()
    with ProcessPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 4)) as pool:
        for path, rc, seconds in pool.map(load, paths):
            print(f"jit-prime: {os.path.basename(path)} rc={rc} {seconds:.1f} s", flush=True)
    print(f"jit-prime: {len(paths)} modules in {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
