#!/usr/bin/env python3
"""Check and time the decode step's quantized products (kernels/affine.cu) alone on a CUDA GPU:
the one-warp-per-row kernel (`affine_products_*`, `affine_products_swiglu_*`) against the wide
kernels (`affine_wide_{products,swiglu}_b<bits>_r<rows>_*`), at Qwen3-Next-80B-A3B's decode
shapes. Run on the device machine through scripts/gpu/bench-affine-decode.sh.

  python3 affine_decode_cuda.py --out DIR --old old.ptx --new new.ptx

The PTX is loaded as candle loads it (cuModuleLoadData, gdn_cuda.py's `Module`) and launched
with the geometry of crates/gdn-ops/src/ops/affine/cuda.rs (`wide_geometry` below is its
mirror: keep the two in step).

1. Correctness of every wide entry point (4 and 8 bits, groups 32/64/128, x and scales in
   f32/f16/bf16, 1/2/4 rows per row group, 8/16/32 lanes per row, gathered by id with x_div 1
   and > 1, an out-of-range id giving NaN, row counts that do not fill a block) against a torch
   float64 reference with the kernels' semantics (w = s * q + b), NaN-poisoned outputs, every
   case twice (bit-identical).
2. Timing at the decode shapes (bf16 x and scales, group 64): each projection of one token,
   old kernel vs wide kernel (the host's choice of rows per group, and every other choice),
   against the bytes floor at the measured copy bandwidth. Each timed launch reads one of
   several copies of the weights (together > 4x the 50 MB L2), as a decode step does (its
   2.2 GB never stay in L2); a CUDA graph of 64 launches is replayed and timed with events.
"""

import argparse
import ctypes
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gdn_cuda import Module  # noqa: E402

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
WIDE_WARPS = 4


class Params(ctypes.Structure):
    """AffineParams of kernels/params/affine.h."""
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("rows", "cols", "bits", "group_size", "out_rows", "x_div", "has_ids")]


def launch(mod, name, grid, block, args):
    """args: ('p', ptr) | ('u', u32) | ('s', ctypes struct)."""
    from gdn_cuda import _cuda, check_cu
    holders = []
    for kind, val in args:
        if kind == "p":
            holders.append(ctypes.c_void_p(val))
        elif kind == "u":
            holders.append(ctypes.c_uint32(val))
        else:
            holders.append(val)
    params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    stream = torch.cuda.current_stream().cuda_stream
    rc = _cuda.cuLaunchKernel(mod.func(name), grid[0], grid[1], grid[2], block[0], block[1], block[2],
                              0, ctypes.c_void_p(stream), params, None)
    check_cu(rc, f"cuLaunchKernel({name})")


def lanes_per_row(cols, bits):
    chunks = cols // (128 // bits)
    return 32 if chunks >= 32 else 16 if chunks >= 16 else 8


