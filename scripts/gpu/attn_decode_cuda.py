#!/usr/bin/env python3
"""The long-context split pass of attention decode (kernels/attn_decode.cu,
`attn_decode_split_{pipelined,pair}_*` with `attn_decode_combine_wide_*`) against
the shipped `attn_decode_split_*` + `attn_decode_combine_*` on a CUDA GPU, at
Qwen3-Next-80B-A3B's shape (16 query heads, 2 KV heads, head dim 256, bf16 KV cache; issue 25).

  nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/attn_decode.cu -o attn_decode.ptx     (here)
  python3 scripts/gpu/attn_decode_cuda.py --ptx attn_decode.ptx                       (there)

1. Bits: at 512, 4k, 16k and 32k positions each variant's records (`partials`) and output are
   compared bit for bit with the shipped passes' (same keys a warp, same order: they must be
   equal), and the output with a float64 reference (2 bf16 ulps + 1e-5 of max |ref|, the
   op tests' gate).
2. Time: each pair as a CUDA graph of one split + combine per layer over 12 layers' KV caches
   (each its own, 12 x 34 MB at 16k: far more than the 50 MB L2, as in the decode step), and
   each pass alone, in us per layer.
"""

import argparse
import ctypes
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from affine_decode_cuda import time_graph  # noqa: E402
from affine_stream_cuda import launch_shared  # noqa: E402
from gdn_cuda import Module, ulp  # noqa: E402

SIMDGROUPS, SPLIT_KEYS, MAX_SPLITS = 8, 128, 32  # ops/attn_decode/mod.rs


class Params(ctypes.Structure):  # kernels/params/attn_decode.h
    _fields_ = [(n, ctypes.c_uint32) for n in (
        "batch", "q_heads", "kv_heads", "head_dim", "capacity", "simdgroups", "splits")] + [
        ("scale", ctypes.c_float)]


# (label, split entry point, combine entry point, query heads a split block); the first is
# the shipped pair.
PAIRS = [
    ("shipped", "attn_decode_split_bf16", "attn_decode_combine_bf16", 1),
    ("pipelined+wide", "attn_decode_split_pipelined_bf16", "attn_decode_combine_wide_bf16", 1),
    ("pair+wide", "attn_decode_split_pair_bf16", "attn_decode_combine_wide_bf16", 2),
    ("shipped+wide", "attn_decode_split_bf16", "attn_decode_combine_wide_bf16", 1),
]


