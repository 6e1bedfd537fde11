#!/usr/bin/env python3
"""Check and time kernels/affine_grouped.cu (the grouped quantized GEMM of the MoE prefill)
alone on a CUDA GPU (run on the device machine, through scripts/gpu/bench-grouped-gemm.sh).

The PTX is loaded as candle loads it (cuModuleLoadData, the `Module` of gdn_cuda.py) and
launched with the geometry that crates/gdn-ops/src/ops/affine_grouped/cuda.rs uses; several
builds of the kernel (an old and a new one) can be compared in one run, each named with its
geometry on the command line:

  python3 grouped_gemm_cuda.py --out DIR \
      --kernel old:old.ptx:threads=128:tile_rows=64:smem=0 \
      --kernel new:new.ptx:threads=256:tile_rows=128:smem=55296

threads: block size; tile_rows: output rows per block (the grid's y extent is
ceil(rows / tile_rows)); smem: dynamic shared memory in bytes, one number or two (16-bit x/f32
x); 0: the kernel's static memory.

1. Correctness: every (x, scales) instantiation on small cases (2/4/8 bits, groups 32/64/128,
   experts with 0, 1 and many pairs, rows and cols that are not multiples of the tiles), and
   the model's two projections at 512 and 2 048 tokens, against a torch reference with the
   kernel's semantics (w = s * q + b: an f32 multiply then an f32 add, rounded once to the
   activation type; f32 sums; the output rounded once). Gate: within 1 ulp of the activation
   type at the reference plus 1e-5 of max|y| (as tests/affine_grouped_cuda_emulation.rs).
   Outputs are NaN-poisoned before each launch (an unwritten element fails) and every case
   runs twice (the two results must be bit-identical).
2. Timing at Qwen3-Next-80B-A3B's shapes (H 2048, Im 512, 512 routed experts + the shared one
   stacked as expert 512, top-10, 4-bit, group 64, bf16 scales and activations): gate+up
   [513, 1024, 2048] and down [513, 2048, 512], at 512- and 2 048-token chunks with random
   routing (10 distinct experts per token, uniform; the shared expert on every token), three
   rotating routings and inputs, CUDA events, medians. Ceilings: a torch bf16 matmul of the
   same FLOPs with one dense weight (cuBLAS), a torch bmm over the 513 pre-dequantized bf16
   weights (each expert's pairs padded to the mean), and the bytes floor (the 4-bit weights,
   scales and biases of the experts in use read once, x read once, y written once, at the
   measured copy bandwidth).
"""

import argparse
import ctypes
import math
import os
import statistics
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gdn_cuda import Module, _cuda, check_cu, eager_time, open_log  # noqa: E402

_cuda.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
TILE_PAIRS_CHOICES = [16, 32, 64]

# Qwen3-Next-80B-A3B
HIDDEN, MOE_INTER, ROUTED, TOP_K, GROUP, BITS = 2048, 512, 512, 10, 64, 4
EXPERTS = ROUTED + 1  # the shared expert stacked as the last
PROJECTIONS = {"gate_up": (2 * MOE_INTER, HIDDEN), "down": (HIDDEN, MOE_INTER)}  # (rows, cols)


class Params(ctypes.Structure):
    """AffineGroupedParams of kernels/params/affine_grouped.h."""
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("rows", "cols", "bits", "group_size", "experts", "pairs", "tiles", "tile_pairs")]


class Kernel:
    def __init__(self, spec):
        name, ptx, *opts = spec.split(":")
        self.name, self.mod = name, Module(ptx)
        kv = dict(o.split("=") for o in opts)
        self.threads = int(kv.get("threads", 128))
        self.tile_rows = int(kv.get("tile_rows", 64))
        smem = [int(v) for v in kv.get("smem", "0").split("/")]
        self.smem16, self.smem32 = smem[0], smem[-1]  # 16-bit x / f32 x
        self.ready = set()

    def smem(self, xn):
        return self.smem32 if xn == "f32" else self.smem16

    def func(self, xn, sn):
        fname = f"affine_grouped_{xn}_{sn}"
        f = self.mod.func(fname)
        if fname not in self.ready and self.smem(xn) > 0:
            check_cu(_cuda.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem(xn)),
                     "cuFuncSetAttribute")
        self.ready.add(fname)
        return f

    def launch(self, w, x, sched, y):
        """w: (packed, scales, biases, bits, group); sched: (tiles tensor, n tiles, tile_pairs)."""
        packed, scales, biases, bits, group = w
        tiles_t, ntiles, tile_pairs = sched
        rows = y.shape[1]
        xn = {v: k for k, v in DT.items()}[x.dtype]
        sn = {v: k for k, v in DT.items()}[scales.dtype]
        p = Params(rows, x.shape[1], bits, group, packed.shape[0], x.shape[0], ntiles, tile_pairs)
        holders = [ctypes.c_void_p(t.data_ptr()) for t in (packed, scales, biases, x, tiles_t, y)] + [p]
        params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
        stream = torch.cuda.current_stream().cuda_stream
        grid_y = (rows + self.tile_rows - 1) // self.tile_rows
        rc = _cuda.cuLaunchKernel(self.func(xn, sn), ntiles, grid_y, 1, self.threads, 1, 1, self.smem(xn),
                                  ctypes.c_void_p(stream), params, None)
        check_cu(rc, f"cuLaunchKernel({self.name})")


