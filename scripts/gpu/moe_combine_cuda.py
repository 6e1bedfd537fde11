#!/usr/bin/env python3
"""The decode step's MoE combine (kernels/moe_combine.cu) alone on a CUDA GPU: the shipped one
block a token against a token's columns split over a thread-block cluster of 2, 4 or 8 blocks
(run on the device machine; issue 25).

  nvcc -ptx -arch=sm_90 -O3 -I kernels scripts/gpu/moe_combine_variants.cu -o moe_combine_variants.ptx   (here)
  python3 scripts/gpu/moe_combine_cuda.py --ptx moe_combine_variants.ptx                                  (there)

1. Bits: every variant against the one-block kernel (`v_one`, the shipped body): `sum` equal bit
   for bit, `normed` within 1 bf16 ulp (only the sum of squares' order differs) and the same
   bits on a second launch; both within the Rust tests' bf16 tolerance (relative L2 8e-3) of a
   float64 reference that rounds where the kernels round.
2. Time at Qwen3-Next's decode shape (N = 1, S = 11 slots, H = 2048, bf16, residual and norm),
   as CUDA graphs of 1 152 launches (24 tokens of 48 layers):
   - "hot": every launch reads the same 45 KB of expert rows and residual, which stay in L2:
     the decode step's case (the gathered down product wrote the rows, add_rms_norm the
     residual, just before; only the norm weight comes from DRAM);
   - "cold": each launch reads its own copy (1 152 × 49 KB = 56 MB, more than the 50 MB L2):
     the bound if the rows were evicted.
"""

import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from affine_decode_cuda import time_graph  # noqa: E402
from gdn_cuda import Module, _cuda, check_cu, ulp  # noqa: E402


class Params(ctypes.Structure):  # kernels/params/moe_combine.h
    _fields_ = [(n, ctypes.c_uint32) for n in ("tokens", "slots", "hidden", "has_norm")] + [
        ("eps", ctypes.c_float)] + [(n, ctypes.c_uint32) for n in ("has_residual", "gathered", "down_rows")]


PER, MAX_THREADS = 4, 512  # kPer and the launch bound of kernels/moe_combine.cu
# (entry, blocks a token). The 8-byte-load variants measured on 2026-11-28 (a thread's 4
# columns side by side: 0.5 µs slower cold, docs/perf-notes-gpu.md) are not kept.
VARIANTS = [("v_one", 1), ("v_c1", 1), ("v_c2", 2), ("v_c4", 4), ("v_c8", 8)]
BREAK = ("x_c4_drop", 4)  # the last block's sum of squares left out: the checks must fail it
EPS = 1e-6


