#!/usr/bin/env python3
"""Helper of scripts/bench-vs-peers (issue 7): runs the engines, computes the decode roofline and
prints the side-by-side table. Not meant to be called by hand; see scripts/bench-vs-peers.

Subcommands:

  mlx        (fixture venv: mlx-lm) a short decode-only reference run of mlx-lm's Python API on
             the -4bit folder: a short random-token prompt, then --max-tokens greedy tokens via
             mlx_lm.stream_generate; prints one JSON object (prompt_tps, generation_tps,
             peak_memory_bytes, ...).
  roofline   (stdlib only) bytes touched per decoded token for an MLX 4-bit checkpoint, from its
             config.json and safetensors headers; prints JSON.
  run        (.venv-llama: gguf-py from the vendored llama.cpp source) alternates `qwen-gdn bench`
             (with --q8-activations, the ratios' mode, and without: the exact path) and
             `llama-bench` rounds, reads an optional mlx JSON, prints the table; its last two
             lines are `decode ratio vs llama.cpp: X.XX` and `prefill ratio vs llama.cpp: Y.YY`.
             `--baseline-env VAR=VALUE` adds a third qwen-gdn q8 run per round with that
             variable set (e.g. QWEN_GDN_Q8_LAYOUT=plain), measured in the same rounds;
             `--baseline-bin PATH` runs that baseline with another build of qwen-gdn (e.g. the
             commit before a restructuring: a before/after in the same rounds).

  batch      (stdlib only) batched decode (issue 29): alternates `qwen-gdn bench --batch B,...
             --q8-activations` (both `--batch-products`: `shared`, the fewest weight reads, and
             `each-row-alone`, every sequence's own bits) and `llama-batched-bench -npl B,...`
             rounds on the same weights, prints the aggregate decode tok/s per B side by side;
             its last line is `batched decode ratio vs llama.cpp: B=1 X.XX, ..., lowest Y.YY`
             (qwen-gdn shared over llama.cpp, medians).

Roofline (bytes per decoded token, all read once from memory; compute is assumed free):
  - weights: every tensor of the checkpoint at its stored size (4-bit words + bf16 scales and
    biases; the 8-bit router and shared-expert gate; norms, conv, A_log, dt_bias), except the
    stacked experts (switch_mlp.* / experts.*: top_k / num_experts of their bytes) and the
    embedding (one row of weight, scales and biases); the lm_head counts whole;
  - GDN recurrent state: Hv * Dv * Dk * 4 bytes (fp32), read + written, per GDN layer;
  - GDN conv state: conv_dim * (kernel - 1) * 4 bytes, read + written, per GDN layer;
  - KV cache: Nkv * Dh * 2 (K and V) * 2 bytes (fp16, what llama.cpp stores) per position, read
    at the mean decode context (-p + -g/2) plus the new position written, per attention layer.
Roofline tok/s = measured copy bandwidth (STREAM copy, all cores, read + written bytes) / bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------
# roofline
# ----------------------------------------------------------------------------------------
def text_config(model: Path) -> dict:
    cfg = json.loads((model / "config.json").read_text())
    return cfg.get("text_config", cfg)


def safetensors_entries(model: Path):
    """(name, dtype, shape, nbytes) of every tensor in the folder's *.safetensors files."""
    for f in sorted(model.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, v in header.items():
            if name == "__metadata__":
                continue
            a, b = v["data_offsets"]
            yield name, v["dtype"], v["shape"], b - a


def layer_kinds(cfg: dict) -> list[str]:
    if "layer_types" in cfg:
        return list(cfg["layer_types"])
    k = cfg.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(cfg["num_hidden_layers"])]