# ----------------------------------------------------------------------------- host schedule

def tile_pairs_for(counts):
    """tile_pairs_for of ops/affine_grouped/mod.rs: the smallest height that holds the mean pairs of
    the experts with pairs."""
    used = max(1, sum(1 for c in counts if c > 0))
    mean = -(-sum(counts) // used)
    return next((t for t in TILE_PAIRS_CHOICES if t >= mean), TILE_PAIRS_CHOICES[-1])


def schedule(counts, tile_pairs=None):
    """tile_schedule of ops/affine_grouped/mod.rs: (expert, first pair, count) per tile."""
    tp = tile_pairs or tile_pairs_for(counts)
    out, at = [], 0
    for e, c in enumerate(counts):
        for first in range(at, at + c, tp):
            out += [e, first, min(tp, at + c - first)]
        at += c
    t = torch.tensor(out, dtype=torch.int32, device="cuda")
    return t, len(out) // 3, tp


# ----------------------------------------------------------------------------- data, reference

def random_weights(E, rows, cols, bits, group, sdt, gen):
    words = cols * bits // 32
    packed = torch.randint(-2**31, 2**31 - 1, (E, rows, words), generator=gen, device="cuda", dtype=torch.int64)
    packed = packed.to(torch.int32)
    levels = (1 << bits) - 1
    span = torch.rand(E, rows, cols // group, generator=gen, device="cuda") * 0.4 + 0.8
    scales = (span * 0.04 / levels).to(sdt)
    biases = (-0.02 * span + 0.01 * torch.randn(E, rows, cols // group, generator=gen, device="cuda")).to(sdt)
    return packed, scales, biases, bits, group


def dequantize(w, xdt, experts=None):
    """[E', rows, cols] in xdt: w = s * q + b (f32 multiply, f32 add: separate torch ops, so
    no FMA contraction), rounded once to xdt."""
    packed, scales, biases, bits, group = w
    if experts is not None:
        packed, scales, biases = packed[experts], scales[experts], biases[experts]
    per = 32 // bits
    shifts = torch.arange(per, device="cuda", dtype=torch.int64) * bits
    q = (packed.to(torch.int64)[..., None] >> shifts) & ((1 << bits) - 1)  # [E, rows, words, per]
    q = q.reshape(*packed.shape[:2], -1).float()
    s = scales.float().repeat_interleave(group, dim=-1)
    b = biases.float().repeat_interleave(group, dim=-1)
    prod = s * q
    return (prod + b).to(xdt)


def reference(w, x, counts):
    """y [P, rows] in x's dtype: per expert, x rows (f32) times the rounded weights (f32)."""
    rows = w[0].shape[1]
    y = torch.empty(x.shape[0], rows, device="cuda", dtype=torch.float32)
    at = 0
    for e, c in enumerate(counts):
        if c:
            we = dequantize(w, x.dtype, experts=slice(e, e + 1))[0].float()
            y[at:at + c] = x[at:at + c].float() @ we.t()
        at += c
    return y.to(x.dtype)


def ulp(x, dt):
    mant = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dt]
    tiny = {torch.float32: 2.0 ** -126, torch.float16: 2.0 ** -14, torch.bfloat16: 2.0 ** -126}[dt]
    a = x.double().abs().clamp_min(tiny)
    return torch.exp2(torch.floor(torch.log2(a)) - mant)


def routing(tokens, gen):
    """Counts per expert of `tokens` tokens routed to TOP_K distinct experts of ROUTED, plus the
    shared expert (the last) on every token."""
    ids = torch.rand(tokens, ROUTED, generator=gen, device="cuda").topk(TOP_K, dim=1).indices
    counts = torch.bincount(ids.flatten(), minlength=ROUTED).tolist()
    return counts + [tokens]


# ----------------------------------------------------------------------------- correctness

def check_case(kernels, log, what, w, x, counts, tile_pairs=None):
    ref = reference(w, x, counts)
    sched = schedule(counts, tile_pairs)
    ymax = ref.double().abs().max().item()
    tol = torch.maximum(ulp(ref, x.dtype), torch.full_like(ref, 1e-5 * ymax, dtype=torch.float64))
    ok_all = True
    for k in kernels:
        ys = []
        for _ in range(2):
            y = torch.full((x.shape[0], w[0].shape[1]), float("nan"), device="cuda", dtype=x.dtype)
            k.launch(w, x, sched, y)
            torch.cuda.synchronize()
            ys.append(y)
        err = ((ys[0].double() - ref.double()).abs() / tol)
        finite = bool(torch.isfinite(ys[0]).all())
        worst = err.max().item() if finite else float("inf")
        det = torch.equal(ys[0], ys[1]) if finite else False
        ok = finite and worst <= 1.0 and det
        ok_all &= ok
        log(f"{'ok  ' if ok else 'FAIL'} {k.name:<6} {what} tiles of {sched[2]}: err/tol {worst:.3f}"
            f"{'' if finite else ' (unwritten or non-finite elements)'}{'' if det else ' NOT deterministic'}")
    return ok_all


def run_checks(kernels, log, seed=99):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    ok = True

    def case(xn, sn, bits, group, rows, cols, counts, tile_pairs=None):
        nonlocal ok
        w = random_weights(len(counts), rows, cols, bits, group, DT[sn], gen)
        x = torch.randn(sum(counts), cols, generator=gen, device="cuda").to(DT[xn])
        what = f"x {xn:<4} s {sn:<4} {bits}-bit g{group:<3} rows {rows:<4} cols {cols:<4} counts {counts if len(counts) < 8 else '[' + str(len(counts)) + ' experts]'}"
        ok &= check_case(kernels, log, what, w, x, counts, tile_pairs)

    for xn in ["f32", "f16", "bf16"]:
        for sn in ["f32", "f16", "bf16"]:
            for tp in TILE_PAIRS_CHOICES:
                case(xn, sn, 4, 64, 200, 256, [0, 1, 70, 3, 17, 0, 130], tp)
    case("bf16", "bf16", 8, 32, 64, 96, [5, 0, 64, 2])
    case("bf16", "f32", 2, 128, 32, 256, [17, 1])
    case("f32", "bf16", 8, 128, 80, 128, [2, 129])
    case("f16", "f16", 2, 32, 136, 160, [33, 0, 9])
    for name, (rows, cols) in PROJECTIONS.items():
        for tokens in (512, 2048):
            case("bf16", "bf16", BITS, GROUP, rows, cols, routing(tokens, gen))
            log(f"  (model {name}, {tokens} tokens)")
    return ok


# ----------------------------------------------------------------------------- timing

def copy_bandwidth():
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    med, _ = eager_time([lambda: dst.copy_(src)], iters=10, warm=2)
    return 2 * n / (med * 1e-6)


def run_bench(kernels, log, ceilings=True):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    bw = copy_bandwidth()
    log(f"device-to-device copy: {bw / 1e9:.0f} GB/s (read + write)")
    rows_out = []
    per_layer = {}
    for name, (rows, cols) in PROJECTIONS.items():
        w = random_weights(EXPERTS, rows, cols, BITS, GROUP, torch.bfloat16, gen)
        wdq = None
        for tokens in (512, 2048):
            sets = []
            for _ in range(3):
                counts = routing(tokens, gen)
                pairs = sum(counts)
                x = torch.randn(pairs, cols, generator=gen, device="cuda").to(torch.bfloat16)
                y = torch.empty(pairs, rows, device="cuda", dtype=torch.bfloat16)
                sets.append((counts, x, y, schedule(counts)))
            counts, x, y, sched = sets[0]
            pairs = x.shape[0]
            flop = 2.0 * pairs * rows * cols
            padded = 2.0 * sched[1] * sched[2] * rows * cols
            used = sum(1 for c in counts if c)
            wbytes = used * rows * (cols * BITS // 8 + 2 * 2 * cols // GROUP)
            floor_us = (wbytes + pairs * (cols + rows) * 2) / bw * 1e6  # bw counts read + write
            res = {}
            for k in kernels:
                fns = [(lambda k=k, s=s: k.launch(w, s[1], s[3], s[2])) for s in sets]
                res[k.name] = eager_time(fns, iters=30, warm=3)[0]
            if ceilings:
                res.update(ceiling_times(w, sets, rows, cols, pairs, gen, wdq))
                wdq = res.pop("_wdq")
            log(f"\n{name} [{EXPERTS}, {rows}, {cols}], {tokens} tokens: {pairs} pairs, {used} experts in use, "
                f"{sched[1]} tiles of {sched[2]} ({padded / flop:.2f}x padding), bytes floor {floor_us:.1f} us")
            for kn, us in res.items():
                rows_out.append((name, tokens, kn, us, flop / us / 1e6, padded / us / 1e6 if kn in [k.name for k in kernels] else None, floor_us))
                if kn in [k.name for k in kernels]:
                    per_layer.setdefault((kn, tokens), 0.0)
                    per_layer[(kn, tokens)] += us
        del w, wdq
        torch.cuda.empty_cache()
    print_tables(kernels, log, rows_out, per_layer)


def ceiling_times(w, sets, rows, cols, pairs, gen, wdq):
    """cuBLAS ceilings of the same FLOPs: one dense weight, and a bmm over the 513
    pre-dequantized bf16 weights (returned as "_wdq" for the next chunk size)."""
    res = {}
    wd = torch.randn(cols, rows, generator=gen, device="cuda").to(torch.bfloat16)
    res["torch dense mm"] = eager_time([lambda s=s: torch.mm(s[1], wd) for s in sets], iters=30, warm=3)[0]
    if wdq is None:  # [E, cols, rows], 64 experts at a time (the int64 codes are large)
        wdq = torch.cat([dequantize(w, torch.bfloat16, experts=slice(e, e + 64)).transpose(1, 2)
                         for e in range(0, EXPERTS, 64)]).contiguous()
    m = -(-pairs // EXPERTS)
    xb = [torch.randn(EXPERTS, m, cols, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3)]
    res["torch bmm (bf16 weights)"] = eager_time([lambda a=a: torch.bmm(a, wdq) for a in xb], iters=20, warm=2)[0]
    del xb
    res["_wdq"] = wdq
    return res


def print_tables(kernels, log, rows_out, per_layer):
    log("\ngrouped quantized GEMM alone, Qwen3-Next-80B-A3B MoE projections (4-bit g64, bf16), CUDA events, medians")
    log(f"{'projection':<9}{'tokens':>7}  {'kernel':<26}{'us':>9}{'TFLOPS':>8}{'padded':>8}{'floor us':>10}{'x floor':>8}")
    for name, tokens, kn, us, tf, ptf, floor_us in rows_out:
        ptfs = f"{ptf:8.1f}" if ptf is not None else " " * 8
        log(f"{name:<9}{tokens:>7}  {kn:<26}{us:>9.1f}{tf:>8.1f}{ptfs}{floor_us:>10.1f}{us / floor_us:>7.2f}x")
    log("\nper MoE layer (gate_up + down) and over a prefill (48 layers; pp512: 1 chunk of 512, pp4096: 2 of 2048)")
    for k in kernels:
        a, b = per_layer[(k.name, 512)], per_layer[(k.name, 2048)]
        log(f"  {k.name:<6} 512 tokens {a:8.1f} us -> pp512 {48 * a / 1e3:6.1f} ms;  "
            f"2048 tokens {b:8.1f} us -> pp4096 {96 * b / 1e3:6.1f} ms")
    if len(kernels) > 1:
        base = kernels[0].name
        for k in kernels[1:]:
            for tokens in (512, 2048):
                log(f"  {k.name} vs {base} at {tokens} tokens: {per_layer[(base, tokens)] / per_layer[(k.name, tokens)]:.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", action="append", required=True, help="name:ptx[:threads=..:tile_rows=..:smem=..]")
    ap.add_argument("--out", default=".")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--no-ceilings", action="store_true", help="time the kernels only (no cuBLAS rows)")
    args = ap.parse_args()
    log = open_log(args.out, "grouped_gemm.log")

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    log(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0)}")
    kernels = [Kernel(s) for s in args.kernel]
    for k in kernels:
        regs, local = k.mod.regs("affine_grouped_bf16_bf16")
        log(f"  {k.name}: affine_grouped_bf16_bf16 {regs} registers, {local} B local; {k.threads} threads, "
            f"{k.tile_rows} rows per block, {k.smem16}/{k.smem32} B dynamic shared (16-bit/f32 x)")
    ok = True
    if not args.skip_checks:
        try:
            ok = run_checks(kernels, log)
        except Exception:
            ok = False
            log("checks raised:\n" + traceback.format_exc())
    try:
        run_bench(kernels, log, ceilings=not args.no_ceilings)
    except Exception:
        log("bench raised:\n" + traceback.format_exc())
    log(f"\nRESULT: grouped GEMM checks {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