def threads(columns):  # combine_threads in crates/gdn-ops/src/ops/moe_combine/mod.rs
    warps = -(-(-(-columns // PER)) // 32)
    return min(max(warps * 32, 32), MAX_THREADS)


def launch(mod, name, cluster, t, out):
    N, S, H = t["down"].shape
    norm = t["w"] is not None
    p = Params(N, S, H, int(norm), EPS, 1, 0, 0)
    ptrs = [t["down"].data_ptr(), 0, t["weights"].data_ptr(), t["residual"].data_ptr(),
            (t["w"] if norm else t["down"]).data_ptr(), out["sum"].data_ptr(),
            (out["normed"] if norm else out["sum"]).data_ptr()]
    holders = [ctypes.c_void_p(x) for x in ptrs] + [p]
    arr = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    stream = torch.cuda.current_stream().cuda_stream
    span = -(-H // cluster)
    rc = _cuda.cuLaunchKernel(mod.func(name), N * cluster, 1, 1, threads(span if name != "v_one" else H), 1, 1,
                              0, ctypes.c_void_p(stream), arr, None)
    check_cu(rc, f"cuLaunchKernel({name}, N={N} S={S} H={H})")


def inputs(N, S, H, norm, gen):
    def u(lo, hi, *s):
        return lo + (hi - lo) * torch.rand(*s, generator=gen, device="cuda")
    bf = torch.bfloat16
    return {"down": u(-2, 2, N, S, H).to(bf), "weights": u(0, 0.5, N, S),
            "residual": u(-4, 4, N, H).to(bf), "w": u(0.5, 1.5, H).to(bf) if norm else None}


def outputs(N, H):
    return {"sum": torch.empty(N, H, device="cuda", dtype=torch.bfloat16),
            "normed": torch.empty(N, H, device="cuda", dtype=torch.bfloat16)}


def reference(t):
    """float64, rounded to bf16 where the kernels round (the sum, the residual add, normed)."""
    acc = (t["weights"].double()[..., None] * t["down"].double()).sum(1)
    s = (t["residual"].double() + acc.to(torch.bfloat16).double()).to(torch.bfloat16).double()
    if t["w"] is None:
        return s, None
    inv = torch.rsqrt((s * s).mean(-1, keepdim=True) + EPS)
    return s, (s * inv * t["w"].double()).to(torch.bfloat16).double()


def rel_l2(got, want):
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def check(mod, gen):
    failures = 0
    shapes = [(1, 11, 2048, True), (2, 11, 2048, True), (4, 9, 4096, True), (3, 9, 200, True),
              (1, 1, 77, True), (3, 1, 77, True), (4, 5, 256, False), (1, 3, 16, False), (1, 3, 5, True), (16, 11, 2048, True)]
    for N, S, H, norm in shapes:
        t = inputs(N, S, H, norm, gen)
        want_sum, want_normed = reference(t)
        base = outputs(N, H)
        launch(mod, "v_one", 1, t, base)
        torch.cuda.synchronize()
        for name, cl in VARIANTS + [BREAK]:
            # The break changes nothing where its dropped (last) block holds no columns.
            if -(-H // cl) > PER * MAX_THREADS or (name == BREAK[0] and (not norm or H <= 3 * -(-H // 4))):
                continue
            out, again = outputs(N, H), outputs(N, H)
            launch(mod, name, cl, t, out)
            launch(mod, name, cl, t, again)
            torch.cuda.synchronize()
            e_sum = rel_l2(out["sum"], want_sum)
            ok = torch.equal(out["sum"], base["sum"]) and e_sum <= 8e-3
            note = f"sum {'==' if torch.equal(out['sum'], base['sum']) else '!='} one (ref {e_sum:.1e})"
            if norm:
                d = (out["normed"].double() - base["normed"].double()).abs()
                ulps = (d / ulp(base["normed"].double(), torch.bfloat16)).max().item()
                e_n = rel_l2(out["normed"], want_normed)
                same = torch.equal(out["normed"], again["normed"])
                ok = ok and ulps <= 1.0 and e_n <= 8e-3 and same
                note += f", normed {ulps:.0f} ulp of one (ref {e_n:.1e}), {'same' if same else 'OTHER'} bits again"
            verdict = ("caught" if not ok else "NOT CAUGHT") if name == BREAK[0] else ("ok" if ok else "FAIL")
            failures += verdict in ("FAIL", "NOT CAUGHT")
            print(f"  N={N:<2} S={S:<2} H={H:<4} norm={int(norm)} {name:<9} {verdict}: {note}")
    return failures


def bench(mod, gen, launches):
    N, S, H = 1, 11, 2048
    print(f"\ntime, N={N} S={S} H={H} bf16 with residual and norm, graphs of {launches} launches")
    print(f"{'variant':<9} {'grid':>4} {'threads':>7} {'regs':>4} {'hot us':>7} {'cold us':>8} {'vs one (hot, cold)':>19}")
    hot_t = inputs(N, S, H, True, gen)
    cold_t = [inputs(N, S, H, True, gen) for _ in range(launches)]
    out = outputs(N, H)
    one = None
    for name, cl in VARIANTS:
        hot = time_graph([lambda: launch(mod, name, cl, hot_t, out)] * launches)
        cold = time_graph([lambda t=t: launch(mod, name, cl, t, out) for t in cold_t])
        one = one or (hot, cold)
        regs, _ = mod.regs(name)
        span = H if name == "v_one" else -(-H // cl)
        print(f"{name:<9} {N * cl:>4} {threads(span):>7} {regs:>4} {hot:>7.2f} {cold:>8.2f} "
              f"{one[0] / hot:>9.2f}x {one[1] / cold:>7.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx", required=True)
    ap.add_argument("--launches", type=int, default=1152)
    a = ap.parse_args()
    mod = Module(a.ptx)
    gen = torch.Generator(device="cuda").manual_seed(11)
    print(torch.cuda.get_device_name())
    print("bits against the one-block kernel:")
    failures = check(mod, gen)
    bench(mod, gen, a.launches)
    print("\nFAILURES", failures if failures else "none")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