def roofline(model: Path, context: float) -> dict:
    cfg = text_config(model)
    n_exp = cfg["num_experts"]
    topk = cfg["num_experts_per_tok"]
    vocab = cfg["vocab_size"]
    groups = {"embedding row": 0.0, "lm_head": 0.0, "experts (top-k)": 0.0, "shared expert": 0.0,
              "router + shared gate": 0.0, "attention / GDN projections": 0.0, "norms, conv, misc": 0.0}
    total_stored = 0
    for name, _dtype, shape, nbytes in safetensors_entries(model):
        total_stored += nbytes
        if name.startswith("mtp."):
            continue
        if "embed_tokens" in name:
            groups["embedding row"] += nbytes / vocab
        elif name.startswith("lm_head"):
            groups["lm_head"] += nbytes
        elif (".switch_mlp." in name or ".experts." in name) and shape and shape[0] == n_exp:
            groups["experts (top-k)"] += nbytes * topk / n_exp
        elif ".shared_expert." in name:
            groups["shared expert"] += nbytes
        elif name.endswith(("mlp.gate.weight", "mlp.gate.scales", "mlp.gate.biases")) or ".shared_expert_gate." in name:
            groups["router + shared gate"] += nbytes
        elif any(p in name for p in ("_proj.", "in_proj_")) and (".self_attn." in name or ".linear_attn." in name):
            groups["attention / GDN projections"] += nbytes
        else:
            groups["norms, conv, misc"] += nbytes
    kinds = layer_kinds(cfg)
    n_gdn = sum(k == "linear_attention" for k in kinds)
    n_att = len(kinds) - n_gdn
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    kern = cfg["linear_conv_kernel_dim"]
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    kv_pos = cfg["num_key_value_heads"] * head_dim * 2 * 2
    state = {
        "GDN recurrent state (f32, r+w)": n_gdn * hv * dv * dk * 4 * 2,
        "GDN conv state (f32, r+w)": n_gdn * conv_dim * (kern - 1) * 4 * 2,
        "KV cache (f16)": n_att * kv_pos * (context + 1),
    }
    weights = sum(groups.values())
    return {
        "model": str(model),
        "stored_bytes": total_stored,
        "layers": len(kinds), "gdn_layers": n_gdn, "attention_layers": n_att,
        "experts": n_exp, "top_k": topk, "context": context,
        "weights": groups, "weights_total": weights,
        "state": state, "bytes_per_token": weights + sum(state.values()),
    }


def gguf_active_bytes(gguf_path: Path, topk: int, n_exp: int) -> dict:
    """Active bytes per decoded token of the GGUF, counted the same way (its own tensor types)."""
    sys.path.insert(0, str(REPO / "build" / "llama.cpp" / "src" / "gguf-py"))
    from gguf import GGUFReader  # noqa: PLC0415

    r = GGUFReader(str(gguf_path))
    total = active = 0.0
    types = {}
    for t in r.tensors:
        nb = int(t.n_bytes)
        total += nb
        types.setdefault(t.tensor_type.name, 0)
        types[t.tensor_type.name] += nb
        if t.name.startswith("token_embd"):
            active += nb / int(t.shape[-1])
        elif "_exps" in t.name:
            active += nb * topk / n_exp
        else:
            active += nb
    return {"stored_bytes": total, "weights_active": active, "bytes_by_type": types}


# ----------------------------------------------------------------------------------------
# mlx-lm reference (fixture venv)
# ----------------------------------------------------------------------------------------
def cmd_mlx(a) -> None:
    import random  # noqa: PLC0415

    import mlx.core as mx  # noqa: PLC0415
    from mlx_lm import load, stream_generate  # noqa: PLC0415

    mx.set_default_device(mx.cpu)
    t0 = time.perf_counter()
    model, tok = load(a.model)
    load_s = time.perf_counter() - t0
    rng = random.Random(0)
    # Random ids below the special tokens, as qwen-gdn bench does.
    prompt = [rng.randrange(0, 151643) for _ in range(a.prompt_tokens)]
    last = None
    t0 = time.perf_counter()
    for last in stream_generate(model, tok, prompt, max_tokens=a.max_tokens):
        pass
    print(json.dumps({
        "engine": "mlx-lm", "model": a.model, "load_s": load_s, "wall_s": time.perf_counter() - t0,
        "prompt_tokens": last.prompt_tokens, "prompt_tps": last.prompt_tps,
        "generation_tokens": last.generation_tokens, "generation_tps": last.generation_tps,
        "peak_memory_bytes": int(last.peak_memory * 1e9),
    }))


