#!/usr/bin/env python3
"""Summarize an Nsight Compute CSV (`ncu --csv --print-units base`) of a `qwen-gdn bench` run
with eager decode steps into the kernels of the LAST decode step: one row per launch (name,
grid, block, time, DRAM bytes read/written, achieved GB/s), then sums per kernel kind.

  python3 ncu_decode.py ncu.csv --bandwidth 2.9e12 [--step-start affine_dequantize]

The last step is taken from the last launch whose name starts with --step-start (the
embedding row's dequantization opens every fused decode step) to the end of the run.
"""
import argparse
import collections
import csv
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--bandwidth", type=float, default=2.9e12)
    ap.add_argument("--step-start", default="affine_dequantize")
    ap.add_argument("--rows", action="store_true", help="print every launch of the step")
    ap.add_argument("--json", help="also write the step's launches to this JSON file "
                    "(name, grid, block, us, bytes read, bytes written) for scripts/metal_estimate.py")
    a = ap.parse_args()
    kernels = collections.OrderedDict()
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        k = kernels.setdefault(r["ID"], {"name": r["Kernel Name"], "grid": r["Grid Size"],
                                          "block": r["Block Size"], "m": {}})
        try:
            k["m"][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            k["m"][r["Metric Name"]] = r["Metric Value"]
    ks = list(kernels.values())
    starts = [i for i, k in enumerate(ks) if k["name"].startswith(a.step_start)]
    if not starts:
        sys.exit(f"no launch named {a.step_start}* in {a.csv}")
    step = ks[starts[-1]:]
    # If several steps follow the last start (should not), keep them all; report count.
    total_t = sum(k["m"].get("gpu__time_duration.sum", 0) for k in step)
    total_b = sum(k["m"].get("dram__bytes_read.sum", 0) + k["m"].get("dram__bytes_write.sum", 0) for k in step)
    print(f"last decode step: {len(step)} launches, {total_t / 1e3:.1f} us of kernel time, "
          f"{total_b / 1e6:.1f} MB DRAM traffic ({total_b / max(total_t, 1):.0f} GB/s averaged; "
          f"copy bandwidth {a.bandwidth / 1e9:.0f} GB/s)")
    kind = collections.OrderedDict()
    for k in step:
        base = re.sub(r"_(f32|f16|bf16|u32|i64|u8)(_(f32|f16|bf16))*$", "", k["name"].split("(")[0])
        key = (base, k["grid"], k["block"])
        e = kind.setdefault(key, [0, 0.0, 0.0])
        e[0] += 1
        e[1] += k["m"].get("gpu__time_duration.sum", 0)
        e[2] += k["m"].get("dram__bytes_read.sum", 0) + k["m"].get("dram__bytes_write.sum", 0)
    print("| kernel | grid | block | launches | us total | us each | MB each | GB/s | % of copy bw | % of step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (base, grid, block), (n, t, b) in sorted(kind.items(), key=lambda kv: -kv[1][1]):
        gbs = b / t if t else 0
        print(f"| {base} | {grid} | {block} | {n} | {t / 1e3:.1f} | {t / n / 1e3:.2f} | {b / n / 1e6:.2f} | "
              f"{gbs:.0f} | {gbs * 1e9 / a.bandwidth * 100:.0f}% | {t / total_t * 100:.1f}% |")
    if a.json:
        import json
        with open(a.json, "w") as f:
            json.dump([{"kernel": k["name"].split("(")[0], "grid": k["grid"], "block": k["block"],
                        "us": k["m"].get("gpu__time_duration.sum", 0) / 1e3,
                        "read": k["m"].get("dram__bytes_read.sum", 0),
                        "written": k["m"].get("dram__bytes_write.sum", 0)} for k in step], f, indent=0)
    if a.rows:
        print("\n| # | kernel | grid | block | us | MB read | MB written |")
        print("|---|---|---|---|---|---|---|")
        for i, k in enumerate(step):
            m = k["m"]
            print(f"| {i} | {k['name'].split('(')[0]} | {k['grid']} | {k['block']} | "
                  f"{m.get('gpu__time_duration.sum', 0) / 1e3:.2f} | {m.get('dram__bytes_read.sum', 0) / 1e6:.3f} | "
                  f"{m.get('dram__bytes_write.sum', 0) / 1e6:.3f} |")


if __name__ == "__main__":
    main()