def choose_rows(outputs, out_rows, lpr, swiglu, sms):
    """The host's choice (ops/affine/wide.rs `rows_per_group`): 2 rows a group for the products
    while that gives every SM a block, else 1; 1 for the SwiGLU."""
    if not swiglu and math.ceil(outputs / (WIDE_WARPS * (32 // lpr) * 2)) * out_rows >= sms:
        return 2
    return 1


def wide_geometry(outputs, out_rows, lpr, r):
    per_block = WIDE_WARPS * (32 // lpr) * r
    return (math.ceil(outputs / per_block), out_rows, 1), (WIDE_WARPS * 32, 1, 1)


class Matrix:
    """A stacked [E, rows, cols] MLX affine matrix on the GPU."""

    def __init__(self, experts, rows, cols, bits, group, sdt, gen):
        self.experts, self.rows, self.cols, self.bits, self.group = experts, rows, cols, bits, group
        words = cols * bits // 32
        dev = gen.device  # a CUDA generator makes the large timing matrices in place
        self.packed = torch.randint(-2**31, 2**31, (experts * rows, words), dtype=torch.int64,
                                    generator=gen, device=dev).to(torch.int32).cuda()
        g = cols // group
        # As a real conversion: w = s q + b centred on 0, |w| up to ~0.02 at every width.
        s = (torch.rand(experts * rows, g, generator=gen, device=dev) * 0.8 + 0.2) * 0.04 / ((1 << bits) - 1)
        b = -s * ((1 << bits) - 1) / 2 + (torch.rand(experts * rows, g, generator=gen, device=dev) - 0.5) * 0.002
        self.scales, self.biases = s.to(DT[sdt]).cuda(), b.to(DT[sdt]).cuda()

    def nbytes(self, rows_read):
        per_row = self.cols * self.bits // 8 + 2 * (self.cols // self.group) * self.scales.element_size()
        return rows_read * per_row

    def dense(self):
        """float64 weights [E * rows, cols]: s * q + b in f32, as the kernels compute w."""
        per = 32 // self.bits
        p = self.packed.to(torch.int64) & 0xFFFFFFFF
        q = torch.stack([(p >> (self.bits * k)) & ((1 << self.bits) - 1) for k in range(per)], dim=-1)
        q = q.reshape(p.shape[0], self.cols).to(torch.float32)
        s = self.scales.float().repeat_interleave(self.group, dim=1)
        b = self.biases.float().repeat_interleave(self.group, dim=1)
        return (s * q + b).double()


def reference(m, x, ids, x_div, out_rows, swiglu, xdt):
    w = m.dense()
    outs = m.rows // 2 if swiglu else m.rows
    y = torch.empty(out_rows, outs, dtype=torch.float64, device="cuda")
    for i in range(out_rows):
        e = int(ids[i]) if ids is not None else 0
        xr = x[i // x_div].double()
        if e >= m.experts:
            y[i] = float("nan")
            continue
        rows = w[e * m.rows:(e + 1) * m.rows] @ xr
        if swiglu:
            g = rows[:outs].to(DT[xdt]).double()
            u = rows[outs:].to(DT[xdt]).double()
            rows = g / (1 + torch.exp(-g)) * u
        y[i] = rows
    return y


def run_wide(mod, m, x, ids, x_div, out_rows, swiglu, r, xdt, sdt):
    outs = m.rows // 2 if swiglu else m.rows
    lpr = lanes_per_row(m.cols, m.bits)
    grid, block = wide_geometry(outs, out_rows, lpr, r)
    y = torch.full((out_rows, outs), float("nan"), dtype=DT[xdt], device="cuda")
    kind = "swiglu" if swiglu else "products"
    name = f"affine_wide_{kind}_b{m.bits}_r{r}_{xdt}_{sdt}"
    p = Params(m.rows, m.cols, m.bits, m.group, out_rows, x_div, int(ids is not None))
    idp = ids.data_ptr() if ids is not None else m.packed.data_ptr()
    launch(mod, name, grid, block, [("p", m.packed.data_ptr()), ("p", m.scales.data_ptr()),
                                    ("p", m.biases.data_ptr()), ("p", x.data_ptr()), ("p", idp),
                                    ("p", y.data_ptr()), ("s", p), ("u", m.experts), ("u", lpr)])
    return y


def run_old(mod, m, x, ids, x_div, out_rows, swiglu, xdt, sdt):
    outs = m.rows // 2 if swiglu else m.rows
    y = torch.full((out_rows, outs), float("nan"), dtype=DT[xdt], device="cuda")
    name = f"affine_products_{'swiglu_' if swiglu else ''}{xdt}_{sdt}"
    p = Params(m.rows, m.cols, m.bits, m.group, out_rows, x_div, int(ids is not None))
    idp = ids.data_ptr() if ids is not None else m.packed.data_ptr()
    launch(mod, name, (math.ceil(outs / 8), out_rows, 1), (32, 8, 1),
           [("p", m.packed.data_ptr()), ("p", m.scales.data_ptr()), ("p", m.biases.data_ptr()),
            ("p", x.data_ptr()), ("p", idp), ("p", y.data_ptr()), ("s", p), ("u", m.experts)])
    return y


def rel_err(got, want):
    got, want = got.double(), want.double()
    nan_g, nan_w = torch.isnan(got), torch.isnan(want)
    if not torch.equal(nan_g, nan_w):
        return float("inf")
    g, w = got[~nan_w], want[~nan_w]
    return float(torch.linalg.norm(g - w) / max(float(torch.linalg.norm(w)), 1e-30))


TOLERANCE = {"f32": 2e-5, "f16": 2e-3, "bf16": 8e-3}


def correctness_cases(gen, scale_types, rows_choices, covered=lambda cols, bits: True):
    """The checked cases: 4 and 8 bits, groups 32/64/128, 256-4096 columns, each scale and x
    type, both kinds, each rows-per-group choice (`rows_choices(swiglu)`), one token with one
    and four slots (an out-of-range id among them: NaN) and two tokens with a row of x per
    slot. Yields (case, m, x, ids, x_div, out_rows, want), case a dict of the parameters."""
    for bits in (4, 8):
        for group in (32, 64, 128):
            for cols in (256, 512, 2048, 4096):
                if cols % group:
                    continue
                for sdt in scale_types:
                    for xdt in ("f32", "f16", "bf16"):
                        for swiglu in (False, True):
                            rows = 2 * (5 + int(torch.randint(0, 60, (1,), generator=gen)))
                            experts = 3
                            m = Matrix(experts, rows, cols, bits, group, sdt, gen)
                            if not covered(cols, bits):
                                continue
                            for r in rows_choices(swiglu):
                                for (tokens, slots, per_slot) in ((1, 1, False), (1, 4, False), (2, 3, True)):
                                    out_rows = tokens * slots
                                    ids = torch.randint(0, experts, (out_rows,), generator=gen, dtype=torch.int32)
                                    if slots == 4:
                                        ids[2] = experts + 5  # out of range: NaN
                                    ids = ids.cuda()
                                    xr = out_rows if per_slot else tokens
                                    x = (torch.rand(xr, cols, generator=gen) * 2 - 1).to(DT[xdt]).cuda()
                                    x_div = 1 if per_slot else slots
                                    want = reference(m, x, ids, x_div, out_rows, swiglu, xdt)
                                    case = dict(bits=bits, group=group, cols=cols, sdt=sdt, xdt=xdt, swiglu=swiglu,
                                                r=r, tokens=tokens, slots=slots)
                                    yield case, m, x, ids, x_div, out_rows, want


def correctness(mod, log):
    gen = torch.Generator().manual_seed(7)
    tol = TOLERANCE
    failures, cases = 0, 0
    for c, m, x, ids, x_div, out_rows, want in correctness_cases(
            gen, ("f32", "f16", "bf16"), lambda swiglu: (1, 2) if swiglu else (1, 2, 4)):
        swiglu, r, xdt, sdt = c["swiglu"], c["r"], c["xdt"], c["sdt"]
        a = run_wide(mod, m, x, ids, x_div, out_rows, swiglu, r, xdt, sdt)
        b = run_wide(mod, m, x, ids, x_div, out_rows, swiglu, r, xdt, sdt)
        torch.cuda.synchronize()
        err = rel_err(a, want)
        same = torch.equal(a.view(torch.int8) if a.dtype != torch.float32 else a.view(torch.int32),
                           b.view(torch.int8) if b.dtype != torch.float32 else b.view(torch.int32))
        ok = err <= tol[xdt] and same
        cases += 1
        if not ok:
            failures += 1
            worst = int(torch.argmax((a.double() - want).abs().nan_to_num(float("inf"))))
            print(f"  worst at {worst}: got {a.flatten()[worst].item()} want {want.flatten()[worst].item()}; "
                  f"max|want| {want.abs().max().item():.4g} max|got| {a.double().abs().max().item():.4g}", file=log)
            print(f"FAIL {c}: rel err {err:.3g} (tol {tol[xdt]}), repeat identical {same}", file=log)
    # A dense (no ids) product too.
    m = Matrix(1, 77, 2048, 4, 64, "bf16", gen)
    x = (torch.rand(1, 2048, generator=gen) * 2 - 1).to(torch.bfloat16).cuda()
    for r in (1, 2, 4):
        want = reference(m, x, None, 1, 1, False, "bf16")
        got = run_wide(mod, m, x, None, 1, 1, False, r, "bf16", "bf16")
        torch.cuda.synchronize()
        cases += 1
        if rel_err(got, want) > tol["bf16"]:
            failures += 1
            print(f"FAIL dense r{r}: {rel_err(got, want):.3g}", file=log)
    return cases, failures


def copy_bandwidth():
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); dst.copy_(src); b.record(); b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    return 2 * n / statistics.median(times)


def time_graph(fns, reps=5):
    """Median microseconds per call over a graph of the calls, replayed `reps` times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns[:3]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(fns))
    return statistics.median(times)


# Qwen3-Next-80B-A3B, one decoded token: (name, experts, rows, cols, bits, out_rows (slots),
# x rows, swiglu).
SHAPES = [
    ("gdn.in_proj", 1, 12352, 2048, 4, 1, 1, False),
    ("gdn.out_proj", 1, 2048, 4096, 4, 1, 1, False),
    ("attn.qkv", 1, 9216, 2048, 4, 1, 1, False),
    ("attn.o_proj", 1, 2048, 4096, 4, 1, 1, False),
    ("moe.router", 1, 513, 2048, 8, 1, 1, False),
    ("moe.gate_up", 513, 1024, 2048, 4, 11, 1, True),
    ("moe.down", 513, 2048, 512, 4, 11, 11, False),
    ("lm_head", 1, 151936, 2048, 4, 1, 1, False),
]


def timing_inputs(shape, gen, bw):
    """One decode shape's timing inputs: copies of the weights together larger than the L2
    (each timed launch reads the next), x, the expert ids per copy, and the bytes floor."""
    (name, experts, rows, cols, bits, slots, xrows, swiglu) = shape
    per_copy = Matrix(1, 1, cols, bits, 64, "bf16", gen).nbytes(experts * rows)
    copies = max(2, min(16, math.ceil(200e6 / per_copy)))
    mats = [Matrix(experts, rows, cols, bits, 64, "bf16", gen) for _ in range(copies)]
    x = (torch.rand(xrows, cols, generator=gen, device="cuda") * 2 - 1).to(torch.bfloat16)
    ids = [torch.randperm(experts, generator=gen, device="cuda")[:slots].to(torch.int32) if experts > 1 else None
           for _ in range(copies)]
    x_div = 1 if xrows == slots else slots
    outs = rows // 2 if swiglu else rows
    read = mats[0].nbytes(slots * rows) + x.numel() * 2
    written = slots * outs * 2
    return copies, mats, x, ids, x_div, outs, read, written, (read + written) / bw * 1e6


def timing(old, new, bw, sms, log):
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows_out = []
    for shape in SHAPES:
        (name, experts, rows, cols, bits, slots, xrows, swiglu) = shape
        copies, mats, x, ids, x_div, outs, read, written, floor_us = timing_inputs(shape, gen, bw)
        n = 64
        t_old = time_graph([lambda k=k: run_old(old, mats[k % copies], x, ids[k % copies], x_div, slots, swiglu, "bf16", "bf16")
                            for k in range(n)])
        lpr = lanes_per_row(cols, bits)
        auto = choose_rows(outs, slots, lpr, swiglu, sms)
        t_new = {}
        for r in ((1, 2) if swiglu else (1, 2, 4)):
            t_new[r] = time_graph([lambda k=k, r=r: run_wide(new, mats[k % copies], x, ids[k % copies], x_div, slots, swiglu, r, "bf16", "bf16")
                                   for k in range(n)])
        # The wide kernel against the old one on these inputs.
        a = run_old(old, mats[0], x, ids[0], x_div, slots, swiglu, "bf16", "bf16")
        b = run_wide(new, mats[0], x, ids[0], x_div, slots, swiglu, auto, "bf16", "bf16")
        torch.cuda.synchronize()
        diff = rel_err(b, a)
        grid, _ = wide_geometry(outs, slots, lpr, auto)
        rows_out.append((name, read + written, floor_us, t_old, t_new, auto, grid, diff))
        print(f"{name}: bytes {read + written} floor {floor_us:.2f} us old {t_old:.2f} us "
              f"wide {t_new} auto r{auto} lpr {lpr} grid {grid} rel diff to old {diff:.2e}", file=log)
        del mats
        torch.cuda.empty_cache()
    return rows_out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "affine_decode.log"), "w")
    old, new = Module(a.old), Module(a.new)
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(f"device: {props.name}, {sms} SMs", file=log)
    for n in ("affine_wide_products_b4_r1_bf16_bf16", "affine_wide_products_b4_r4_bf16_bf16",
              "affine_wide_swiglu_b4_r2_bf16_bf16", "affine_products_bf16_bf16"):
        mod = new if "wide" in n else old
        print(f"{n}: registers, local bytes {mod.regs(n)}", file=log)
    cases, failures = correctness(new, log)
    print(f"correctness: {cases - failures}/{cases} cases pass")
    bw = copy_bandwidth()
    rows = timing(old, new, bw, sms, log)
    log.close()
    print(f"\ncopy bandwidth {bw / 1e9:.0f} GB/s; {props.name}")
    print("| projection | MB | floor us | old us (GB/s) | wide us, auto rows (GB/s) | r1 / r2 / r4 us | grid | vs old |")
    print("|---|---|---|---|---|---|---|---|")
    tot_old = tot_new = tot_floor = 0.0
    for (name, nbytes, floor_us, t_old, t_new, auto, grid, diff) in rows:
        t = t_new[auto]
        tot_old, tot_new, tot_floor = tot_old + t_old, tot_new + t, tot_floor + floor_us
        rs = " / ".join(f"{t_new[r]:.2f}" for r in sorted(t_new))
        print(f"| {name} | {nbytes / 1e6:.2f} | {floor_us:.2f} | {t_old:.2f} ({nbytes / t_old / 1e3:.0f}) | "
              f"{t:.2f}, r{auto} ({nbytes / t / 1e3:.0f}) | {rs} | {grid[0]}x{grid[1]} | {diff:.1e} |")
    print(f"sum over one of each: floor {tot_floor:.1f} us, old {tot_old:.1f} us, wide {tot_new:.1f} us")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
