#!/usr/bin/env python3
"""The streamed decode products (kernels/affine_stream.cu) against the wide ones
(kernels/affine.cu, `affine_wide_*`) on a CUDA GPU: the same bits, and their times at
Qwen3-Next-80B-A3B's decode shapes (issue 25).

  python3 affine_stream_cuda.py --out DIR --wide affine.ptx --stream d2:stream2.ptx d4:stream4.ptx

1. Bits: every stream entry point (4/8 bits, groups 32/64/128, x and scales in f32/f16/bf16,
   1/2/4 rows a group, 8/16/32 lanes a row, gathered by id with x_div 1 and > 1, an
   out-of-range id, row counts that do not fill a block) at several grid widths gives exactly
   the wide kernel's output, and stays within the float64 reference's tolerance.
2. Time: each projection of one token, the wide kernel (the host's rows and every other
   choice) against the streamed one at grid widths of 1-8 blocks per SM, as graphs of 64
   launches each reading another copy of the weights (> 4x the L2), against the bytes floor.
"""

import argparse
import ctypes
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from affine_decode_cuda import (DT, SHAPES, WIDE_WARPS, Matrix, Params, choose_rows,  # noqa: E402
                                copy_bandwidth, lanes_per_row, rel_err, run_wide,
                                correctness_cases, time_graph, timing_inputs, TOLERANCE,
                                wide_geometry)
from gdn_cuda import Module, _cuda, check_cu  # noqa: E402


def launch_shared(mod, name, grid, block, shared, args):
    holders = []
    for kind, val in args:
        holders.append(ctypes.c_void_p(val) if kind == "p" else ctypes.c_uint32(val) if kind == "u" else val)
    params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    stream = torch.cuda.current_stream().cuda_stream
    rc = _cuda.cuLaunchKernel(mod.func(name), grid[0], grid[1], grid[2], block[0], block[1], block[2],
                              shared, ctypes.c_void_p(stream), params, None)
    check_cu(rc, f"cuLaunchKernel({name})")


def run_stream(mod, m, x, ids, x_div, out_rows, swiglu, r, xdt, sdt, blocks_x, y=None):
    outs = m.rows // 2 if swiglu else m.rows
    lpr = lanes_per_row(m.cols, m.bits)
    if y is None:
        y = torch.full((out_rows, outs), float("nan"), dtype=DT[xdt], device="cuda")
    kind = "swiglu" if swiglu else "products"
    chunks = m.cols // (128 // m.bits)
    name = f"affine_stream_{kind}_b{m.bits}_r{r}_s{steps_for(chunks, lpr)}_{xdt}_{sdt}"
    shared = 4 * (m.cols + chunks)
    p = Params(m.rows, m.cols, m.bits, m.group, out_rows, x_div, int(ids is not None))
    idp = ids.data_ptr() if ids is not None else m.packed.data_ptr()
    launch_shared(mod, name, (blocks_x, out_rows, 1), (WIDE_WARPS * 32, 1, 1), shared,
                  [("p", m.packed.data_ptr()), ("p", m.scales.data_ptr()), ("p", m.biases.data_ptr()),
                   ("p", x.data_ptr()), ("p", idp), ("p", y.data_ptr()), ("s", p), ("u", m.experts),
                   ("u", lpr)])
    return y


