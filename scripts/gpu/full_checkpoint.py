#!/usr/bin/env python3
"""A random-weight mlx-community 4-bit checkpoint at the full Qwen3-Next-80B-A3B size (issue 6):
48 layers, 512 experts, top-10, about 45 GB, written on the GPU machine's disk.

The 45 GB cannot travel to the device, so this works in two steps:

  skeleton (here, on the dev box): from a real mlx-lm conversion at the same per-layer shapes
      (build/bench-models/qwen3-next-bench-4bit: 8 layers, 64 experts, written by
      scripts/gen-bench-checkpoints.sh), keep config.json, the tokenizer files and the tensor
      table (name, dtype, shape) -> a small folder (gpu-artefacts/full-skeleton, ~7 MB) that the
      device call carries.
        python3 scripts/gpu/full_checkpoint.py skeleton --template DIR --out gpu-artefacts/full-skeleton
  write (on the device): expand the skeleton to --layers / --experts and write the safetensors
      shards (one per layer) with random data.
        python3 scripts/gpu/full_checkpoint.py write --skeleton DIR --layers 48 --experts 512 --out DIR

Every layer copies the tensor table of the first template layer of the same kind (GDN or full
attention), with the expert count of the stacked switch_mlp tensors and of the router set to
--experts; config.json's layer count, expert count, layer_types and per-tensor quantization entries
(8-bit router and shared-expert gate) follow. The weights only have to be valid and non-zero for
timing: packed words are a 64 MiB random pool, XOR-ed with a fresh random word per 1 MiB chunk (so
no two experts are equal), scales and biases put every dequantized weight in about [-0.02, 0.02]
(4-bit) or [-0.01, 0.01] (8-bit), norms are 1, A_log = log U(1, 16), dt_bias U(0, 1), other
floats N(0, 0.02). Only numpy is needed. Writing 45 GB takes about as long as the disk does.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import sys
import time
from pathlib import Path

LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def read_header(path: Path) -> dict:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def text_config(cfg: dict) -> dict:
    return cfg.get("text_config", cfg)


def layer_kinds(cfg: dict, layers: int) -> list[str]:
    interval = cfg.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


# ---------------------------------------------------------------------------------- skeleton
def cmd_skeleton(a) -> None:
    template, out = Path(a.template), Path(a.out)
    tensors = {}
    for f in sorted(template.glob("*.safetensors")):
        for name, v in read_header(f).items():
            if name != "__metadata__":
                tensors[name] = {"dtype": v["dtype"], "shape": v["shape"]}
    if not tensors:
        sys.exit(f"full_checkpoint: no *.safetensors in {template}")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(template / "config.json", out / "config.json")
    for name in TOKENIZER_FILES:
        if (template / name).exists():
            shutil.copy(template / name, out / name)
    (out / "tensors.json").write_text(json.dumps(tensors, indent=0, sort_keys=True))
    print(f"full_checkpoint: skeleton of {len(tensors)} tensors from {template} -> {out}")


# ---------------------------------------------------------------------------------- write
def expand(skeleton: dict, cfg: dict, layers: int, experts: int, top_k: int) -> tuple[dict, dict]:
    """(config, {shard name: {tensor name: (dtype, shape)}}) of the expanded checkpoint."""
    tc = text_config(cfg)
    old_layers, old_experts = tc["num_hidden_layers"], tc["num_experts"]
    old_kinds = tc.get("layer_types") or layer_kinds(tc, old_layers)
    kinds = layer_kinds(tc, layers)
    first_of = {kind: old_kinds.index(kind) for kind in set(old_kinds)}
    by_layer: dict[int, dict] = {}
    globals_ = {}
    for name, v in skeleton.items():
        m = LAYER.match(name)
        if m:
            by_layer.setdefault(int(m.group(1)), {})[m.group(2)] = v
        elif not name.startswith("mtp."):
            globals_[name] = v

    def stacked(rest: str, shape: list[int]) -> bool:
        return bool(shape) and shape[0] == old_experts and (".switch_mlp." in rest or rest.startswith("mlp.gate."))

    shards = {"model-globals.safetensors": {n: (v["dtype"], v["shape"]) for n, v in sorted(globals_.items())}}
    quant = {}
    old_quant = cfg.get("quantization", {})
    for i, kind in enumerate(kinds):
        t = first_of[kind]
        table = {}
        for rest, v in sorted(by_layer[t].items()):
            shape = list(v["shape"])
            if stacked(rest, shape):
                shape[0] = experts
            table[f"model.layers.{i}.{rest}"] = (v["dtype"], shape)
        shards[f"model-layer-{i:03d}.safetensors"] = table
        for key, q in old_quant.items():
            m = LAYER.match(key)
            if m and int(m.group(1)) == t:
                quant[f"model.layers.{i}.{m.group(2)}"] = q
    new_cfg = json.loads(json.dumps(cfg))
    tnew = text_config(new_cfg)
    tnew["num_hidden_layers"] = layers
    tnew["num_experts"] = experts
    tnew["layer_types"] = kinds
    # The template's top-k may have been capped to its own few experts: the release's is set here.
    tnew["num_experts_per_tok"] = min(top_k, experts)
    for key in ("quantization", "quantization_config"):
        if key in new_cfg:
            base = {k: v for k, v in new_cfg[key].items() if not LAYER.match(k)}
            new_cfg[key] = {**base, **quant}
    return new_cfg, shards


class Filler:
    """Random, valid bytes for each kind of tensor, fast enough that the disk is the bound."""

    POOL_WORDS = 16 << 20  # 64 MiB of u32
    CHUNK_WORDS = 256 << 10  # 1 MiB

    def __init__(self, np, seed: int, quant: dict):
        self.np = np
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.integers(0, 2**32, size=self.POOL_WORDS, dtype=np.uint32)
        self.quant = quant

    def bits_of(self, name: str) -> int:
        prefix = name.rsplit(".", 1)[0]
        q = self.quant.get(prefix)
        return (q or {}).get("bits", self.quant.get("bits", 4))

    def bf16(self, x):
        np = self.np
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)

    def write(self, fh, name: str, dtype: str, shape: list[int]) -> None:
        np = self.np
        n = int(np.prod(shape)) if shape else 1
        if dtype == "U32":
            done = 0
            while done < n:
                start = int(self.rng.integers(0, self.POOL_WORDS - self.CHUNK_WORDS))
                take = min(self.CHUNK_WORDS, n - done)
                chunk = self.pool[start : start + take] ^ np.uint32(self.rng.integers(0, 2**32))
                fh.write(chunk.tobytes())
                done += take
            return
        leaf = name.rsplit(".", 1)[-1]
        bits = self.bits_of(name)
        if leaf == "scales":
            span = 0.04 if bits == 4 else 0.02  # weights in [-span/2, span/2]
            x = self.rng.uniform(0.8, 1.2, n) * span / ((1 << bits) - 1)
        elif leaf == "biases":
            span = 0.04 if bits == 4 else 0.02
            x = np.full(n, -span / 2)
        elif name.endswith("norm.weight"):
            x = np.ones(n)
        elif leaf == "A_log":
            x = np.log(self.rng.uniform(1, 16, n))
        elif leaf == "dt_bias":
            x = self.rng.uniform(0, 1, n)
        else:
            x = self.rng.normal(0, 0.02, n)
        if dtype == "BF16":
            fh.write(self.bf16(x).tobytes())
        elif dtype == "F16":
            fh.write(x.astype(np.float16).tobytes())
        elif dtype == "F32":
            fh.write(x.astype(np.float32).tobytes())
        else:
            sys.exit(f"full_checkpoint: {name}: unsupported dtype {dtype}")


SIZES = {"U32": 4, "BF16": 2, "F16": 2, "F32": 4}


def write_shard(path: Path, table: dict, filler: Filler) -> int:
    header, offset = {}, 0
    for name, (dtype, shape) in table.items():
        nbytes = SIZES[dtype]
        for d in shape:
            nbytes *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "mlx"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_suffix(".partial")
    with open(tmp, "wb", buffering=16 << 20) as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for name, (dtype, shape) in table.items():
            filler.write(fh, name, dtype, shape)
    tmp.rename(path)
    return offset


def cmd_write(a) -> None:
    import numpy as np

    skel, out = Path(a.skeleton), Path(a.out)
    cfg = json.loads((skel / "config.json").read_text())
    new_cfg, shards = expand(json.loads((skel / "tensors.json").read_text()), cfg, a.layers, a.experts, a.top_k)
    marker = out / ".full-checkpoint.json"
    request = {"layers": a.layers, "experts": a.experts, "seed": a.seed, "shards": len(shards)}
    if marker.exists() and json.loads(marker.read_text()) == request:
        print(f"full_checkpoint: {out} is up to date")
        return
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (skel / name).exists():
            shutil.copy(skel / name, out / name)
    (out / "config.json").write_text(json.dumps(new_cfg, indent=2))
    filler = Filler(np, a.seed, new_cfg.get("quantization", {}))
    weight_map, total, t0 = {}, 0, time.time()
    for k, (shard, table) in enumerate(shards.items()):
        total += write_shard(out / shard, table, filler)
        weight_map.update({n: shard for n in table})
        if k % 8 == 0 or k == len(shards) - 1:
            print(f"full_checkpoint: {k + 1}/{len(shards)} shards, {total / 1e9:.1f} GB, {time.time() - t0:.0f} s", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    marker.write_text(json.dumps(request))
    print(f"full_checkpoint: wrote {total / 1e9:.2f} GB to {out} in {time.time() - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("skeleton")
    s.add_argument("--template", required=True)
    s.add_argument("--out", required=True)
    w = sub.add_parser("write")
    w.add_argument("--skeleton", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--layers", type=int, default=48)
    w.add_argument("--experts", type=int, default=512)
    w.add_argument("--top-k", type=int, default=10, help="experts per token (Qwen3-Next-80B-A3B: 10)")
    w.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    {"skeleton": cmd_skeleton, "write": cmd_write}[a.cmd](a)


if __name__ == "__main__":
    main()