class Case:
    """One layer's buffers at `pos`: q, gate, the KV cache of `cap` positions, pos on the
    device, the split's records and the output."""

    def __init__(self, nq, nkv, dh, cap, pos, gen):
        bf = torch.bfloat16
        self.nq, self.nkv, self.dh, self.cap, self.pos = nq, nkv, dh, cap, pos
        self.splits = min(max(-(-cap // SPLIT_KEYS), 1), MAX_SPLITS)
        self.q = (torch.rand(1, nq, dh, generator=gen, device="cuda") * 2 - 1).to(bf)
        self.gate = (torch.rand(1, nq * dh, generator=gen, device="cuda") * 8 - 4).to(bf)
        self.keys = (torch.rand(1, nkv, cap, dh, generator=gen, device="cuda") * 2 - 1).to(bf)
        self.values = (torch.rand(1, nkv, cap, dh, generator=gen, device="cuda") * 4 - 2).to(bf)
        self.pos_t = torch.tensor([pos], dtype=torch.int32, device="cuda")
        self.partials = torch.empty(nq * self.splits * (2 + dh), device="cuda")
        self.out = torch.empty(1, nq * dh, dtype=bf, device="cuda")
        self.p = Params(1, nq, nkv, dh, cap, SIMDGROUPS, self.splits, dh ** -0.5)

    def run(self, mod, split, combine, heads, do_split=True, do_combine=True):
        if do_split:
            launch_shared(mod, split, (self.nq // heads, 1, self.splits), (32, SIMDGROUPS, 1),
                          SIMDGROUPS * (2 + self.dh) * 4,
                          [("p", self.q.data_ptr()), ("p", self.keys.data_ptr()),
                           ("p", self.values.data_ptr()), ("p", self.pos_t.data_ptr()),
                           ("p", self.partials.data_ptr()), ("s", self.p)])
        if do_combine:
            wide = combine.startswith("attn_decode_combine_wide")
            launch_shared(mod, combine, (self.nq, 1, 1), (self.dh if wide else 32, 1, 1), 0,
                          [("p", self.partials.data_ptr()), ("p", self.gate.data_ptr()),
                           ("p", self.out.data_ptr()), ("s", self.p)])

    def reference(self):
        """float64 attention over positions 0..=pos, rounded to bf16, times sigmoid(gate)."""
        last = min(self.pos, self.cap - 1)
        group = self.nq // self.nkv
        q = self.q[0].double()
        k = self.keys[0, :, : last + 1].double().repeat_interleave(group, 0)
        v = self.values[0, :, : last + 1].double().repeat_interleave(group, 0)
        s = torch.einsum("hd,htd->ht", q, k) * self.dh ** -0.5
        o = torch.einsum("ht,htd->hd", torch.softmax(s, -1), v).reshape(1, -1)
        attended = o.to(torch.bfloat16).double()
        return attended * torch.sigmoid(self.gate.double())


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def correctness(mod, positions, gen, log):
    failures = 0
    for pos, cap in positions:
        c = Case(16, 2, 256, cap, pos, gen)
        want = c.reference()
        tol = 2 * ulp(want, torch.bfloat16) + 1e-5 * want.abs().max()
        base = None
        for label, split, combine, heads in PAIRS:
            c.partials.fill_(float("nan"))
            c.out.fill_(float("nan"))
            c.run(mod, split, combine, heads)
            torch.cuda.synchronize()
            got = (c.partials.clone(), c.out.clone())
            err = ((got[1].double() - want).abs() / tol).max().item()
            ok = err <= 1.0
            same = ""
            if base is None:
                base = got
            else:
                same_p = torch.equal(bits(got[0]), bits(base[0]))
                same_o = torch.equal(bits(got[1]), bits(base[1]))
                same = f"records {'==' if same_p else '!='} shipped, out {'==' if same_o else '!='} shipped"
                ok = ok and same_p and same_o
            failures += not ok
            log(f"pos {pos:>6} cap {cap:>6} splits {c.splits:>2} {label:<16} "
                f"{'ok' if ok else 'FAIL'} (max err {err:.2f} of the gate) {same}")
    return failures


def timing(mod, positions, layers, gen, log):
    for pos, cap in positions:
        cases = [Case(16, 2, 256, cap, pos, gen) for _ in range(layers)]
        mb = cases[0].keys.numel() * 2 * 2 / 1e6
        floor = 2 * 2 * (min(pos, cap - 1) + 1) * 256 * 2 / 1e6  # MB of keys and values read
        log(f"\npos {pos} cap {cap}: splits {cases[0].splits}, {layers} layers x {mb:.1f} MB of KV "
            f"({floor:.1f} MB read a layer)")
        log(f"{'pair':<16} {'regs':>9} {'lmem':>9} {'split+comb':>10} {'split':>7} {'combine':>7}  us/layer")
        shipped = None
        for label, split, combine, heads in PAIRS:
            def run(c, s=True, m=True, split=split, combine=combine, heads=heads):
                return lambda: c.run(mod, split, combine, heads, s, m)
            both = time_graph([run(c) for c in cases])
            alone = time_graph([run(c, m=False) for c in cases])
            comb = time_graph([run(c, s=False) for c in cases])
            shipped = shipped or both
            (rs, ls), (rc, lc) = mod.regs(split), mod.regs(combine)
            log(f"{label:<16} {rs:>4}/{rc:<4} {ls:>4}/{lc:<4} {both:>10.2f} {alone:>7.2f} {comb:>7.2f}"
                f"  {shipped / both:.2f}x, {floor / both * 1e3:.0f} GB/s of KV")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx", required=True)
    ap.add_argument("--layers", type=int, default=12)
    a = ap.parse_args()
    mod = Module(a.ptx)
    gen = torch.Generator(device="cuda").manual_seed(11)
    print(torch.cuda.get_device_name(), flush=True)
    log = lambda s: print(s, flush=True)  # noqa: E731
    # (pos, capacity): after 512, 4k, 16k and 32k prompt positions, the KV buffers a few
    # hundred positions longer (the host grows them in steps).
    positions = [(512, 768), (4096, 4352), (16384, 16640), (32768, 33024)]
    failures = correctness(mod, positions, gen, log)
    timing(mod, positions, a.layers, gen, log)
    log(f"\nFAILURES {failures if failures else 'none'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
