#!/usr/bin/env python3
"""Check and benchmark kernels/gated_delta_chunk.cu (the chunked gated delta on TF32 tensor
cores, three passes: per-chunk parts in parallel, the state over the chunks in sequence, y in
parallel) on a CUDA GPU; run on the device machine by scripts/gpu/bench-chunk.sh.

  python3 scripts/gpu/gdn_chunk_cuda.py --chunk-ptx gated_delta_chunk.ptx \
      --step-ptx gated_delta.ptx --out DIR

1. Correctness: the host's split (full chunks through the chunk kernel, the tail through the
   recurrence kernel, a bf16 state widened to f32 for both and rounded once) for every InT/StT
   entry point against the float64 recurrence of gdn_cuda.py, with its gates (y within one
   InT ulp or 1e-5 of max|y|; f32 state within 1e-5 of max|S|); a bf16 state must be exactly
   the f32-state run of the same inputs rounded once, and so within one bf16 ulp plus the f32
   gate of the reference (compare_chunk).
2. Timing at Qwen3-Next-80B's GDN shapes (B 1, Hk 16, Hv 32, Dk = Dv = 128, bf16 activations,
   f32 state), T = 512 and 4096, CUDA events around 10 calls queued back to back (so that the
   Python launch cost, ~20-60 us a launch here, overlaps the GPU's work instead of being
   counted; a call whose host side is longer than its GPU work is timed at its host side),
   per call, median of 5, after warm-up, three rotating input sets:
   our chunk kernels (the three passes, and each alone), our recurrence kernel, fla's
   chunk_gated_delta_rule (fla-core from a carried wheel; when it cannot be imported the table
   says so) and a PyTorch version of the chunk algorithm (torch_chunk below: batched matmuls,
   written here as a baseline; it is not fla); and at T = 64, 128, 256 ours alone (chunk
   against recurrence: where CUDA_CHUNKED_MIN_STEPS should sit). Prints a side-by-side table
   with ratios.
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
from gdn_cuda import (DT, Module, _cuda, check_cu, compare, gdn_launch,  # noqa: E402
                      make_inputs, open_log, reference, ulp)

CHUNK = 64
BLOCK_V = 32
THREADS = 256
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_cuda.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]


class Params(ctypes.Structure):
    """GdnChunkParams of kernels/params/gated_delta_chunk.h."""
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("batch", "steps", "chunks", "key_heads", "value_heads", "key_dim", "value_dim", "has_mask")]


def smem_bytes(dk, dv, in_bytes):
    """prep_smem_floats(Dk, Dv), state_smem_floats(Dk, in_bytes), out_smem_floats(Dk) of the kernel, in bytes."""
    ld = lambda d: d + 8  # noqa: E731
    prep = CHUNK * ld(dk) + CHUNK * ld(dv) + 2 * CHUNK * 72 + 4 * 16 * 24 + 3 * CHUNK
    nb = 2 if dk <= 128 else 1
    k_part = nb * CHUNK * ld(dk) if in_bytes == 4 else CHUNK * ld(dk) + nb * CHUNK * dk * in_bytes // 4
    state = dk * 40 + nb * CHUNK * ld(dk) + k_part + CHUNK * 40 + nb * (CHUNK * BLOCK_V + CHUNK)
    out = CHUNK * ld(dk) + max(CHUNK * ld(dk), (dk + CHUNK) * 40) + CHUNK * 72 + CHUNK * 40 + 2 * CHUNK
    return 4 * prep, 4 * state, 4 * out


def _launch(f, grid, smem, args):
    check_cu(_cuda.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), "cuFuncSetAttribute")
    holders = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else a for a in args]
    params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    stream = torch.cuda.current_stream().cuda_stream
    rc = _cuda.cuLaunchKernel(f, grid[0], grid[1], 1, THREADS, 1, 1, smem, ctypes.c_void_p(stream), params, None)
    check_cu(rc, "cuLaunchKernel(gated_delta_chunk)")


def chunk_scratch(B, Hv, Dk, Dv, chunks):
    """The f32 scratch between the passes: gcum, w, u (then v_new), h."""
    n, t = B * Hv, chunks * CHUNK
    f = dict(device="cuda", dtype=torch.float32)
    return (torch.empty(n * t, **f), torch.empty(n * t * Dk, **f), torch.empty(n * t * Dv, **f),
            torch.empty(n * chunks * Dk * Dv, **f))


def chunk_launch(mod, q, k, v, g, beta, state, y, mask, chunks, scratch=None, passes=(0, 1, 2)):
    """The three passes of kernels/gated_delta_chunk.cu, as cuda_chunked.rs launches them
    (`passes` picks some of them, for timing one alone on a scratch that holds a run's data)."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    assert Dk % 16 == 0 and Dk <= 256 and Dv % BLOCK_V == 0 and Dv <= 256 and 1 <= chunks and chunks * CHUNK <= T
    inn = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[q.dtype]
    st = {torch.float32: "f32", torch.bfloat16: "bf16"}[state.dtype]
    gcum, w, u, h = scratch if scratch is not None else chunk_scratch(B, Hv, Dk, Dv, chunks)
    p = Params(B, T, chunks, Hk, Hv, Dk, Dv, 1 if mask is not None else 0)
    m = mask if mask is not None else g
    prep_smem, state_smem, out_smem = smem_bytes(Dk, Dv, q.element_size())
    if 0 in passes:
        _launch(mod.func(f"gated_delta_chunk_prep_{inn}"), (chunks, B * Hv), prep_smem,
                [k, v, g, beta, m, gcum, w, u, p])
    if 1 in passes:
        _launch(mod.func(f"gated_delta_chunk_state_{inn}_{st}"), (Dv // BLOCK_V, B * Hv), state_smem,
                [k, gcum, w, u, h, state, p])
    if 2 in passes:
        _launch(mod.func(f"gated_delta_chunk_out_{inn}"), (chunks, B * Hv), out_smem, [q, k, gcum, h, u, m, y, p])


def chunked_update(chunk_mod, step_mod, q, k, v, g, beta, state, mask):
    """The host's split (crates/gdn-ops/src/ops/gated_delta/chunked.rs); returns y, advances state."""
    B, T = q.shape[:2]
    chunks, done = T // CHUNK, (T // CHUNK) * CHUNK
    y = torch.full((B, T) + v.shape[2:], float("nan"), device="cuda", dtype=q.dtype)
    if chunks == 0:
        gdn_launch(step_mod, q, k, v, g, beta, state, y, mask)
        return y
    if done == T:
        chunk_launch(chunk_mod, q, k, v, g, beta, state, y, mask, chunks)
        return y
    work = state if state.dtype == torch.float32 else state.float()
    chunk_launch(chunk_mod, q, k, v, g, beta, work, y, mask, chunks)
    rest = [t[:, done:].contiguous() for t in (q, k, v, g, beta)]
    y_tail = torch.empty((B, T - done) + v.shape[2:], device="cuda", dtype=q.dtype)
    m = mask[:, done:].contiguous() if mask is not None else None
    gdn_launch(step_mod, *rest, work, y_tail, m)
    y[:, done:] = y_tail
    if work is not state:
        state.copy_(work.to(state.dtype))
    return y


def torch_chunk(q, k, v, g, beta, state, C=CHUNK):
    """The chunk algorithm in PyTorch (f32 batched matmuls, chunks in sequence): a baseline for
    timing only. T must be a multiple of C; the state is [B, Hv, Dv, Dk] and advanced in place."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    grp = Hv // Hk
    qf = q.float().repeat_interleave(grp, dim=2).transpose(1, 2).reshape(B, Hv, T // C, C, Dk)
    kf = k.float().repeat_interleave(grp, dim=2).transpose(1, 2).reshape(B, Hv, T // C, C, Dk)
    vf = v.float().transpose(1, 2).reshape(B, Hv, T // C, C, Dv)
    lg = g.log().transpose(1, 2).reshape(B, Hv, T // C, C).cumsum(-1)
    bt = beta.transpose(1, 2).reshape(B, Hv, T // C, C)
    eye = torch.eye(C, device=q.device)
    strict = torch.tril(torch.ones(C, C, device=q.device, dtype=torch.bool), -1)
    causal = torch.tril(torch.ones(C, C, device=q.device, dtype=torch.bool))
    S = state.float().transpose(-1, -2).contiguous()  # S^T [B, Hv, Dk, Dv]
    ys = []
    for c in range(T // C):
        kc, qc, vc, gc, bc = kf[:, :, c], qf[:, :, c], vf[:, :, c], lg[:, :, c], bt[:, :, c]
        decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~causal, -float("inf")).exp()
        L = (kc @ kc.transpose(-1, -2)) * decay * bc[..., None]
        A = eye + L.masked_fill(~strict, 0.0)
        R = bc[..., None] * (vc - gc.exp()[..., None] * (kc @ S))
        Vp = torch.linalg.solve_triangular(A, R, upper=False, unitriangular=True)
        ys.append(gc.exp()[..., None] * (qc @ S) + ((qc @ kc.transpose(-1, -2)) * decay) @ Vp)
        gl = gc[..., -1:]
        S = gl.exp()[..., None] * S + kc.transpose(-1, -2) @ ((gl - gc).exp()[..., None] * Vp)
    state.copy_(S.transpose(-1, -2).to(state.dtype))
    return torch.stack(ys, dim=2).reshape(B, Hv, T, Dv).transpose(1, 2)


def compare_chunk(y, state, sibling_state, ref_y, ref_s, in_dt, st_dt):
    """compare()'s gates, with the bf16 state judged as what it is: the f32 state the kernels
    computed (the f32-state sibling run, within the f32 gate of 1e-5 max|S|) rounded once. So a
    bf16 value may be off the float64 reference by half a bf16 ulp of rounding plus that f32
    error: within ulp(ref) + 1e-5 max|S| (compare()'s one ulp + 1e-7 max|S| fits the
    recurrence, whose f32 error is per value, not a chunk form's, which is relative to max|S|)."""
    r = compare(y, state, ref_y, ref_s, in_dt, torch.float32 if st_dt == torch.float32 else st_dt)
    if st_dt == torch.float32:
        return r
    smax = ref_s.abs().max().item()
    tol_s = ulp(ref_s, torch.bfloat16) + 1e-5 * smax
    r["s_err_over_tol"] = ((state.double() - ref_s).abs() / tol_s).max().item()
    r["sibling_over_tol"] = ((sibling_state.double() - ref_s).abs().max().item()) / (1e-5 * smax)
    r["rounded_once"] = torch.equal(state, sibling_state.to(torch.bfloat16))
    r["ok"] = (r["finite"] and r["y_err_over_tol"] <= 1.0 and r["s_err_over_tol"] <= 1.0
               and r["sibling_over_tol"] <= 1.0 and r["rounded_once"])
    return r


def run_checks(chunk_mod, step_mod, log, seed=4321):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    n_ok = n_fail = 0
    cases = [(1, 1, 16, 32, 128, 128, False), (1, 63, 16, 32, 128, 128, False),
             (1, 64, 16, 32, 128, 128, False), (1, 200, 16, 32, 128, 128, False),
             (2, 130, 2, 4, 128, 128, True), (1, 65, 16, 64, 128, 128, False), (1, 512, 16, 32, 128, 128, False),
             (1, 128, 1, 2, 256, 32, False), (1, 64, 1, 2, 192, 128, False), (1, 128, 2, 2, 64, 256, True)]
    for (B, T, Hk, Hv, Dk, Dv, masked) in cases:
        for inn in ["f32", "f16", "bf16"]:
            for st in ["f32", "bf16"]:
                q, k, v, g, beta, state, mask = make_inputs(B, T, Hk, Hv, Dk, Dv, DT[inn], DT[st], masked, gen)
                ref_y, ref_s = reference(q, k, v, g, beta, state, mask)
                sibling = state.float().clone()  # a copy also for an f32 state: .float() would alias it
                y = chunked_update(chunk_mod, step_mod, q, k, v, g, beta, state, mask)
                chunked_update(chunk_mod, step_mod, q, k, v, g, beta, sibling, mask)
                torch.cuda.synchronize()
                r = compare_chunk(y, state, sibling, ref_y, ref_s, DT[inn], DT[st])
                n_ok += r["ok"]
                n_fail += not r["ok"]
                extra = "" if st == "f32" else (f" f32 sibling {r['sibling_over_tol']:.2f} of tol, "
                                                f"rounded once {r['rounded_once']}")
                log(f"{'ok  ' if r['ok'] else 'FAIL'} chunk B={B} T={T:<4} Hk={Hk:<2} Hv={Hv:<2} Dk={Dk} Dv={Dv} "
                    f"mask={int(masked)} {inn:>4}/{st:<4} y {r['y_err_rel_max']:.2e} ({r['y_err_over_tol']:.2f} of tol) "
                    f"state {r['s_err_rel_max']:.2e} ({r['s_err_over_tol']:.2f} of tol){extra}")
    log(f"chunk kernel checks: {n_ok} passed, {n_fail} failed")
    return n_fail == 0


def queued_time(fns, calls=10, reps=5, warm=2):
    """Per-call time (us) of `calls` calls queued back to back between two events; median of `reps`."""
    for i in range(warm * len(fns)):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(calls):
            fns[i % len(fns)]()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def run_bench(chunk_mod, step_mod, fla, log):
    B, Hk, Hv, Dk, Dv = 1, 16, 32, 128, 128
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    rows = []
    # T = 64..256: ours only, where the chunk form starts to beat the recurrence
    # (CUDA_CHUNKED_MIN_STEPS in crates/gdn-ops/src/ops/gated_delta/mod.rs).
    for T in [64, 128, 256, 512, 4096]:
        full = T >= 512
        data = []
        for _ in range(3):
            q, k, v, g, beta, state, _ = make_inputs(B, T, Hk, Hv, Dk, Dv, torch.bfloat16, torch.float32, False, gen)
            y = torch.empty(B, T, Hv, Dv, device="cuda", dtype=torch.bfloat16)
            data.append((q, k, v, g, beta, state, y, g.log()))
        res = {}
        fns = [(lambda d=d: chunk_launch(chunk_mod, *d[:7], None, T // CHUNK)) for d in data]
        res["ours chunk"] = queued_time(fns)
        # Each pass alone, on scratch a full run filled (the state pass then runs on v_new as if
        # it were u: other values, the same work).
        scr = chunk_scratch(B, Hv, Dk, Dv, T // CHUNK)
        chunk_launch(chunk_mod, *data[0][:7], None, T // CHUNK, scratch=scr)
        passes = ["pass 1 (prep, parallel)", "pass 2 (state, sequential)", "pass 3 (y, parallel)"] if full else []
        for i, name in enumerate(passes):
            fns = [lambda i=i: chunk_launch(chunk_mod, *data[0][:7], None, T // CHUNK, scratch=scr, passes=(i,))]
            res[f"  ours chunk {name}"] = queued_time(fns)
        del scr
        fns = [(lambda d=d: gdn_launch(step_mod, *d[:7], None)) for d in data]
        res["ours recurrence"] = queued_time(fns)
        if fla is not None and full:
            try:
                fns = [(lambda d=d: fla(d[0], d[1], d[2], g=d[7], beta=d[4], scale=1.0, initial_state=d[5],
                                        output_final_state=True, state_v_first=True)) for d in data]
                res["fla chunk_gated_delta_rule"] = queued_time(fns)
            except Exception as e:
                log(f"fla chunk_gated_delta_rule failed at T={T}: {e!r}")
        if full:
            try:
                fns = [(lambda d=d: torch_chunk(*d[:6])) for d in data]
                res["torch chunk (baseline, not fla)"] = queued_time(fns, calls=2, reps=3, warm=1)
            except Exception as e:
                log(f"torch chunk failed at T={T}: {e!r}")
        ours = res["ours chunk"]
        for name, us in res.items():
            rows.append((T, name, us, us / ours, B * T / (us * 1e-6) / 1e3))
        del data
        torch.cuda.empty_cache()
    log("\nchunked gated delta, Qwen3-Next-80B GDN layer (B 1, Hk 16, Hv 32, Dk = Dv = 128, bf16 in, f32 state)")
    log(f"{'T':>6}  {'kernel':<34}{'us':>10}{'x ours chunk':>14}{'k tok/s':>10}")
    for T, name, us, ratio, ktok in rows:
        log(f"{T:>6}  {name:<34}{us:>10.1f}{ratio:>13.2f}x{ktok:>10.1f}")
    if fla is None:
        log("fla-core not importable: carry its wheel (see bench-chunk.sh); the torch chunk row is our own baseline")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk-ptx", required=True)
    ap.add_argument("--step-ptx", required=True)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    log = open_log(args.out, "gdn_chunk.log")

    torch.backends.cuda.matmul.allow_tf32 = False
    log(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0)}")
    chunk_mod, step_mod = Module(args.chunk_ptx), Module(args.step_ptx)
    for i, n in enumerate(["gated_delta_chunk_prep_bf16", "gated_delta_chunk_state_bf16_f32", "gated_delta_chunk_out_bf16"]):
        r, lm = chunk_mod.regs(n)
        log(f"  {n}: {r} registers, {lm} B local memory per thread, {smem_bytes(128, 128, 2)[i]} B shared at Dk = Dv = 128")
    fla = None
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        fla = chunk_gated_delta_rule
        log("fla-core imported")
    except Exception as e:
        log(f"fla not available: {e!r}")
    ok = False
    try:
        ok = run_checks(chunk_mod, step_mod, log)
    except Exception:
        log("checks raised:\n" + traceback.format_exc())
    try:
        run_bench(chunk_mod, step_mod, fla, log)
    except Exception:
        log("bench raised:\n" + traceback.format_exc())
    log(f"\nRESULT: chunk kernel checks {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