def steps_for(chunks, lpr):
    """Chunk steps of a lane per row, as the streamed kernels are instantiated (1, 2 or 4)."""
    s = -(-chunks // lpr)
    return 1 if s <= 1 else 2 if s <= 2 else 4


def full_blocks(outs, lpr, r):
    return wide_geometry(outs, 1, lpr, r)[0][0]


def same_bits(a, b):
    va = a.view(torch.int32) if a.dtype == torch.float32 else a.view(torch.int16)
    vb = b.view(torch.int32) if b.dtype == torch.float32 else b.view(torch.int16)
    return torch.equal(va, vb)


def correctness(wide, streams, log):
    gen = torch.Generator().manual_seed(7)
    failures = cases = 0

    def covered(cols, bits):  # at most the streamed kernels' 4 chunk steps a lane
        return -(-(cols // (128 // bits)) // lanes_per_row(cols, bits)) <= 4

    for c, m, x, ids, x_div, out_rows, want in correctness_cases(
            gen, ("f32", "bf16"), lambda swiglu: (1,) if swiglu else (1, 2), covered):
        swiglu, r, xdt, sdt = c["swiglu"], c["r"], c["xdt"], c["sdt"]
        outs = m.rows // 2 if swiglu else m.rows
        base = run_wide(wide, m, x, ids, x_div, out_rows, swiglu, r, xdt, sdt)
        full = full_blocks(outs, lanes_per_row(m.cols, m.bits), r)
        for tag, mod in streams.items():
            for bx in sorted({1, 3, full}):
                got = run_stream(mod, m, x, ids, x_div, out_rows, swiglu, r, xdt, sdt, bx)
                torch.cuda.synchronize()
                err = rel_err(got, want)
                ok = err <= TOLERANCE[xdt] and same_bits(got, base)
                cases += 1
                if not ok:
                    failures += 1
                    print(f"FAIL {tag} {c} blocks {bx}: rel err {err:.3g}, same bits as wide "
                          f"{same_bits(got, base)}", file=log)
    return cases, failures


def timing(wide, streams, bw, sms, log):
    gen = torch.Generator(device="cuda").manual_seed(11)
    table = []
    for shape in SHAPES:
        (name, experts, rows, cols, bits, slots, xrows, swiglu) = shape
        copies, mats, x, ids, x_div, outs, read, _, floor_us = timing_inputs(shape, gen, bw)
        n = 64
        lpr = lanes_per_row(cols, bits)
        auto = choose_rows(outs, slots, lpr, swiglu, sms)
        ys = [torch.empty((slots, outs), dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
        t_wide = {r: time_graph([lambda k=k, r=r: run_wide(wide, mats[k % copies], x, ids[k % copies], x_div, slots, swiglu, r, "bf16", "bf16")
                                 for k in range(n)]) for r in ((1, 2) if swiglu else (1, 2, 4))}
        best = None
        results = {}
        for tag, mod in streams.items():
            for r in ((1,) if swiglu else (1, 2)):
                full = full_blocks(outs, lpr, r)
                for per_sm in (1, 2, 3, 4, 6, 8, 0):
                    bx = full if per_sm == 0 else max(1, min(full, math.ceil(per_sm * sms / slots)))
                    key = (tag, r, bx)
                    if key in results:
                        continue
                    t = time_graph([lambda k=k, r=r, bx=bx: run_stream(mod, mats[k % copies], x, ids[k % copies], x_div, slots, swiglu, r, "bf16", "bf16", bx, ys[k % copies])
                                    for k in range(n)])
                    results[key] = t
                    print(f"{name}: stream {tag} r{r} blocks {bx}x{slots}: {t:.2f} us", file=log)
                    if best is None or t < best[0]:
                        best = (t, tag, r, bx)
        a = run_wide(wide, mats[0], x, ids[0], x_div, slots, swiglu, auto, "bf16", "bf16")
        b = run_stream(streams[best[1]], mats[0], x, ids[0], x_div, slots, swiglu, best[2], "bf16", "bf16", best[3])
        torch.cuda.synchronize()
        print(f"{name}: wide {t_wide} auto r{auto}; best stream {best}; same bits {same_bits(a, b)}", file=log)
        table.append((name, read, floor_us, t_wide, auto, best, results))
        del mats
        torch.cuda.empty_cache()
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--wide", required=True)
    ap.add_argument("--stream", nargs="+", required=True, help="tag:path.ptx")
    ap.add_argument("--skip-bits", action="store_true")
    ap.add_argument("--ncu", default="", help="tag:rows:per_sm: three eager launches of the wide and "
                    "of that streamed kernel on the GDN in-projection and the experts' gate/up, for ncu")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "affine_stream.log"), "w")
    wide = Module(a.wide)
    streams = {s.split(":")[0]: Module(s.split(":", 1)[1]) for s in a.stream}
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(f"device: {props.name}, {sms} SMs", file=log)
    for tag, mod in streams.items():
        for n in ("affine_stream_products_b4_r2_s2_bf16_bf16", "affine_stream_swiglu_b4_r1_s2_bf16_bf16", "affine_stream_products_b4_r1_s4_bf16_bf16"):
            print(f"{tag} {n}: registers, local bytes {mod.regs(n)}", file=log)
    if a.ncu:
        tag, r, per_sm = a.ncu.split(":")
        gen = torch.Generator(device="cuda").manual_seed(5)
        for (name, experts, rows, cols, bits, slots, xrows, swiglu) in SHAPES:
            if name not in ("gdn.in_proj", "moe.gate_up"):
                continue
            mats = [Matrix(experts, rows, cols, bits, 64, "bf16", gen) for _ in range(4)]
            x = (torch.rand(xrows, cols, generator=gen, device="cuda") * 2 - 1).to(torch.bfloat16)
            ids = torch.randperm(experts, generator=gen, device="cuda")[:slots].to(torch.int32) if experts > 1 else None
            x_div = 1 if xrows == slots else slots
            outs = rows // 2 if swiglu else rows
            auto = choose_rows(outs, slots, lanes_per_row(cols, bits), swiglu, sms)
            rr = 1 if swiglu else int(r)
            bx = max(1, math.ceil(int(per_sm) * sms / slots))
            for k in range(3):
                run_wide(wide, mats[k], x, ids, x_div, slots, swiglu, auto, "bf16", "bf16")
                run_stream(streams[tag], mats[k + 1], x, ids, x_div, slots, swiglu, rr, "bf16", "bf16", bx)
            torch.cuda.synchronize()
        return
    failures = 0
    if not a.skip_bits:
        cases, failures = correctness(wide, streams, log)
        print(f"bits: {cases - failures}/{cases} cases equal the wide kernel and pass the reference")
        log.flush()
    bw = copy_bandwidth()
    table = timing(wide, streams, bw, sms, log)
    log.close()
    print(f"\ncopy bandwidth {bw / 1e9:.0f} GB/s; {props.name}, {sms} SMs")
    print("| projection | MB | floor us | wide us, host's rows (GB/s) | best streamed us (GB/s): depth, rows, blocks | the three fastest streamed |")
    print("|---|---|---|---|---|---|")
    tw = ts = tf = 0.0
    for (name, nbytes, floor_us, t_wide, auto, best, results) in table:
        t, tag, r, bx = best
        tw, ts, tf = tw + t_wide[auto], ts + t, tf + floor_us
        near = ", ".join(f"{tg} b{b}: {v:.2f}" for (tg, rr, b), v in sorted(results.items(), key=lambda kv: kv[1])[:3])
        print(f"| {name} | {nbytes / 1e6:.2f} | {floor_us:.2f} | {t_wide[auto]:.2f} ({nbytes / t_wide[auto] / 1e3:.0f}) | "
              f"{t:.2f} ({nbytes / t / 1e3:.0f}): {tag}, r{r}, {bx} | {near} |")
    print(f"sum over one of each: floor {tf:.1f} us, wide {tw:.1f} us, best streamed {ts:.1f} us")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
