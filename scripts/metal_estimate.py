#!/usr/bin/env python3
"""Decode speed of Qwen3-Next-80B-A3B 4-bit on Apple GPUs, on paper, from the efficiencies the
same kernels' CUDA twins reach on the H100 (issue 25, item 5; docs/metal.md says how to read it).

  python3 scripts/metal_estimate.py STEP.json [--gpu-bandwidth 2.94e12] [--step-us 8700]

STEP.json lists the launches of one decode step as measured on the H100
(scripts/gpu/ncu_decode.py --json: kernel, us, DRAM bytes read and written). Each launch's time
splits into a fixed cost L (the step's fastest launch: a kernel that moves nothing) and the time
it spends on its bytes; the bytes part gives the kernel's achieved fraction of the H100's copy
bandwidth, eta = bytes / ((t - L) * BW_h100), capped at 1. On a Mac the same kernel is charged
bytes / (eta * BW_chip) plus Apple's cost of a dependent dispatch (5.16 us, measured on an M2
Pro: docs/metal.md), plus 20 us per command buffer and one host sync per token. --step-us
rescales the launches so that they sum to the step's time replayed as a graph (ncu flushes the
caches before each kernel, which inflates small kernels); without it they are taken as measured.
The benchmark's own launches after the step (candle's argmax and NaN check) are left out: the
Mac build picks the token its own way.

  python3 scripts/metal_estimate.py STEP.json --batch 1,4,16,64 [--experts 512 --top-k 10]

--batch (issue 29): the same step run for B sequences at once on kernels that take B rows (the
design the batched step is heading for: one dispatch per kernel whatever B, as many as the
single-token step). Per launch, from the measured one: the dense products read their weights
once (bytes as measured); the routed experts' products (the gathered gate/up SwiGLU and the
down product after it) read the experts B tokens select, D(B) = E·(1 − (1 − k/E)^B) distinct
ones for uniform routing (the most a real router spreads them; the shared expert once), so
their bytes scale by (D(B) + shared) / (k + shared); the per-sequence mixer kernels (the GDN
state and conv window, attention's keys and values) scale by B; the rest (routing, combine,
norms: latency-bound, bytes negligible) as measured. Each launch keeps its measured efficiency
on its bytes. Prints the aggregate tok/s (B tokens a step) per chip.
"""
import argparse
import json

CHIPS = [("M3 Max", 400e9), ("M4 Max", 546e9), ("M3 Ultra", 819e9)]
DISPATCH_US = 5.16
COMMAND_BUFFER_US = 20.0
BENCH_ONLY = ("fast_argmax", "fast_sum", "bsub")


# Kernels whose bytes are one sequence's state: the GDN recurrence and conv window, attention.
PER_SEQUENCE = ("gated_delta_norm", "gdn_conv_prep", "attn_prep", "attn_decode")
# The gathered gate/up SwiGLU of the routed experts, in each design the profiles name (the wide
# kernels of fb38491, the streamed ones since 719623c).
ROUTED_SWIGLU = ("affine_wide_swiglu", "affine_stream_swiglu")


def measured(l, scale, fixed, gpu_bandwidth):
    """A launch's time on the measuring GPU (rescaled), its bytes, and its efficiency on them:
    the fraction of the copy bandwidth the time past the fixed cost achieves (1 for none)."""
    t = l["us"] * scale
    by = l["read"] + l["written"]
    busy = max(t - fixed, 1e-3)
    eta = min(1.0, by / (busy * 1e-6 * gpu_bandwidth)) if by else 1.0
    return t, by, eta


def mac_dispatch_ms(launches: int) -> float:
    """Apple's cost of the step's dependent dispatches and its command buffer."""
    return (launches * DISPATCH_US + COMMAND_BUFFER_US) / 1e3


def batch_factors(launches, b, experts, top_k, shared):
    """Per launch, what its bytes are multiplied by when the step runs B sequences."""
    distinct = experts * (1 - (1 - top_k / experts) ** b)
    routed = (distinct + shared) / (top_k + shared)
    factors = []
    for i, l in enumerate(launches):
        name = l["kernel"]
        after_swiglu = i > 0 and launches[i - 1]["kernel"].startswith(ROUTED_SWIGLU)
        if name.startswith(ROUTED_SWIGLU) or after_swiglu:
            factors.append(routed)  # the gathered gate/up, then the gathered down product
        elif name.startswith(PER_SEQUENCE):
            factors.append(float(b))
        else:
            factors.append(1.0)
    return distinct, factors


