#!/usr/bin/env python3
"""The tensor-core decode products (kernels/affine_mma.cu) against the streamed ones
(kernels/affine_stream.cu) on a CUDA GPU: their error against the float64 reference, and
their times at Qwen3-Next-80B-A3B's and Qwen3.8-Flash-Next's decode shapes (issue 25).

  python3 affine_mma_cuda.py --out DIR --stream affine_stream.ptx --mma affine_mma.ptx [--ncu]

1. Error: every mma entry point (groups 64/128, 128..4096 columns, scales in f32/f16/bf16,
   bf16 x, products and SwiGLU, dense and gathered by id with x_div 1 and > 1, an
   out-of-range id giving NaN, row counts that do not fill a tile, 1..8 warps a tile) within
   the bf16 tolerance of the reference and the same bits twice (the warps split the columns, so
   the bits depend on the warp count: each is checked). The streamed kernel's worst error on the
   same cases is printed beside the mma kernel's.
2. Time: each projection of one token as graphs of 64 launches, each reading another copy of
   the weights (together > 4x the L2), the streamed kernel at the host's launch against the mma
   kernel at 1..8 warps a tile, against the bytes floor at the measured copy bandwidth.
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from affine_decode_cuda import (DT, Matrix, Params, copy_bandwidth, lanes_per_row, reference,  # noqa: E402
                                rel_err, time_graph, timing_inputs, TOLERANCE)
from affine_stream_cuda import launch_shared, run_stream, full_blocks  # noqa: E402
from gdn_cuda import Module  # noqa: E402

MAX_WARPS = 8
STAGES = 2
BATCH = 2
RAISED = set()


def stage_bytes():
    return BATCH * 2 * 32 * 16 + 4 * 32 * 8


def auto_warps(cols, group):
    """crates/gdn-ops/src/ops/affine/mma.rs `warps`, mirrored: a warp a whole macro step of 8
    groups, at most 8, a power of two."""
    macros = max(1, min(8, cols // (8 * group)))
    return 1 << (macros.bit_length() - 1)


def auto_blocks(outs, slots, cols, group, swiglu, sms):
    """mma.rs `launch`'s grid width: 16 / W blocks an SM over the grid rows, at most the tiles."""
    tiles = -(-outs // (8 if swiglu else 16))
    per_sm = max(1, 16 // auto_warps(cols, group))
    return max(1, min(tiles, -(-per_sm * sms // max(1, slots))))


def shared_bytes(cols, group, warps, sdt="bf16"):
    return warps * STAGES * stage_bytes() + 2 * cols + 4 * (cols // group) + 4 * 2 * 16 * warps


def resident(warps, cols=2048, group=64):
    """Blocks an SM holds at once: by registers (~112 a thread) and by shared memory."""
    return max(1, min(65536 // (112 * 32 * warps), 228 * 1024 // (shared_bytes(cols, group, warps) + 1024)))


def raise_shared(mod, name):
    from gdn_cuda import _cuda, check_cu
    if (id(mod), name) not in RAISED:
        check_cu(_cuda.cuFuncSetAttribute(mod.func(name), 8, 227 * 1024), "cuFuncSetAttribute")  # MAX_DYNAMIC_SHARED
        RAISED.add((id(mod), name))


def run_mma(mod, m, x, ids, x_div, out_rows, swiglu, sdt, warps=None, y=None, blocks_x=None):
    outs = m.rows // 2 if swiglu else m.rows
    w = warps or auto_warps(m.cols, m.group)
    if y is None:
        y = torch.full((out_rows, outs), float("nan"), dtype=torch.bfloat16, device="cuda")
    kind = "swiglu" if swiglu else "products"
    tiles = -(-outs // (8 if swiglu else 16))
    bx = min(tiles, blocks_x) if blocks_x else tiles
    p = Params(m.rows, m.cols, m.bits, m.group, out_rows, x_div, int(ids is not None))
    idp = ids.data_ptr() if ids is not None else m.packed.data_ptr()
    name = f"affine_mma_{kind}_b4_bf16_{sdt}"
    raise_shared(mod, name)
    launch_shared(mod, name, (bx, out_rows, 1), (32 * w, 1, 1), shared_bytes(m.cols, m.group, w, sdt),
                  [("p", m.packed.data_ptr()), ("p", m.scales.data_ptr()), ("p", m.biases.data_ptr()),
                   ("p", x.data_ptr()), ("p", idp), ("p", y.data_ptr()), ("s", p), ("u", m.experts)])
    return y


def bits_of(t):
    return t.view(torch.int16)


def correctness(stream, mma, log):
    gen = torch.Generator().manual_seed(7)
    cases = failures = 0
    worst_mma = worst_stream = 0.0
    for group in (64, 128):
        for cols in (128, 512, 640, 2048, 2560, 4096, 6144):
            if cols % group or (cols // group) % 2:
                continue  # the host takes an even count of groups only (pairs of scales a copy)
            for sdt in ("f32", "f16", "bf16"):
                for swiglu in (False, True):
                    rows = 2 * (5 + int(torch.randint(0, 60, (1,), generator=gen)))
                    experts = 3
                    m = Matrix(experts, rows, cols, 4, group, sdt, gen)
                    for (tokens, slots, per_slot) in ((1, 1, False), (1, 4, False), (2, 3, True)):
                        out_rows = tokens * slots
                        ids = torch.randint(0, experts, (out_rows,), generator=gen, dtype=torch.int32)
                        if slots == 4:
                            ids[2] = experts + 5  # out of range: NaN
                        ids = ids.cuda()
                        x = (torch.rand(out_rows if per_slot else tokens, cols, generator=gen) * 2 - 1)
                        x = x.to(torch.bfloat16).cuda()
                        x_div = 1 if per_slot else slots
                        want = reference(m, x, ids, x_div, out_rows, swiglu, "bf16")
                        s_err = float("nan")
                        if -(-(cols // 32) // lanes_per_row(cols, 4)) <= 4:
                            got_s = run_stream(stream, m, x, ids, x_div, out_rows, swiglu, 1, "bf16", sdt,
                                               full_blocks(rows // 2 if swiglu else rows, lanes_per_row(cols, 4), 1))
                            torch.cuda.synchronize()
                            s_err = rel_err(got_s, want)
                            worst_stream = max(worst_stream, s_err)
                        for w, bx in ((1, None), (2, None), (3, 2), (5, None), (MAX_WARPS, 1), (2, 3)):
                            a = run_mma(mma, m, x, ids, x_div, out_rows, swiglu, sdt, w, blocks_x=bx)
                            b = run_mma(mma, m, x, ids, x_div, out_rows, swiglu, sdt, w, blocks_x=bx)
                            torch.cuda.synchronize()
                            err = rel_err(a, want)
                            same = torch.equal(bits_of(a), bits_of(b))
                            cases += 1
                            worst_mma = max(worst_mma, err)
                            if not (err <= TOLERANCE["bf16"] and same):
                                failures += 1
                                print(f"FAIL group {group} cols {cols} rows {rows} {sdt} swiglu {swiglu} "
                                      f"slots {slots} warps {w}: rel err {err:.3g} (stream {s_err:.3g}), "
                                      f"repeat identical {same}", file=log)
    # A dense (no ids) product.
    m = Matrix(1, 77, 2048, 4, 64, "bf16", gen)
    x = (torch.rand(1, 2048, generator=gen) * 2 - 1).to(torch.bfloat16).cuda()
    want = reference(m, x, None, 1, 1, False, "bf16")
    got = run_mma(mma, m, x, None, 1, 1, False, "bf16")
    torch.cuda.synchronize()
    cases += 1
    if rel_err(got, want) > TOLERANCE["bf16"]:
        failures += 1
        print(f"FAIL dense: {rel_err(got, want):.3g}", file=log)
    print(f"worst relative error: mma {worst_mma:.3g}, stream {worst_stream:.3g}", file=log)
    return cases, failures, worst_mma, worst_stream


# (name, experts, rows, cols, bits, slots, x rows, swiglu)
SHAPES = [
    ("80b gdn.in_proj", 1, 12352, 2048, 4, 1, 1, False),
    ("80b gdn.out_proj", 1, 2048, 4096, 4, 1, 1, False),
    ("80b attn.qkv", 1, 9216, 2048, 4, 1, 1, False),
    ("80b moe.gate_up", 513, 1024, 2048, 4, 11, 1, True),
    ("80b moe.down", 513, 2048, 512, 4, 11, 11, False),
    ("80b lm_head", 1, 151936, 2048, 4, 1, 1, False),
    ("3.8 gdn.in_proj", 1, 16480, 2560, 4, 1, 1, False),
    ("3.8 gdn.out_proj", 1, 2560, 6144, 4, 1, 1, False),
    ("3.8 attn.qkv", 1, 13312, 2560, 4, 1, 1, False),
    ("3.8 moe.gate_up", 513, 1280, 2560, 4, 11, 1, True),
    ("3.8 moe.down", 513, 2560, 640, 4, 11, 11, False),
]


def stream_launch(outs, slots, cols, swiglu, sms):
    """crates/gdn-ops/src/ops/affine/stream.rs `launch` (rows, blocks_x), mirrored."""
    lpr = lanes_per_row(cols, 4)
    steps = max(1, -(-(cols // 32) // lpr))
    steps = 1 if steps <= 1 else 2 if steps <= 2 else 4
    resident = lambda rr: 8 if rr * steps <= 2 else 4 if rr * steps <= 4 else 2  # noqa: E731
    read = lambda r: 2 * r if swiglu else r  # noqa: E731
    target = lambda r: max(1, -(-(resident(read(r)) * sms) // slots))  # noqa: E731
    full = lambda r: full_blocks(outs, lpr, r)  # noqa: E731
    r = 2 if (not swiglu and full(1) <= target(1) and full(2) * slots >= sms) else 1
    return r, min(full(r), target(r)), steps


def timing(stream, mma, bw, sms, log, variants=None):
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows_out = []
    for shape in SHAPES:
        (name, experts, rows, cols, bits, slots, xrows, swiglu) = shape
        copies, mats, x, ids, x_div, outs, read, _, floor_us = timing_inputs(shape, gen, bw)
        n = 64
        ys = [torch.empty((slots, outs), dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
        res = {}
        if -(-(cols // 32) // lanes_per_row(cols, 4)) <= 4:
            r, bx, _ = stream_launch(outs, slots, cols, swiglu, sms)
            res["stream"] = time_graph([lambda k=k: run_stream(stream, mats[k % copies], x, ids[k % copies], x_div, slots,
                                                               swiglu, r, "bf16", "bf16", bx, ys[k % copies])
                                        for k in range(n)])
        tiles = -(-outs // (8 if swiglu else 16))
        aw, ab = auto_warps(cols, 64), auto_blocks(outs, slots, cols, 64, swiglu, sms)
        res["host"] = time_graph([lambda k=k: run_mma(mma, mats[k % copies], x, ids[k % copies], x_div, slots, swiglu,
                                                      "bf16", aw, ys[k % copies], ab)
                                  for k in range(n)])
        global BATCH, STAGES
        for tag, vmod, vb, vs in (variants or [("", mma, BATCH, STAGES)]):
          BATCH, STAGES = vb, vs
          for w in (1, 2, 4, 8):
            if w > -(-cols // 512):
                continue
            for per_sm in (0, 1, 2, 3, 4, 6, 8, 12):
                if per_sm > resident(w, cols) or per_sm in (1, 2) and w < 4:
                    continue
                bx = tiles if per_sm == 0 else max(1, min(tiles, -(-per_sm * sms // slots)))
                key = f"mma{tag} w{w} b{bx}"
                if key in res:
                    continue
                res[key] = time_graph([lambda k=k, w=w, bx=bx, vmod=vmod: run_mma(vmod, mats[k % copies], x, ids[k % copies], x_div,
                                                                       slots, swiglu, "bf16", w, ys[k % copies], bx)
                                       for k in range(n)])
        print(f"{name}: {res}", file=log)
        rows_out.append((name, read, floor_us, res))
        del mats
        torch.cuda.empty_cache()
    return rows_out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--mma", required=True)
    ap.add_argument("--variant", nargs="*", default=[], help="tag:path.ptx:batch:stages, timed beside --mma")
    ap.add_argument("--ncu", action="store_true", help="three eager launches of each kernel at the "
                    "3.8 in-projection and gate/up shapes, for ncu")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "affine_mma.log"), "w")
    stream, mma = Module(a.stream), Module(a.mma)
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(f"device: {props.name}, {sms} SMs", file=log)
    for n in ("affine_mma_products_b4_bf16_bf16", "affine_mma_swiglu_b4_bf16_bf16"):
        print(f"{n}: registers, local bytes {mma.regs(n)}", file=log)
    if a.ncu:
        gen = torch.Generator(device="cuda").manual_seed(5)
        for (name, experts, rows, cols, bits, slots, xrows, swiglu) in SHAPES:
            if name not in ("3.8 gdn.in_proj", "3.8 moe.gate_up"):
                continue
            mats = [Matrix(experts, rows, cols, bits, 64, "bf16", gen) for _ in range(4)]
            x = (torch.rand(xrows, cols, generator=gen, device="cuda") * 2 - 1).to(torch.bfloat16)
            ids = torch.randperm(experts, generator=gen, device="cuda")[:slots].to(torch.int32) if experts > 1 else None
            x_div = 1 if xrows == slots else slots
            outs = rows // 2 if swiglu else rows
            r, bx, _ = stream_launch(outs, slots, cols, swiglu, sms)
            run_stream(stream, mats[0], x, ids, x_div, slots, swiglu, r, "bf16", "bf16", bx)
            for k, (w, per_sm) in enumerate(((1, 1), (2, 4), (1, 8))):
                run_mma(mma, mats[k + 1], x, ids, x_div, slots, swiglu, "bf16", w, None, per_sm * sms // slots)
            torch.cuda.synchronize()
        return
    cases, failures, wm, ws = correctness(stream, mma, log)
    print(f"error: {cases - failures}/{cases} mma cases within the bf16 tolerance and repeatable; "
          f"worst relative error mma {wm:.3g}, stream {ws:.3g}")
    log.flush()
    bw = copy_bandwidth()
    variants = [("", mma, BATCH, STAGES)] + [(f"-{v.split(':')[0]}", Module(v.split(":")[1]), int(v.split(":")[2]),
                                             int(v.split(":")[3])) for v in a.variant]
    table = timing(stream, mma, bw, sms, log, variants)
    log.close()
    print(f"\ncopy bandwidth {bw / 1e9:.0f} GB/s; {props.name}, {sms} SMs")
    print("| projection | MB | floor us | streamed us (GB/s) | host's mma launch us (GB/s) | best mma us (GB/s), warps | others |")
    print("|---|---|---|---|---|---|---|")
    for (name, nbytes, floor_us, res) in table:
        st = res.get("stream")
        best = min((v, k) for k, v in res.items() if k.startswith("mma"))
        others = ", ".join(f"{k}: {v:.2f}" for k, v in sorted((kv for kv in res.items() if kv[0].startswith("mma")),
                                                              key=lambda kv: kv[1])[:4])
        sts = f"{st:.2f} ({nbytes / st / 1e3:.0f})" if st else "-"
        host = res["host"]
        print(f"| {name} | {nbytes / 1e6:.2f} | {floor_us:.2f} | {sts} | {host:.2f} ({nbytes / host / 1e3:.0f}) | "
              f"{best[0]:.2f} ({nbytes / best[0] / 1e3:.0f}), "
              f"{best[1]} | {others} |")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
