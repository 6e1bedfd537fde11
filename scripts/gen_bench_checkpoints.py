#!/usr/bin/env python3
"""Generate the random-weight benchmark checkpoints under build/bench-models/ (issue 7).

Two families, each with the exact per-layer shapes of a real model but fewer layers and experts,
so that they fit and run on a small machine:

  qwen3-next   Qwen3-Next-80B-A3B shapes (qwen3_next layout): H 2048, GDN Hk 16 / Hv 32 heads of
               Dk = Dv 128, attention Nq 16 / Nkv 2 heads of Dh 256 (partial rotary 0.25, rope_theta
               1e7), experts Im 512 + shared expert 512, top-10, vocab 151936; real tokenizer
               ../shared/tokenizers/qwen3-next.
  qwen3.5-moe  Qwen3.5-35B-A3B shapes (qwen3_5_moe layout: config under text_config, stacked
               experts.gate_up_proj / down_proj): the same sizes, top-8, vocab 248320; real
               tokenizer ../shared/tokenizers/qwen3.5.

Both default to 8 layers (6 GDN + 2 attention: full_attention_interval 4, layers 3 and 7) and 64
experts; --layers / --experts make a smaller variant (top-k is capped at the expert count).

For each family two folders are written from the same random weights:

  <name>-hf/     raw Hugging Face layout (what Qwen/... repos ship): bf16, A_log in fp32, sharded
                 (embeddings, lm_head, then one file per layer: model-0000i-of-0000n.safetensors
                 + model.safetensors.index.json), plus the mtp.*
                 (and for Qwen3.5 a few model.visual.*) tensors that real checkpoints carry;
  <name>-4bit/   converted by mlx_lm.convert exactly as mlx-community does: 4-bit affine group 64,
                 router (mlp.gate) and mlp.shared_expert_gate 8-bit group 64 (mlx-lm's own quant
                 predicate), with model.safetensors.index.json.

<name> is qwen3-next-bench / qwen3.5-moe-bench, with -l<layers>-e<experts> appended for a
non-default size. A folder pair whose .bench-checkpoint.json manifest matches the request is kept
as is (--force regenerates it).

The GGUF half (the same -hf folder converted to <name>-q4_0.gguf by llama.cpp's own
convert_hf_to_gguf.py and llama-quantize) is written by scripts/gen-bench-gguf.sh, next to the
llama.cpp build it needs; scripts/bench-vs-peers runs both scripts.

The weight initialisation, configs, conversion and checks are those of scripts/gen_fixtures.py,
imported as a module: its dimension constants are module globals read at call time, so
configure() sets them to the real sizes before anything is built. Only the layer loop is local,
so that one shard at a time is held in memory: the embedding and the lm_head each get their own
shard and are drawn in row blocks straight into bf16; each layer is built in fp32 numpy (about
1 GB with 64 experts) and written as its own shard. Cost of the default sizes on disk
(computed from the shapes): qwen3-next 5.1 GB raw + 1.4 GB 4-bit, qwen3.5-moe 5.9 GB raw +
1.6 GB 4-bit. Peak RAM measured on small variants (mlx-lm's conversion included): 1.9 GB for
qwen3-next --layers 1 --experts 2, 3.0 GB for qwen3.5-moe --layers 1 --experts 2. The full
qwen3-next pair took 1 min 45 s here (5.07 GB raw + 1.42 GB 4-bit; peak RAM not measured).

Usage: bash scripts/gen-bench-checkpoints.sh [--family qwen3-next|qwen3.5-moe|all]
       [--layers N] [--experts N] [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_fixtures as gf  # noqa: E402  (also puts MLX on its CPU device)

import mlx.core as mx  # noqa: E402

MANIFEST = ".bench-checkpoint.json"
DEFAULT_LAYERS, DEFAULT_EXPERTS = 8, 64


@dataclass(frozen=True)
class Family:
    name: str  # folder stem
    model_type: str  # gen_fixtures family key
    tokenizer: str  # folder under ../shared/tokenizers
    template: str  # file under ../shared/chat-templates
    vocab: int
    topk: int
    intermediate: int  # config's dense intermediate_size (unused by the MoE layers)
    seed: int


FAMILIES = {
    "qwen3-next": Family(
        "qwen3-next-bench", "qwen3_next", "qwen3-next", "qwen3-next-instruct.jinja", 151936, 10, 5120, 2001
    ),
    "qwen3.5-moe": Family("qwen3.5-moe-bench", "qwen3_5_moe", "qwen3.5", "qwen3.5.jinja", 248320, 8, 0, 2002),
}

# The real models' sizes, shared by both families.
REAL = dict(
    H=2048,
    FULL_ATTN_INTERVAL=4,
    HK=16,
    HV=32,
    DK=128,
    DV=128,
    CONV_K=4,
    NQ=16,
    NKV=2,
    DH=256,
    PARTIAL_ROTARY=0.25,
    ROPE_THETA=10000000,
    IM=512,
    IS=512,
    EPS=1e-6,
    MAX_POS=262144,
)


def token_id(tokenizer: dict, content: str) -> int:
    for t in tokenizer["added_tokens"]:
        if t["content"] == content:
            return t["id"]
    sys.exit(f"special token {content} missing from the tokenizer")


def configure(fam: Family) -> dict:
    """Point gen_fixtures' module globals at the real sizes and tokenizer of `fam`.

    Returns the tokenizer.json of the family (for special-token ids)."""
    for k, v in REAL.items():
        setattr(gf, k, v)
    gf.KEY_DIM = gf.HK * gf.DK
    gf.VALUE_DIM = gf.HV * gf.DV
    gf.CONV_DIM = 2 * gf.KEY_DIM + gf.VALUE_DIM
    gf.VOCAB = fam.vocab
    gf.INTERMEDIATE = fam.intermediate
    tok_dir = gf.SHARED / "tokenizers" / fam.tokenizer
    tokenizer = json.loads((tok_dir / "tokenizer.json").read_text())
    gf.ENDOFTEXT_ID = token_id(tokenizer, "<|endoftext|>")
    gf.IM_END_ID = token_id(tokenizer, "<|im_end|>")
    assert gf.ENDOFTEXT_ID < fam.vocab and gf.IM_END_ID < fam.vocab
    gf.GENERATION_CONFIG = {
        "bos_token_id": gf.ENDOFTEXT_ID,
        "do_sample": True,
        "eos_token_id": [gf.IM_END_ID, gf.ENDOFTEXT_ID],
        "pad_token_id": gf.ENDOFTEXT_ID,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
    }
    # copy_tokenizer_files() reads the tokenizer and template names from here.
    gf.FAMILIES[fam.model_type] = {"tokenizer": fam.tokenizer, "template": fam.template}
    return tokenizer


# ----------------------------------------------------------------------------------------
# Raw HF weights, one shard at a time
# ----------------------------------------------------------------------------------------
def big_normal(init: gf.Init, shape: tuple[int, int], std: float, rows: int = 8192) -> mx.array:
    """init.normal(shape, std) as a bf16 MLX array, drawn in blocks of rows so that a 248320-row
    embedding never exists in fp32 (with the bf16 rounding's temporaries) all at once."""
    blocks = []
    for start in range(0, shape[0], rows):
        blocks.append(mx.array(init.normal((min(rows, shape[0] - start), shape[1]), std)).astype(mx.bfloat16))
        mx.eval(blocks[-1])
    out = mx.concatenate(blocks)
    mx.eval(out)
    return out


def outer_tensors(fam: Family, part: int, init: gf.Init) -> dict:
    """Part 0: embeddings and final norm; part 1: the untied lm_head and the tensors that
    loaders must drop (mtp.*, and for Qwen3.5 a vision-tower stub matching its vision_config)."""
    w: dict = {}
    prefix = "model" if fam.model_type == "qwen3_next" else "model.language_model"
    if part == 0:
        w[f"{prefix}.embed_tokens.weight"] = big_normal(init, (gf.VOCAB, gf.H), gf.EMBED_STD)
        w[f"{prefix}.norm.weight"] = init.zc_norm(gf.H)
        return w
    w["lm_head.weight"] = big_normal(init, (gf.VOCAB, gf.H), gf.LOGIT_STD / np.sqrt(gf.H))
    gf.mtp_tensors(init, w)
    if fam.model_type == "qwen3_5_moe":
        w["model.visual.patch_embed.proj.weight"] = init.normal((32, 3, 2, 4, 4), 0.05)
        w["model.visual.blocks.0.norm1.weight"] = gf.bf16_round(np.ones(32, dtype=np.float32))
        w["model.visual.merger.linear_fc2.weight"] = init.linear(gf.H, 32)
    return w


def layer_tensors(fam: Family, d: gf.Dims, i: int, init: gf.Init) -> dict:
    """Layer i in the family's raw HF layout (as gen_fixtures' build_*_raw write it)."""
    w: dict = {}
    next_ = fam.model_type == "qwen3_next"
    p = f"model.layers.{i}" if next_ else f"model.language_model.layers.{i}"
    w[f"{p}.input_layernorm.weight"] = init.zc_norm(gf.H)
    w[f"{p}.post_attention_layernorm.weight"] = init.zc_norm(gf.H)
    if d.is_linear(i):
        a = f"{p}.linear_attn"
        if next_:
            w[f"{a}.in_proj_qkvz.weight"] = init.linear(2 * gf.KEY_DIM + 2 * gf.VALUE_DIM, gf.H)
            w[f"{a}.in_proj_ba.weight"] = init.linear(2 * gf.HV, gf.H)
        else:
            w[f"{a}.in_proj_qkv.weight"] = init.linear(gf.CONV_DIM, gf.H)
            w[f"{a}.in_proj_z.weight"] = init.linear(gf.VALUE_DIM, gf.H)
            w[f"{a}.in_proj_b.weight"] = init.linear(gf.HV, gf.H)
            w[f"{a}.in_proj_a.weight"] = init.linear(gf.HV, gf.H)
        gf.gdn_common(init, a, w)
    else:
        gf.attention(init, f"{p}.self_attn", w)
    m = f"{p}.mlp"
    gf.moe_router_and_shared(init, m, w, d.experts)
    if next_:  # one tensor per expert
        for e in range(d.experts):
            gf.dense_mlp(init, f"{m}.experts.{e}", w, gf.IM)
    else:  # stacked, gate before up
        gate = np.stack([init.linear(gf.IM, gf.H) for _ in range(d.experts)])
        up = np.stack([init.linear(gf.IM, gf.H) for _ in range(d.experts)])
        w[f"{m}.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)
        del gate, up
        w[f"{m}.experts.down_proj"] = np.stack([init.linear(gf.H, gf.IM) for _ in range(d.experts)])
    return w


def save_shard(path: Path, weights: dict) -> dict:
    """As gen_fixtures.write_raw: A_log in fp32, everything else bf16. Empties `weights` as it
    converts them (so fp32 and bf16 copies of a tensor never pile up); returns name -> bytes."""
    arrays = {}
    for k in sorted(weights):
        v = weights.pop(k)
        v = v if isinstance(v, mx.array) else mx.array(v)
        arrays[k] = v.astype(mx.float32) if k.endswith("A_log") else v.astype(mx.bfloat16)
        mx.eval(arrays[k])
        del v
    mx.save_safetensors(str(path), arrays, metadata={"format": "pt"})
    return {k: v.nbytes for k, v in arrays.items()}


def write_raw_sharded(folder: Path, fam: Family, d: gf.Dims, config: dict) -> None:
    folder.mkdir(parents=True)
    n = d.layers + 2
    weight_map, total = {}, 0
    for s in range(n):
        shard = f"model-{s + 1:05d}-of-{n:05d}.safetensors"
        init = gf.Init(fam.seed * 1000 + s)  # each shard has its own stream
        w = outer_tensors(fam, s, init) if s < 2 else layer_tensors(fam, d, s - 2, init)
        sizes = save_shard(folder / shard, w)
        del w
        mx.clear_cache()
        weight_map.update({k: shard for k in sizes})
        total += sum(sizes.values())
        print(f"[gen-bench] {folder.name}/{shard}: {sum(sizes.values()) / 1e9:.2f} GB", flush=True)
    gf.write_json(
        folder / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )
    gf.write_json(folder / "config.json", config)
    gf.copy_tokenizer_files(fam.model_type, folder)


def family_config(fam: Family, d: gf.Dims, tokenizer: dict) -> dict:
    if fam.model_type == "qwen3_next":
        return gf.qwen3_next_config(d)
    config = gf.qwen3_5_config(True, d)
    # gen_fixtures writes the mini vocabulary's ids; use the real tokenizer's.
    for key, content in [
        ("image_token_id", "<|image_pad|>"),
        ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"),
    ]:
        config[key] = token_id(tokenizer, content)
    return config


# ----------------------------------------------------------------------------------------
def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # KiB on Linux


def folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def generate(fam: Family, layers: int, experts: int, out: Path, force: bool) -> None:
    d = gf.Dims(layers=layers, experts=experts, topk=min(fam.topk, experts))
    suffix = "" if (layers, experts) == (DEFAULT_LAYERS, DEFAULT_EXPERTS) else f"-l{layers}-e{experts}"
    raw, q4 = out / f"{fam.name}{suffix}-hf", out / f"{fam.name}{suffix}-4bit"
    manifest = {
        "family": fam.model_type,
        "shapes_of": "Qwen3-Next-80B-A3B" if fam.model_type == "qwen3_next" else "Qwen3.5-35B-A3B",
        "layers": layers,
        "layer_types": d.layer_types,
        "experts": experts,
        "top_k": d.topk,
        "vocab_size": fam.vocab,
        "seed": fam.seed,
        "mlx_lm": gf.mlx_lm.__version__,
    }
    if not force and all(
        (f / MANIFEST).is_file() and json.loads((f / MANIFEST).read_text()) == manifest for f in (raw, q4)
    ):
        print(f"[gen-bench] {raw} and {q4} are up to date (--force regenerates them)")
        return
    if d.topk < fam.topk:
        print(f"[gen-bench] note: top-{fam.topk} capped to top-{d.topk} ({experts} experts)")
    for f in (raw, q4):
        shutil.rmtree(f, ignore_errors=True)

    tokenizer = configure(fam)
    t0 = time.time()
    write_raw_sharded(raw, fam, d, family_config(fam, d, tokenizer))
    t1 = time.time()
    print(f"[gen-bench] peak RSS so far: {peak_rss_gb():.1f} GB", flush=True)
    gf.convert_checkpoint(raw, q4, fam.model_type, True, keep_index=True)
    t2 = time.time()
    print(f"[gen-bench] peak RSS so far: {peak_rss_gb():.1f} GB", flush=True)
    prefix = "model.layers" if fam.model_type == "qwen3_next" else "language_model.model.layers"
    expect_8bit = [f"{prefix}.{i}.mlp.{m}" for i in range(layers) for m in ("gate", "shared_expert_gate")]
    gf.check_converted(q4, True, expect_8bit, d, True)
    for f in (raw, q4):
        gf.write_json(f / MANIFEST, manifest)
    print(
        f"[gen-bench] {raw}: {folder_size(raw) / 1e9:.2f} GB in {t1 - t0:.0f} s; "
        f"{q4}: {folder_size(q4) / 1e9:.2f} GB in {t2 - t1:.0f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=[*FAMILIES, "all"], default="all")
    ap.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="decoder layers (every 4th is attention)")
    ap.add_argument("--experts", type=int, default=DEFAULT_EXPERTS, help="routed experts per layer")
    ap.add_argument("--out", type=Path, default=gf.REPO / "build" / "bench-models")
    ap.add_argument("--force", action="store_true", help="regenerate even if up to date")
    args = ap.parse_args()
    if args.layers < 1 or args.experts < 1:
        ap.error("--layers and --experts must be at least 1")
    names = list(FAMILIES) if args.family == "all" else [args.family]
    for name in names:
        fam = FAMILIES[name]
        for p in (gf.SHARED / "tokenizers" / fam.tokenizer, gf.SHARED / "chat-templates" / fam.template):
            if not p.exists():
                sys.exit(f"missing shared input: {p} (set QWEN_GDN_SHARED)")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        generate(FAMILIES[name], args.layers, args.experts, args.out.resolve(), args.force)


if __name__ == "__main__":
    main()