def batched(launches, a, scale, fixed):
    """The --batch table: aggregate tok/s per chip for each B."""
    sizes = [int(x) for x in a.batch.split(",")]
    print(f"| B | distinct experts a layer (uniform routing) | GB a step | "
          + " | ".join(f"{c} tok/s" for c, _ in CHIPS) + " |")
    print("|---|---|---|" + "---|" * len(CHIPS))
    for b in sizes:
        distinct, factors = batch_factors(launches, b, a.experts, a.top_k, a.shared_experts)
        eta_bytes, total = 0.0, 0.0
        for l, f in zip(launches, factors):
            _, by, eta = measured(l, scale, fixed, a.gpu_bandwidth)
            eta_bytes += by * f / eta if eta else 0.0
            total += by * f
        rates = []
        for _, bw in CHIPS:
            step_ms = eta_bytes / bw * 1e3 + mac_dispatch_ms(len(launches)) + a.sync_ms
            rates.append(f"{b * 1e3 / step_ms:.0f}")
        print(f"| {b} | {distinct:.1f} | {total / 1e9:.2f} | " + " | ".join(rates) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("step")
    ap.add_argument("--gpu-bandwidth", type=float, default=2.94e12,
                    help="the measuring GPU's copy bandwidth (read + written bytes per second)")
    ap.add_argument("--step-us", type=float, help="the step's graph-replayed time, to rescale ncu's")
    ap.add_argument("--sync-ms", type=float, default=0.3, help="host sync per token")
    ap.add_argument("--mlx-tok-s", type=float, default=67.7, help="mlx-lm on an M3 Ultra (peers-2026.md)")
    ap.add_argument("--batch", help="B,...: the batched step's aggregate instead (see above)")
    ap.add_argument("--experts", type=int, default=512, help="routed experts a layer")
    ap.add_argument("--top-k", type=int, default=10, help="experts a token selects")
    ap.add_argument("--shared-experts", type=int, default=1, help="shared experts a layer")
    a = ap.parse_args()
    launches = [l for l in json.load(open(a.step)) if not l["kernel"].startswith(BENCH_ONLY)]
    total_us = sum(l["us"] for l in launches)
    scale = a.step_us / total_us if a.step_us else 1.0
    fixed = min(l["us"] for l in launches) * scale
    if a.batch:
        batched(launches, a, scale, fixed)
        return
    by_kind = {}
    for l in launches:
        t, b, eta = measured(l, scale, fixed, a.gpu_bandwidth)
        kind = by_kind.setdefault(l["kernel"], {"n": 0, "bytes": 0.0, "h100_us": 0.0, "eta_bytes": 0.0})
        kind["n"] += 1
        kind["bytes"] += b
        kind["h100_us"] += t
        kind["eta_bytes"] += b / eta if eta else 0.0  # bytes at 100% bandwidth equivalent
    n = len(launches)
    print(f"{n} launches, {total_us * scale:.0f} us on the measuring GPU (fixed cost {fixed:.2f} us a launch), "
          f"{sum(k['bytes'] for k in by_kind.values()) / 1e9:.3f} GB")
    print("| kernel | launches | MB | GPU us | eta (of copy bandwidth, bytes part) |")
    print("|---|---|---|---|---|")
    for name, k in sorted(by_kind.items(), key=lambda kv: -kv[1]["h100_us"]):
        eta = k["bytes"] / k["eta_bytes"] if k["eta_bytes"] else 1.0
        print(f"| {name} | {k['n']} | {k['bytes'] / 1e6:.1f} | {k['h100_us']:.0f} | {eta * 100:.0f}% |")
    print()
    print(f"| chip | GB/s | bytes at measured eta, ms | dispatches, ms | tok/s | vs mlx-lm {a.mlx_tok_s} (M3 Ultra) |")
    print("|---|---|---|---|---|---|")
    for chip, bw in CHIPS:
        bytes_ms = sum(k["eta_bytes"] for k in by_kind.values()) / bw * 1e3
        dispatch_ms = mac_dispatch_ms(n)
        step_ms = bytes_ms + dispatch_ms + a.sync_ms
        ratio = f"{1e3 / step_ms / a.mlx_tok_s:.2f}x" if chip == "M3 Ultra" else ""
        print(f"| {chip} | {bw / 1e9:.0f} | {bytes_ms:.2f} | {dispatch_ms:.2f} | {1e3 / step_ms:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
