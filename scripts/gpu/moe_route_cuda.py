#!/usr/bin/env python3
"""The MoE router's block body (moe_route_block_* of kernels/moe_route.cu: one block a token,
one thread an expert, the top k ranked in parallel) against its warp body (moe_route_*: one
warp a token, k serial rounds, the shipped and measured kernel) on a CUDA GPU (issue 25):
the same ids and weight bits, then the times as CUDA graphs.

  python3 moe_route_cuda.py --ptx moe_route.ptx [--base main_moe_route.ptx] --out DIR

1. Bits: the block body's ids and weights equal to the warp body's, bit for bit, over E from 1
   to 512 (multiples of 32 and not), k from 1 to min(32, E), the shared slot and
   renormalisation on and off, N 1 to 64 and 4096, f32, f16 and bf16 logits, continuous or
   from 1 to 40 levels (exact ties, all equal included), and rows with NaN, -inf and +inf.
   With --base (main's moe_route.ptx), main's warp body too.
2. Time: graphs of 64 routers, each on its own logits, at Qwen3-Next-80B-A3B's router (512
   experts + the shared gate, k 10) and Qwen3.5-35B-A3B's (256 + 1, k 8), bf16; N 1 (a
   decode step), 4, 512 and 4096 (prefill chunks).

Exit status 1 when any case differs.
"""

import argparse
import ctypes
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from affine_decode_cuda import DT, time_graph  # noqa: E402
from affine_stream_cuda import launch_shared  # noqa: E402
from gdn_cuda import Module  # noqa: E402


class RouteParams(ctypes.Structure):
    """MoeRouteParams of kernels/params/moe_route.h."""
    _fields_ = [(n, ctypes.c_uint32) for n in ("tokens", "experts", "top_k", "renormalise", "has_shared")]


TOKENS_PER_BLOCK = 4  # crates/gdn-ops/src/ops/moe_route/cuda.rs


def route(mod, body, logits, rp, xdt, ids=None, w=None):
    """One launch of `body` ("warp" or "block") with the host's geometry (ops/moe_route/cuda.rs)."""
    n, slots = rp.tokens, rp.top_k + rp.has_shared
    if ids is None:
        ids = torch.full((n, slots), 0x7EEEEEEE, dtype=torch.int32, device="cuda")
        w = torch.full((n, slots), float("nan"), dtype=torch.float32, device="cuda")
    if body == "warp":
        name, grid, block = f"moe_route_{xdt}", (math.ceil(n / TOKENS_PER_BLOCK), 1, 1), (32, TOKENS_PER_BLOCK, 1)
    else:
        name, grid, block = f"moe_route_block_{xdt}", (n, 1, 1), (32 * math.ceil(rp.experts / 32), 1, 1)
    launch_shared(mod, name, grid, block, 0,
                  [("p", logits.data_ptr()), ("p", ids.data_ptr()), ("p", w.data_ptr()), ("s", rp)])
    return ids, w


def make_logits(n, experts, has_shared, levels, xdt, special, rng):
    width = experts + has_shared
    if levels == 0:
        x = torch.rand(n, width, device="cuda") * 12 - 6
    else:
        x = torch.randint(0, levels, (n, width), device="cuda").float() * 0.25 - 2
    if special and experts > 2:
        # One row with a NaN, one with -inf, one with +inf (every probability NaN there).
        for row, v in zip(range(min(n, 3)), (float("nan"), float("-inf"), float("inf"))):
            x[row, rng.randrange(experts)] = v
    return x.to(DT[xdt])


def same_bits(a, b):
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


