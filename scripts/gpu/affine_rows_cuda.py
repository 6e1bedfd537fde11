#!/usr/bin/env python3
"""The one-pass streamed products over T = 2..8 dense rows (kernels/affine_stream.cu,
`affine_stream_rows_*`) against the one-row streamed kernel launched over T block rows
(`affine_stream_products_*`, grid (blocks, T): what the engine ran before) on a CUDA GPU:
the same bits per row, and their times at Qwen3-Next-80B's dense shapes (issues 28, 29).

  python3 affine_rows_cuda.py --ptx affine_stream.ptx

Geometry mirrors crates/gdn-ops/src/ops/affine/stream.rs (`launch`, `pass_launch`); the
one-pass grid is also swept over 1-8 blocks an SM. Times: graphs of 32 launches, each reading
another copy of the weights (together > the L2), median of 5 replays.
"""

import argparse
import ctypes
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from affine_decode_cuda import Matrix, Params, copy_bandwidth, lanes_per_row, time_graph  # noqa: E402
from affine_stream_cuda import launch_shared, run_stream, same_bits, steps_for, full_blocks  # noqa: E402
from gdn_cuda import Module, _cuda, check_cu  # noqa: E402

_cuda.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
SM_SHARED = 228 * 1024

SHAPES = [  # name, rows, cols, bits
    ("gdn.in_proj", 12352, 2048, 4),
    ("gdn.out_proj", 2048, 4096, 4),
    ("attn.qkv", 9216, 2048, 4),
    ("moe.router", 513, 2048, 8),
    ("lm_head", 151936, 2048, 4),
]


def pass_shared(m, t):
    return t * 4 * (m.cols + m.cols // (128 // m.bits))


def resident(steps):  # stream.rs resident_blocks(1, steps)
    return 8 if steps <= 2 else 4


def pass_blocks(m, t, sms):
    lpr = lanes_per_row(m.cols, m.bits)
    steps = steps_for(m.cols // (128 // m.bits), lpr)
    by_shared = SM_SHARED // (pass_shared(m, t) + 1024)
    return min(full_blocks(m.rows, lpr, 1), max(1, min(resident(steps), by_shared)) * sms)


def one_row_blocks(m, t, sms):  # stream.rs launch() for products at out_rows = t
    lpr = lanes_per_row(m.cols, m.bits)
    steps = steps_for(m.cols // (128 // m.bits), lpr)
    res = lambda r: 8 if r * steps <= 2 else 4 if r * steps <= 4 else 2
    target = lambda r: max(1, math.ceil(res(r) * sms / t))
    r = 2 if full_blocks(m.rows, lpr, 1) <= target(1) and full_blocks(m.rows, lpr, 2) * t >= sms else 1
    return r, min(full_blocks(m.rows, lpr, r), target(r))


def run_pass(mod, m, x, t, blocks, y):
    lpr = lanes_per_row(m.cols, m.bits)
    cap = 2 if t <= 2 else 4 if t <= 4 else 8  # stream.rs pass_capacity
    name = f"affine_stream_rows_b{m.bits}_t{cap}_s{steps_for(m.cols // (128 // m.bits), lpr)}_bf16_bf16"
    smem = pass_shared(m, t)
    check_cu(_cuda.cuFuncSetAttribute(mod.func(name), MAX_DYNAMIC_SHARED, smem), "cuFuncSetAttribute")
    p = Params(m.rows, m.cols, m.bits, m.group, t, 1, 0)
    launch_shared(mod, name, (blocks, 1, 1), (128, 1, 1), smem,
                  [("p", m.packed.data_ptr()), ("p", m.scales.data_ptr()), ("p", m.biases.data_ptr()),
                   ("p", x.data_ptr()), ("p", y.data_ptr()), ("s", p), ("u", lpr)])
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx", required=True)
    ap.add_argument("--rows", default="1,2,4,5,8")
    a = ap.parse_args()
    mod = Module(a.ptx)
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    bw = copy_bandwidth()
    print(f"device {props.name}, {sms} SMs, copy {bw / 1e9:.0f} GB/s")
    for n in ("affine_stream_products_b4_r1_s2_bf16_bf16", "affine_stream_rows_b4_t4_s2_bf16_bf16",
              "affine_stream_rows_b4_t8_s2_bf16_bf16", "affine_stream_rows_b4_t8_s4_bf16_bf16"):
        print(f"{n}: registers, local bytes {mod.regs(n)}")
    gen = torch.Generator(device="cuda").manual_seed(11)
    failures = 0
    print("| product | T | MB | one-row kernel over T block rows µs | one pass µs (host grid) | best one pass µs (blocks) | same bits |")
    print("|---|---|---|---|---|---|---|")
    for name, rows, cols, bits in SHAPES:
        per_copy = rows * (cols * bits // 8 + 2 * (cols // 64) * 2)  # packed + bf16 scales, biases
        copies = max(2, min(16, math.ceil(200e6 / per_copy)))
        mats = [Matrix(1, rows, cols, bits, 64, "bf16", gen) for _ in range(copies)]
        for t in [int(v) for v in a.rows.split(",")]:
            x = (torch.rand(t, cols, generator=gen, device="cuda") * 2 - 1).to(torch.bfloat16)
            ys = [torch.empty((t, rows), dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
            r, bx = one_row_blocks(mats[0], t, sms)
            n = 32
            t_old = time_graph([lambda k=k: run_stream(mod, mats[k % copies], x, None, 1, t, False, r, "bf16", "bf16", bx, ys[k % copies]) for k in range(n)])
            if t == 1:
                print(f"| {name} | 1 | {per_copy / 1e6:.1f} | {t_old:.2f} | - | - | - |")
                continue
            host = pass_blocks(mats[0], t, sms)
            t_host = time_graph([lambda k=k: run_pass(mod, mats[k % copies], x, t, host, ys[k % copies]) for k in range(n)])
            best = (t_host, host)
            for per_sm in (1, 2, 3, 4, 6, 8):
                b = min(full_blocks(rows, lanes_per_row(cols, bits), 1), per_sm * sms)
                if b == host or pass_shared(mats[0], t) * per_sm > SM_SHARED:
                    continue
                tt = time_graph([lambda k=k, b=b: run_pass(mod, mats[k % copies], x, t, b, ys[k % copies]) for k in range(n)])
                best = min(best, (tt, b))
            want = run_stream(mod, mats[0], x, None, 1, t, False, r, "bf16", "bf16", bx)
            got = run_pass(mod, mats[0], x, t, host, torch.empty((t, rows), dtype=torch.bfloat16, device="cuda"))
            torch.cuda.synchronize()
            same = same_bits(got, want)
            failures += not same
            print(f"| {name} | {t} | {per_copy / 1e6:.1f} | {t_old:.2f} | {t_host:.2f} ({host}) | {best[0]:.2f} ({best[1]}) | {same} |")
        del mats
        torch.cuda.empty_cache()
    print(f"RESULT: {'FAIL' if failures else 'ok'}: {failures} shapes differ in bits")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