# ----------------------------------------------------------------------------------------
# the alternated run
# ----------------------------------------------------------------------------------------
def run_timed(cmd: list[str], log, env: dict | None = None) -> tuple[str, int, float]:
    """Run cmd (with `env` added to the environment); return (stdout, peak RSS of the child
    in bytes, wall seconds)."""
    log.write(f"$ {' '.join(f'{k}={v}' for k, v in (env or {}).items())} {shlex.join(cmd)}\n")
    log.flush()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **(env or {})})
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    log.write(out + f"\n[rc {p.returncode}, {wall:.1f} s, maxrss {ru.ru_maxrss} KiB]\n")
    log.flush()
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {shlex.join(cmd)} (see {log.name})")
    return out, ru.ru_maxrss * 1024, wall


def fmt_rate(samples: list[float]) -> str:
    if not samples:
        return "-"
    med = statistics.median(samples)
    if len(samples) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({min(samples):.2f}-{max(samples):.2f})"


def gb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:.2f} GB"


def print_table(rows: list[tuple[str, ...]]) -> None:
    """A Markdown table, its first row the header, with blank lines around it."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]

    def line(r):
        return "| " + " | ".join(s.ljust(w) for s, w in zip(r, widths)) + " |"

    print()
    print(line(rows[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows[1:]:
        print(line(r))
    print()


def machine_line() -> str:
    model = "?"
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    mem = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
    return f"{model}, {os.cpu_count()} cores, {mem / 2**30:.1f} GiB RAM, {platform.system()} {platform.machine()}"


def cmd_run(a) -> None:
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = open(out_dir / "runs.log", "a")
    qg_cmd = [a.qwen_gdn, "bench", "--model", a.model, "-p", str(a.p), "-g", str(a.g), "-r", "1", "--json"]
    lb_cmd = [a.llama_bench, "-m", a.gguf, "-p", str(a.p), "-n", str(a.g), "-t", str(a.threads), "-r", "1", "-o", "json"]
    # qwen-gdn runs twice per round: its exact f32 reference path, and its 8-bit-activation
    # mode (the precision tier llama.cpp's CPU path runs at: Q8 activations against Q4_0).
    exact = {"pp": [], "tg": [], "rss": [], "peak": []}
    qg = {"pp": [], "tg": [], "rss": [], "peak": []}
    lb = {"pp": [], "tg": [], "rss": []}
    base = {"pp": [], "tg": [], "rss": [], "peak": []}
    base_env = dict([a.baseline_env.split("=", 1)]) if a.baseline_env else None
    has_base = bool(a.baseline_env or a.baseline_bin)
    base_label = " ".join(x for x in (a.baseline_env, a.baseline_bin and f"build {a.baseline_bin}") if x)
    base_cmd = ([a.baseline_bin] + qg_cmd[1:]) if a.baseline_bin else qg_cmd
    for i in range(a.rounds):
        order = [("qwen-gdn q8", qg_cmd + ["--q8-activations"]), ("llama.cpp", lb_cmd), ("qwen-gdn f32", qg_cmd)]
        if has_base:
            order.insert(2, ("qwen-gdn q8 baseline", base_cmd + ["--q8-activations"]))
        if i % 2:
            order.reverse()  # alternate who goes first, so drift hits all alike
        for engine, cmd in order:
            print(f"[bench-vs-peers] round {i + 1}/{a.rounds}: {engine}", file=sys.stderr, flush=True)
            out, rss, wall = run_timed(cmd, log, base_env if engine.endswith("baseline") else None)
            if engine.startswith("qwen-gdn"):
                qg_run = {"qwen-gdn q8": qg, "qwen-gdn q8 baseline": base}.get(engine, exact)
                j = json.loads(out)
                qg_run["pp"].append(j["prompt_tps"]["median"])
                qg_run["tg"].append(j["generation_tps"]["median"])
                qg_run["peak"].append(j["peak_memory_bytes"])
                qg_run["rss"].append(rss)
                qg_run["size"] = j["size_bytes"]
                pp, tg = qg_run["pp"][-1], qg_run["tg"][-1]
            else:
                tests = json.loads(out)
                pp = next(t["avg_ts"] for t in tests if t["n_prompt"] == a.p and t["n_gen"] == 0)
                tg = next(t["avg_ts"] for t in tests if t["n_gen"] == a.g and t["n_prompt"] == 0)
                lb["pp"].append(pp)
                lb["tg"].append(tg)
                lb["rss"].append(rss)
                lb["size"] = tests[0]["model_size"]
                lb["commit"] = tests[0].get("build_commit")
            print(f"[bench-vs-peers]   {engine}: pp {pp:.2f} t/s, tg {tg:.2f} t/s, {wall:.0f} s", file=sys.stderr, flush=True)

    context = a.p + a.g / 2
    rf = roofline(Path(a.model), context)
    cfg = text_config(Path(a.model))
    gg = gguf_active_bytes(Path(a.gguf), rf["top_k"], rf["experts"])
    gguf_bytes = gg["weights_active"] + sum(rf["state"].values())
    bw = a.bandwidth
    roof = bw / rf["bytes_per_token"]
    roof_gguf = bw / gguf_bytes
    mlx = json.loads(Path(a.mlx_json).read_text()) if a.mlx_json and Path(a.mlx_json).is_file() else None

    rows = [
        ("engine", "weights", "size", f"prefill t/s (pp{a.p})", f"decode t/s (tg{a.g})", "peak RSS", "decode % roofline"),
        ("qwen-gdn --q8-activations", f"{Path(a.model).name} (MLX 4-bit g64)", gb(qg["size"]), fmt_rate(qg["pp"]),
         fmt_rate(qg["tg"]), gb(max(qg["peak"])), f"{100 * statistics.median(qg['tg']) / roof:.0f}%"),
        ("qwen-gdn (f32, exact)", f"{Path(a.model).name} (MLX 4-bit g64)", gb(exact["size"]), fmt_rate(exact["pp"]),
         fmt_rate(exact["tg"]), gb(max(exact["peak"])), f"{100 * statistics.median(exact['tg']) / roof:.0f}%"),
    ]
    if has_base:
        rows.insert(2, (f"qwen-gdn --q8-activations, {base_label}", f"{Path(a.model).name} (MLX 4-bit g64)",
                        gb(base["size"]), fmt_rate(base["pp"]), fmt_rate(base["tg"]), gb(max(base["peak"])),
                        f"{100 * statistics.median(base['tg']) / roof:.0f}%"))
    rows += [
        ("llama.cpp", f"{Path(a.gguf).name} (Q4_0)", gb(lb["size"]), fmt_rate(lb["pp"]), fmt_rate(lb["tg"]),
         gb(max(lb["rss"])), f"{100 * statistics.median(lb['tg']) / roof:.0f}%"),
    ]
    if mlx:
        rows.append(("mlx-lm", f"{Path(a.model).name}, prompt {mlx['prompt_tokens']}, {mlx['generation_tokens']} tokens",
                     gb(qg["size"]), f"{mlx['prompt_tps']:.2f} (pp{mlx['prompt_tokens']})",
                     f"{mlx['generation_tps']:.2f} (tg{mlx['generation_tokens']})", gb(mlx["peak_memory_bytes"]),
                     f"{100 * mlx['generation_tps'] / roof:.0f}%"))
    print(f"machine: {machine_line()}")
    print(f"memory bandwidth: {bw / 1e9:.2f} GB/s (STREAM-style copy, {a.threads} threads, read + written bytes, best of 10)")
    print(f"model: {Path(a.model).name}: {rf['layers']} layers ({rf['gdn_layers']} GDN + {rf['attention_layers']} attention), "
          f"{rf['experts']} experts, top-{rf['top_k']}, hidden {cfg['hidden_size']}, vocab {cfg['vocab_size']}")
    print(f"runs: {a.rounds} alternated rounds, each `qwen-gdn bench -p {a.p} -g {a.g} -r 1` (with and without --q8-activations) "
          f"and `llama-bench -p {a.p} -n {a.g} -t {a.threads} -r 1` (one warm-up each); "
          f"median (min-max) over rounds")
    print(f"llama.cpp: llama-cpp-python 0.3.36 vendored source, commit {lb.get('commit')}, GGML_NATIVE, CPU backend")
    print_table(rows)
    print(f"decode roofline ({Path(a.model).name}, context {context:g}):")
    for k, v in rf["weights"].items():
        print(f"  {k:<34} {v / 1e6:9.2f} MB")
    for k, v in rf["state"].items():
        print(f"  {k:<34} {v / 1e6:9.2f} MB")
    print(f"  {'total per decoded token':<34} {rf['bytes_per_token'] / 1e6:9.2f} MB"
          f" -> {bw / 1e9:.2f} GB/s / {rf['bytes_per_token'] / 1e6:.2f} MB = {roof:.2f} tok/s")
    print(f"  (the Q4_0 GGUF, same count with its own tensor types (lm_head Q6_K, router F32): "
          f"{gguf_bytes / 1e6:.2f} MB -> {roof_gguf:.2f} tok/s; llama.cpp tg = "
          f"{100 * statistics.median(lb['tg']) / roof_gguf:.0f}% of that)")
    print("  note: qwen-gdn's tg runs at depth -p (mlx_lm.benchmark style), llama-bench's from an empty context;"
          " the KV read of the 2 attention layers is small here, so the difference is too.")
    (out_dir / "result.json").write_text(json.dumps({
        "qwen_gdn": qg, "qwen_gdn_exact": exact, "qwen_gdn_baseline": base if has_base else None, "llama_cpp": lb, "mlx_lm": mlx, "roofline": rf, "gguf": gg,
        "bandwidth_bytes_per_s": bw, "roofline_tps": roof, "roofline_gguf_tps": roof_gguf,
        "p": a.p, "g": a.g, "rounds": a.rounds, "threads": a.threads,
    }, indent=1))
    print(f"exact f32 path: decode ratio {statistics.median(exact['tg']) / statistics.median(lb['tg']):.2f}, "
          f"prefill ratio {statistics.median(exact['pp']) / statistics.median(lb['pp']):.2f} (the ratios below are --q8-activations)")
    if has_base:
        print(f"baseline q8 ({base_label}): decode ratio {statistics.median(base['tg']) / statistics.median(lb['tg']):.2f}, "
              f"prefill ratio {statistics.median(base['pp']) / statistics.median(lb['pp']):.2f}")
    print(f"decode ratio vs llama.cpp: {statistics.median(qg['tg']) / statistics.median(lb['tg']):.2f}")
    print(f"prefill ratio vs llama.cpp: {statistics.median(qg['pp']) / statistics.median(lb['pp']):.2f}")


def cmd_batch(a) -> None:
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = open(out_dir / "runs.log", "a")
    sizes = [int(b) for b in a.batch.split(",")]
    qg_cmd = [a.qwen_gdn, "bench", "--model", a.model, "-p", str(a.p), "-g", str(a.g), "-r", "1", "--json",
              "--q8-activations", "--batch", a.batch, "--batch-products"]
    # Every sequence its own prompt (not one shared prefill), one decode step for all of them
    # at once: what `qwen-gdn bench --batch` times. -c holds all the sequences' positions.
    context = max(sizes) * (a.p + a.g) + 64
    lb_cmd = [a.batched_bench, "-m", a.gguf, "-c", str(context), "-npp", str(a.p), "-ntg", str(a.g),
              "-npl", a.batch, "-t", str(a.threads), "--output-format", "jsonl"]
    runs = {"qwen-gdn shared": {b: [] for b in sizes}, "qwen-gdn each-row-alone": {b: [] for b in sizes},
            "llama.cpp": {b: [] for b in sizes}}
    commands = {"qwen-gdn shared": qg_cmd + ["shared"], "qwen-gdn each-row-alone": qg_cmd + ["each-row-alone"],
                "llama.cpp": lb_cmd}
    for i in range(a.rounds):
        order = list(commands)
        if i % 2:
            order.reverse()  # alternate who goes first, so drift hits all alike
        for engine in order:
            print(f"[bench-vs-peers] round {i + 1}/{a.rounds}: {engine}", file=sys.stderr, flush=True)
            out, _, wall = run_timed(commands[engine], log)
            if engine == "llama.cpp":
                # llama-batched-bench prints its rows (JSON lines) on stdout, its log on stderr.
                rows = [json.loads(l) for l in out.splitlines() if l.startswith('{"n_kv_max"')]
                got = {r["pl"]: r["speed_tg"] for r in rows}
            else:
                got = {r["batch"]: r["aggregate_tps"]["median"] for r in json.loads(out)["batch"]}
            for b in sizes:
                if b not in got:
                    sys.exit(f"{engine} gave no row for B={b} (see {log.name})")
                runs[engine][b].append(got[b])
            print(f"[bench-vs-peers]   {engine}: " + ", ".join(f"B={b} {got[b]:.2f}" for b in sizes)
                  + f" t/s, {wall:.0f} s", file=sys.stderr, flush=True)

    med = {e: {b: statistics.median(v) for b, v in r.items()} for e, r in runs.items()}
    head = ("B", "qwen-gdn shared t/s", "qwen-gdn each-row-alone t/s", "llama.cpp t/s", "shared / llama.cpp",
            "each-row-alone / llama.cpp")
    rows = [head] + [
        (str(b), fmt_rate(runs["qwen-gdn shared"][b]), fmt_rate(runs["qwen-gdn each-row-alone"][b]),
         fmt_rate(runs["llama.cpp"][b]), f"{med['qwen-gdn shared'][b] / med['llama.cpp'][b]:.2f}",
         f"{med['qwen-gdn each-row-alone'][b] / med['llama.cpp'][b]:.2f}")
        for b in sizes
    ]
    print(f"machine: {machine_line()}")
    print(f"model: {Path(a.model).name} (MLX 4-bit g64) against {Path(a.gguf).name} (Q4_0)")
    print(f"runs: {a.rounds} alternated rounds of `qwen-gdn bench --batch {a.batch} -p {a.p} -g {a.g} -r 1 "
          f"--q8-activations` (each --batch-products) and `llama-batched-bench -npp {a.p} -ntg {a.g} -npl {a.batch} "
          f"-t {a.threads}`; aggregate decode tok/s (all B sequences' tokens over the decode time), each "
          f"sequence with its own {a.p}-token prompt; median (min-max) over rounds")
    print_table(rows)
    (out_dir / "result.json").write_text(json.dumps({
        "runs": {e: {str(b): v for b, v in r.items()} for e, r in runs.items()},
        "p": a.p, "g": a.g, "rounds": a.rounds, "threads": a.threads, "batch": sizes,
    }, indent=1))
    ratios = [med["qwen-gdn shared"][b] / med["llama.cpp"][b] for b in sizes]
    print("batched decode ratio vs llama.cpp: " + ", ".join(f"B={b} {r:.2f}" for b, r in zip(sizes, ratios))
          + f", lowest {min(ratios):.2f}")


def side_by_side_args(parser, peer: str, p: int, g: int) -> None:
    """What `run` and `batch` both take: the two engines, the weights, the sizes, the rounds."""
    parser.add_argument("--qwen-gdn", required=True)
    parser.add_argument(peer, required=True, help="the llama.cpp tool to run")
    parser.add_argument("--model", required=True, help="MLX 4-bit folder")
    parser.add_argument("--gguf", required=True)
    parser.add_argument("-p", type=int, default=p)
    parser.add_argument("-g", type=int, default=g)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out-dir", required=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mlx")
    m.add_argument("--model", required=True)
    m.add_argument("--prompt-tokens", type=int, default=8)
    m.add_argument("--max-tokens", type=int, default=16)
    r = sub.add_parser("roofline")
    r.add_argument("--model", required=True)
    r.add_argument("--context", type=float, default=0)
    x = sub.add_parser("run")
    side_by_side_args(x, "--llama-bench", p=512, g=128)
    x.add_argument("--bandwidth", type=float, required=True, help="copy bandwidth, bytes/s")
    x.add_argument("--mlx-json")
    x.add_argument("--baseline-env", help="VAR=VALUE: one more q8 run per round with it set")
    x.add_argument("--baseline-bin", help="another qwen-gdn binary for that baseline run")
    y = sub.add_parser("batch")
    side_by_side_args(y, "--batched-bench", p=128, g=32)
    y.add_argument("--batch", default="1,2,4,8,16")
    a = ap.parse_args()
    if a.cmd == "mlx":
        cmd_mlx(a)
    elif a.cmd == "roofline":
        print(json.dumps(roofline(Path(a.model), a.context), indent=1))
    elif a.cmd == "batch":
        cmd_batch(a)
    else:
        cmd_run(a)


if __name__ == "__main__":
    main()
