#!/usr/bin/env python3
"""The fused gated-delta + gated RMSNorm decode kernel (kernels/gated_delta_norm.cu) alone on a
CUDA GPU: one block a value head against the head split over a thread-block cluster, at the
decode shapes of the models (run on the device machine).

  nvcc -ptx -arch=sm_90 -O3 -I kernels scripts/gpu/gdn_norm_variants.cu -o variants.ptx   (here)
  python3 scripts/gpu/gdn_norm_cuda.py --ptx variants.ptx                                (there)

Each variant is checked against a float64 reference (state within 1e-5 of max|S|, output within
2 bf16 ulps) and against the one-block kernel (the state bit for bit: a row's arithmetic does not
depend on the split), then timed as a CUDA graph of one launch per layer over 36 state copies
(72 MB at Qwen3-Next's shapes, more than the 50 MB L2, as in the decode step).
"""

import argparse
import ctypes
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gdn_cuda import Module, _cuda, check_cu, reference, ulp  # noqa: E402


class Params(ctypes.Structure):  # kernels/params/gated_delta_norm.h
    _fields_ = [(n, ctypes.c_uint32) for n in (
        "batch", "steps", "key_heads", "value_heads", "key_dim", "value_dim",
        "z_batch_stride", "z_token_stride")] + [("eps", ctypes.c_float)]


# (entry point, blocks a head, warps a block, most rows a warp may own)
VARIANTS = [
    ("v_one_t1024", 1, 32, 8),
    ("v_c4_t1024", 4, 32, 2), ("v_c4_t1024", 4, 16, 2),
    ("v_c4_t512", 4, 16, 4), ("v_c4_t512", 4, 8, 4),
    ("v_c4_t256", 4, 8, 8),
    ("v_c2_t1024", 2, 32, 4),
    ("v_c8_t512", 8, 16, 2), ("v_c8_t512", 8, 8, 2),
    ("v_c8_t256", 8, 8, 4),
]


def launch(mod, name, cluster, warps, t, state, out):
    B, T, Hk, Dk = t["q"].shape
    Hv, Dv = t["v"].shape[2], t["v"].shape[3]
    p = Params(B, T, Hk, Hv, Dk, Dv, T * Hv * Dv, Hv * Dv, 1e-6)
    ptrs = [t["q"], t["k"], t["v"], t["g"], t["beta"], state, t["z"], t["w"], out]
    holders = [ctypes.c_void_p(x.data_ptr()) for x in ptrs] + [p]
    arr = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    stream = torch.cuda.current_stream().cuda_stream
    rc = _cuda.cuLaunchKernel(mod.func(name), B * Hv * cluster, 1, 1, 32, warps, 1, 0,
                              ctypes.c_void_p(stream), arr, None)
    check_cu(rc, f"cuLaunchKernel({name}, cluster {cluster}, warps {warps})")


def inputs(B, T, Hk, Hv, Dk, Dv, gen):
    def rn(*s):
        return torch.randn(*s, generator=gen, device="cuda")
    bf = torch.bfloat16
    return {
        "q": (torch.nn.functional.normalize(rn(B, T, Hk, Dk), dim=-1) / math.sqrt(Dk)).to(bf),
        "k": torch.nn.functional.normalize(rn(B, T, Hk, Dk), dim=-1).to(bf),
        "v": rn(B, T, Hv, Dv).to(bf),
        "g": torch.exp(-torch.nn.functional.softplus(rn(B, T, Hv)) * 0.3),
        "beta": torch.sigmoid(rn(B, T, Hv)),
        "state": rn(B, Hv, Dv, Dk) * 0.5,
        "z": rn(B, T, Hv, Dv).to(bf),
        "w": (1.0 + 0.1 * rn(Dv)).to(bf),
    }


def norm_reference(t):
    y, s = reference(t["q"], t["k"], t["v"], t["g"], t["beta"], t["state"], None)
    y = y.to(torch.bfloat16).double()  # the kernel rounds y to the activations' type
    inv = torch.rsqrt((y * y).mean(-1, keepdim=True) + 1e-6)
    normed = (y * inv * t["w"].double()).to(torch.bfloat16).double()
    z = t["z"].double()
    return z * torch.sigmoid(z) * normed, s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx", required=True)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--replays", type=int, default=50)
    a = ap.parse_args()
    mod = Module(a.ptx)
    gen = torch.Generator(device="cuda").manual_seed(7)
    print(torch.cuda.get_device_name())
    shapes = [  # (label, B, T, Hk, Hv, Dk, Dv)
        ("qwen3-next decode", 1, 1, 16, 32, 128, 128),
        ("qwen3-next verify k=3", 1, 4, 16, 32, 128, 128),
        ("qwen3-next B=4", 4, 1, 16, 32, 128, 128),
        ("qwen3.8 decode", 1, 1, 16, 48, 128, 128),
    ]
    failures = 0
    for label, B, T, Hk, Hv, Dk, Dv in shapes:
        t = inputs(B, T, Hk, Hv, Dk, Dv, gen)
        ref_out, ref_s = norm_reference(t)
        base = None
        print(f"\n{label}: B={B} T={T} Hk={Hk} Hv={Hv} Dk={Dk} Dv={Dv}")
        print(f"{'variant':<14} {'grid':>5} {'warps':>5} {'regs':>4} {'lmem':>4} {'us/launch':>9} {'vs one':>7}  check")
        for name, cl, warps, many in VARIANTS:
            if Dv % cl or -(-(Dv // cl) // warps) > many:
                continue
            state = t["state"].clone()
            out = torch.empty(B, T, Hv, Dv, device="cuda", dtype=torch.bfloat16)
            launch(mod, name, cl, warps, t, state, out)
            torch.cuda.synchronize()
            err_o = ((out.double() - ref_out).abs() / (2 * ulp(ref_out, torch.bfloat16) + 1e-6)).max().item()
            err_s = ((state.double() - ref_s).abs().max() / ref_s.abs().max()).item()
            ok = err_o <= 1.0 and err_s <= 1e-5
            same = ""
            if base is None:
                base = (state, out)
            else:
                same_s = torch.equal(state, base[0])
                same_o = (out.float() - base[1].float()).abs().max().item()
                same = f" state {'==' if same_s else '!='} one, out max|diff| {same_o:.2e}"
                ok = ok and same_s
            failures += not ok
            states = [t["state"].clone() for _ in range(a.layers)]
            outs = [torch.empty_like(out) for _ in range(a.layers)]
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                with torch.cuda.graph(g, stream=s):
                    for st, o in zip(states, outs):
                        launch(mod, name, cl, warps, t, st, o)
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(a.replays):
                g.replay()
            e1.record()
            torch.cuda.synchronize()
            us = e0.elapsed_time(e1) * 1e3 / (a.replays * a.layers)
            if name == "v_one_t1024":
                one_us = us
            regs, lmem = mod.regs(name)
            print(f"{name:<14} {B * Hv * cl:>5} {warps:>5} {regs:>4} {lmem:>4} {us:>9.2f} {one_us / us:>6.2f}x  "
                  f"{'ok' if ok else 'FAIL'} (out {err_o:.2f} of 2 ulp, state {err_s:.1e}){same}")
    print("\nFAILURES", failures if failures else "none")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
