#!/usr/bin/env python3
"""Prints a bench --json report's speeds and, for each kernel profile in it (decode_profile,
verify_profile, batch_profile), its sums per op (and projection label): calls, µs, % of copy.

  python3 scripts/gpu/summarize-profile.py report.json
"""
import collections
import json
import sys


def main():
    text = open(sys.argv[1]).read()
    if "{" not in text:
        sys.exit(f"{sys.argv[1]}: no JSON report")
    d = json.loads(text[text.index("{"):])
    for key in ("prompt_tps", "generation_tps"):
        if key in d:
            print(f"{key}: {d[key]['median']:.1f}")
    vc = d.get("verify_cost")
    if vc:
        print("verify pass ms per k:", [round(s["median"] * 1e3, 3) for s in vc["pass_seconds"]],
              "ratio:", [round(r, 2) for r in vc.get("ratio_to_one_token", [])])
    for prof in ("decode_profile", "verify_profile", "batch_profile"):
        p = d.get(prof)
        if not p:
            continue
        rows = collections.OrderedDict()
        for r in p["kernels"]:
            k = (r["op"], r.get("label") or "")
            e = rows.setdefault(k, [0, 0.0, 0])
            e[0] += 1
            e[1] += r["seconds"]
            e[2] += r["bytes_read"] + r["bytes_written"]
        bw = p["copy_bandwidth"]["bytes_per_second"]
        total = sum(e[1] for e in rows.values())
        print(f"{prof}: {p['profiled']}, rows {total * 1e3:.2f} ms, wall {p['wall_seconds'] * 1e3:.2f} ms, "
              f"launches {p['launches']['total']}")
        for (op, label), (n, s, b) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:14]:
            pct = 100 * b / s / bw if s else 0
            print(f"  {op:32} {label:14} {n:4} {s * 1e6:9.1f} us {s * 1e6 / n:7.1f} us/call {pct:5.1f}% copy")


if __name__ == "__main__":
    main()