def correctness(mod, base, log):
    rng = random.Random(25)
    torch.manual_seed(25)
    cases = failures = base_diff = 0
    widths = [1, 5, 7, 31, 32, 33, 37, 64, 100, 128, 200, 255, 256, 257, 384, 500, 512]
    shapes = []
    for experts in widths:
        for k in sorted({1, 2, min(8, experts), min(10, experts), min(32, experts), rng.randint(1, min(32, experts))}):
            shapes.append((experts, k))
    shapes += [(512, 10), (256, 8)] * 6
    for (experts, k) in shapes:
        for xdt in ("f32", "f16", "bf16"):
            sh, rn = rng.randint(0, 1), rng.randint(0, 1)
            if (experts, k) in ((512, 10), (256, 8)):
                sh, rn = 1, 1
            n = rng.choice([1, 1, 2, 3, 4, 7, 64])
            levels = rng.choice([0, 0, 0, 1, 2, 3, 8, 40])
            special = rng.random() < 0.15
            logits = make_logits(n, experts, sh, levels, xdt, special, rng)
            rp = RouteParams(n, experts, k, rn, sh)
            want = route(mod, "warp", logits, rp, xdt)
            got = route(mod, "block", logits, rp, xdt)
            torch.cuda.synchronize()
            cases += 1
            if not same_bits(want, got):
                failures += 1
                print(f"FAIL {xdt} N={n} E={experts} k={k} shared={sh} renorm={rn} levels={levels} "
                      f"special={special}: warp {want[0].tolist()} {want[1].tolist()}, "
                      f"block {got[0].tolist()} {got[1].tolist()}", file=log)
            if base is not None and not same_bits(want, route(base, "warp", logits, rp, xdt)):
                base_diff += 1
                print(f"FAIL main's warp body differs: {xdt} N={n} E={experts} k={k}", file=log)
    # Prefill-sized calls: one block a token over many blocks.
    for (experts, k) in ((512, 10), (256, 8)):
        for levels in (0, 8):
            logits = make_logits(4096, experts, 1, levels, "bf16", True, rng)
            rp = RouteParams(4096, experts, k, 1, 1)
            want, got = route(mod, "warp", logits, rp, "bf16"), route(mod, "block", logits, rp, "bf16")
            torch.cuda.synchronize()
            cases += 1
            if not same_bits(want, got):
                failures += 1
                rows = (want[0] != got[0]).any(1) | (want[1].view(torch.int32) != got[1].view(torch.int32)).any(1)
                print(f"FAIL bf16 N=4096 E={experts} k={k} levels={levels}: {int(rows.sum())} rows differ",
                      file=log)
    return cases, failures, base_diff


def timing(mod, base, log):
    out = []
    for (name, experts, k) in (("Qwen3-Next-80B-A3B", 512, 10), ("Qwen3.5-35B-A3B", 256, 8)):
        for n in (1, 4, 512, 4096):
            nl = 64 if n <= 4 else 8
            rp = RouteParams(n, experts, k, 1, 1)
            logits = [(torch.rand(n, experts + 1, device="cuda") * 12 - 6).to(torch.bfloat16) for _ in range(nl)]
            ids = [torch.empty(n, k + 1, dtype=torch.int32, device="cuda") for _ in range(nl)]
            ws = [torch.empty(n, k + 1, dtype=torch.float32, device="cuda") for _ in range(nl)]
            t = {}
            for body in ("warp", "block"):
                t[body] = time_graph([lambda j=j, b=body: route(mod, b, logits[j], rp, "bf16", ids[j], ws[j])
                                      for j in range(nl)])
            if base is not None:
                t["main"] = time_graph([lambda j=j: route(base, "warp", logits[j], rp, "bf16", ids[j], ws[j])
                                        for j in range(nl)])
            print(f"{name} N={n}: {t}", file=log)
            out.append((name, experts, k, n, t))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx", required=True, help="this branch's moe_route.ptx (both bodies)")
    ap.add_argument("--base", default="", help="main's moe_route.ptx: its warp body checked and timed too")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "moe_route.log"), "w")
    mod = Module(a.ptx)
    base = Module(a.base) if a.base else None
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, {props.multi_processor_count} SMs")
    for n in ("moe_route_bf16", "moe_route_block_bf16"):
        print(f"{n}: registers, local bytes {mod.regs(n)}")
    cases, failures, base_diff = correctness(mod, base, log)
    log.flush()
    print(f"bits: {cases - failures}/{cases} cases: the block body's ids and weights equal the warp body's")
    if base is not None:
        print(f"main's warp body: {base_diff} of {cases - 4} cases differ from this branch's warp body")
    table = timing(mod, base, log)
    extra = " main's us |" if base is not None else ""
    print(f"| router | N | warp us | block us | block / warp |{extra}")
    print("|---|---|---|---|---|" + ("---|" if base is not None else ""))
    for (name, experts, k, n, t) in table:
        m = f" {t['main']:.2f} |" if base is not None else ""
        print(f"| {name} (E {experts}, k {k}) | {n} | {t['warp']:.2f} | {t['block']:.2f} | "
              f"{t['block'] / t['warp']:.2f} |{m}")
    log.close()
    sys.exit(1 if failures or base_diff else 0)


if __name__ == "__main__":
    main()
