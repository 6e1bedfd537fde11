#!/usr/bin/env python3
"""Generate the tiny test checkpoints and mlx-lm reference outputs under models/.

Deterministic: every random number comes from numpy Generators with fixed seeds, and MLX runs
on its CPU device (so the GDN recurrence uses mlx-lm's op loop on every platform).

Steps:
  1. build raw, upstream-HF-layout weights (numpy, rounded to bf16) and write them with
     mx.save_safetensors into raw folders (config.json, tokenizer, chat template, ...);
  2. convert them with mlx_lm.convert (4-bit group 64, or unquantized bf16);
  3. load every checkpoint with mlx_lm.load, upcast to fp32 (model.set_dtype(mx.float32)) and
     record teacher-forced logits, per-layer activations (4-bit checkpoints only), caches, and
     greedy generations;
  4. record a table of MLX affine-quantization vectors (models/reference/quant.safetensors).

Usage: bash scripts/gen-fixtures.sh   (or: .venv/bin/python scripts/gen_fixtures.py)
       WITH_TORCH=1 bash scripts/gen-fixtures.sh --only qwen4_exp   (only the qwen4_exp fixture,
       recorded with transformers + torch: scripts/gen_fixture_qwen4_exp.py)
       WITH_TORCH=1 bash scripts/gen-fixtures.sh --only qwen4_exp_mlx   (its mlx-vlm 4-bit twin:
       scripts/gen_fixture_qwen4_exp_mlx.py)
Shared inputs are read from <repo>/../shared (override with QWEN_GDN_SHARED=/path/to/shared).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import mlx.core as mx

# Everything on the CPU device, for bit-reproducible results on Linux and macOS alike.
mx.set_default_device(mx.cpu)

import mlx_lm  # noqa: E402
from mlx_lm.convert import convert  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.base import create_attention_mask, create_ssm_mask  # noqa: E402
from mlx_lm.models.cache import KVCache  # noqa: E402
from mlx_lm.utils import load  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("QWEN_GDN_SHARED", REPO.parent / "shared")).resolve()
MODELS = REPO / "models"
REF = MODELS / "reference"

# ----------------------------------------------------------------------------------------
# Tiny dimensions (shared by all families)
# ----------------------------------------------------------------------------------------
H = 128
FULL_ATTN_INTERVAL = 3  # every 3rd layer is full attention
HK, HV, DK, DV = 2, 4, 32, 32
CONV_K = 4
NQ, NKV, DH = 4, 2, 64
PARTIAL_ROTARY = 0.25
ROPE_THETA = 10000000
INTERMEDIATE = 256
IM, IS = 64, 64  # routed-expert and shared-expert intermediate sizes
EPS = 1e-6
VOCAB = 2048
MAX_POS = 4096
KEY_DIM = HK * DK  # 64
VALUE_DIM = HV * DV  # 128
CONV_DIM = 2 * KEY_DIM + VALUE_DIM  # 256

LOGIT_STD = 4.0  # target std of the logits (lm_head / tied embedding scale)
EMBED_STD = 1.0  # untied embedding std

# Token ids in the mini vocab (checked against the tokenizer at run time)
ENDOFTEXT_ID = 1984
IM_END_ID = 1986

TF_TEXT = (
    "The old lighthouse keeper climbed the narrow stairs every evening to light the lamp. "
    "From the top he could see the whole harbour, the fishing boats coming home, and the "
    "clouds moving slowly over the hills. He wrote down the weather in a small book, as his "
    "father had done before him."
)
GREEDY_PROMPT = "Write a short story about a robot who learns to paint."

SEEDS = {
    "qwen3_next": 1001,
    "qwen3_5": 1002,
    "qwen3_5_moe": 1003,
    "quant": 1004,
    # The SMALL unquantized checkpoints: picked among seeds 1005..1024 as the ones with the
    # largest decision margins (top-1/top-2 logit and log-prob margins >= 0.01, router top-k
    # margin >= 2e-4), so fp32 re-implementations reproduce every argmax and routing choice.
    "qwen3_next_small": 1016,
    "qwen3_5_moe_small": 1007,
}

QUANT_ROWS, QUANT_COLS = 16, 384  # reference/quant.safetensors weight shape


@dataclass(frozen=True)
class Dims:
    """The per-checkpoint dimensions; everything else is shared (constants above)."""

    layers: int
    experts: int  # ignored by the dense qwen3_5 model
    topk: int

    def is_linear(self, i: int) -> bool:
        return (i + 1) % FULL_ATTN_INTERVAL != 0

    @property
    def layer_types(self) -> list[str]:
        return ["linear_attention" if self.is_linear(i) else "full_attention" for i in range(self.layers)]


# 4-bit checkpoints: 6 layers (GDN 0,1,3,4; attention 2,5), 8 experts, top-2.
TINY = Dims(layers=6, experts=8, topk=2)
# Unquantized checkpoints (bf16 / raw HF), kept small on disk: 3 layers (GDN 0,1; attention 2),
# 4 experts, top-2.
SMALL = Dims(layers=3, experts=4, topk=2)


# ----------------------------------------------------------------------------------------
# Weight initialisation helpers (all values are exactly representable in bf16)
# ----------------------------------------------------------------------------------------
def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bf16 (returned as float32)."""
    return np.array(mx.array(np.asarray(x, dtype=np.float32)).astype(mx.bfloat16).astype(mx.float32))


class Init:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def linear(self, out_dim: int, in_dim: int, gain: float = 1.0) -> np.ndarray:
        # N(0, 1/fan_in)
        w = self.rng.standard_normal((out_dim, in_dim), dtype=np.float32) * (gain / np.sqrt(in_dim))
        return bf16_round(w)

    def normal(self, shape, std: float) -> np.ndarray:
        return bf16_round(self.rng.standard_normal(shape, dtype=np.float32) * std)

    def zc_norm(self, dim: int) -> np.ndarray:
        # Zero-centred norm weight: small multiples of 2^-7, so that 1+w is exact in bf16
        # (HF computes (1+w) in fp32; mlx-lm stores bf16(1+w)).
        k = self.rng.integers(-16, 17, size=dim)
        return (k.astype(np.float32) / 128.0).astype(np.float32)

    def gated_norm(self, dim: int) -> np.ndarray:
        return bf16_round(1.0 + 0.1 * self.rng.standard_normal(dim, dtype=np.float32))

    def conv(self, channels: int, k: int) -> np.ndarray:
        # HF layout [C, 1, K]
        return bf16_round(self.rng.standard_normal((channels, 1, k), dtype=np.float32) / np.sqrt(k))

    def a_log(self, n: int) -> np.ndarray:
        a = self.rng.uniform(0.02, 2.0, size=n).astype(np.float32)
        return bf16_round(np.log(a))

    def dt_bias(self, n: int) -> np.ndarray:
        return bf16_round(self.rng.uniform(-2.0, 1.0, size=n).astype(np.float32))


def gdn_common(init: Init, p: str, w: dict) -> None:
    w[f"{p}.conv1d.weight"] = init.conv(CONV_DIM, CONV_K)
    w[f"{p}.A_log"] = init.a_log(HV)
    w[f"{p}.dt_bias"] = init.dt_bias(HV)
    w[f"{p}.norm.weight"] = init.gated_norm(DV)
    w[f"{p}.out_proj.weight"] = init.linear(H, VALUE_DIM)


def attention(init: Init, p: str, w: dict) -> None:
    w[f"{p}.q_proj.weight"] = init.linear(2 * NQ * DH, H)
    w[f"{p}.k_proj.weight"] = init.linear(NKV * DH, H)
    w[f"{p}.v_proj.weight"] = init.linear(NKV * DH, H)
    w[f"{p}.o_proj.weight"] = init.linear(H, NQ * DH)
    w[f"{p}.q_norm.weight"] = init.zc_norm(DH)
    w[f"{p}.k_norm.weight"] = init.zc_norm(DH)


def dense_mlp(init: Init, p: str, w: dict, inter: int) -> None:
    w[f"{p}.gate_proj.weight"] = init.linear(inter, H)
    w[f"{p}.up_proj.weight"] = init.linear(inter, H)
    w[f"{p}.down_proj.weight"] = init.linear(H, inter)


def moe_router_and_shared(init: Init, p: str, w: dict, experts: int) -> None:
    w[f"{p}.gate.weight"] = init.linear(experts, H, gain=2.0)  # decisive routing
    dense_mlp(init, f"{p}.shared_expert", w, IS)
    w[f"{p}.shared_expert_gate.weight"] = init.linear(1, H)


def mtp_tensors(init: Init, w: dict) -> None:
    # A few MTP tensors as real checkpoints ship them; every loader must drop them.
    w["mtp.fc.weight"] = init.linear(H, 2 * H)
    w["mtp.pre_fc_norm_embedding.weight"] = init.zc_norm(H)
    w["mtp.pre_fc_norm_hidden.weight"] = init.zc_norm(H)
    w["mtp.norm.weight"] = init.zc_norm(H)
    w["mtp.layers.0.input_layernorm.weight"] = init.zc_norm(H)
    w["mtp.layers.0.self_attn.o_proj.weight"] = init.linear(H, NQ * DH)


# ----------------------------------------------------------------------------------------
# Raw HF weights per family
# ----------------------------------------------------------------------------------------
def build_qwen3_next_raw(d: Dims, seed: int) -> dict:
    init = Init(seed)
    w: dict = {}
    w["model.embed_tokens.weight"] = init.normal((VOCAB, H), EMBED_STD)
    for i in range(d.layers):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = init.zc_norm(H)
        w[f"{p}.post_attention_layernorm.weight"] = init.zc_norm(H)
        if d.is_linear(i):
            a = f"{p}.linear_attn"
            w[f"{a}.in_proj_qkvz.weight"] = init.linear(2 * KEY_DIM + 2 * VALUE_DIM, H)
            w[f"{a}.in_proj_ba.weight"] = init.linear(2 * HV, H)
            gdn_common(init, a, w)
        else:
            attention(init, f"{p}.self_attn", w)
        m = f"{p}.mlp"
        moe_router_and_shared(init, m, w, d.experts)
        for e in range(d.experts):  # HF Qwen3-Next: one tensor per expert
            dense_mlp(init, f"{m}.experts.{e}", w, IM)
    w["model.norm.weight"] = init.zc_norm(H)
    w["lm_head.weight"] = init.normal((VOCAB, H), LOGIT_STD / np.sqrt(H))
    mtp_tensors(init, w)
    return w


def build_qwen3_5_raw(moe: bool, d: Dims, seed: int) -> dict:
    init = Init(seed)
    tied = not moe
    w: dict = {}
    emb_std = LOGIT_STD / np.sqrt(H) if tied else EMBED_STD
    w["model.language_model.embed_tokens.weight"] = init.normal((VOCAB, H), emb_std)
    for i in range(d.layers):
        p = f"model.language_model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = init.zc_norm(H)
        w[f"{p}.post_attention_layernorm.weight"] = init.zc_norm(H)
        if d.is_linear(i):
            a = f"{p}.linear_attn"
            w[f"{a}.in_proj_qkv.weight"] = init.linear(CONV_DIM, H)
            w[f"{a}.in_proj_z.weight"] = init.linear(VALUE_DIM, H)
            w[f"{a}.in_proj_b.weight"] = init.linear(HV, H)
            w[f"{a}.in_proj_a.weight"] = init.linear(HV, H)
            gdn_common(init, a, w)
        else:
            attention(init, f"{p}.self_attn", w)
        m = f"{p}.mlp"
        if moe:
            moe_router_and_shared(init, m, w, d.experts)
            gate = np.stack([init.linear(IM, H) for _ in range(d.experts)])  # [E, Im, H]
            up = np.stack([init.linear(IM, H) for _ in range(d.experts)])  # [E, Im, H]
            down = np.stack([init.linear(H, IM) for _ in range(d.experts)])  # [E, H, Im]
            w[f"{m}.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)  # gate first
            w[f"{m}.experts.down_proj"] = down
        else:
            dense_mlp(init, m, w, INTERMEDIATE)
    w["model.language_model.norm.weight"] = init.zc_norm(H)
    if not tied:
        w["lm_head.weight"] = init.normal((VOCAB, H), LOGIT_STD / np.sqrt(H))
    # A couple of vision-tower tensors (dropped by text-only loaders)
    w["model.visual.patch_embed.proj.weight"] = init.normal((32, 3, 2, 4, 4), 0.05)
    w["model.visual.blocks.0.norm1.weight"] = bf16_round(np.ones(32, dtype=np.float32))
    w["model.visual.merger.linear_fc2.weight"] = init.linear(H, 32)
    mtp_tensors(init, w)
    return w


# ----------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------
def qwen3_next_config(d: Dims) -> dict:
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ENDOFTEXT_ID,
        "decoder_sparse_step": 1,
        "eos_token_id": IM_END_ID,
        "full_attention_interval": FULL_ATTN_INTERVAL,
        "head_dim": DH,
        "hidden_act": "silu",
        "hidden_size": H,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "layer_types": d.layer_types,
        "linear_conv_kernel_dim": CONV_K,
        "linear_key_head_dim": DK,
        "linear_num_key_heads": HK,
        "linear_num_value_heads": HV,
        "linear_value_head_dim": DV,
        "max_position_embeddings": MAX_POS,
        "mlp_only_layers": [],
        "model_type": "qwen3_next",
        "moe_intermediate_size": IM,
        "mtp_num_hidden_layers": 1,
        "norm_topk_prob": True,
        "num_attention_heads": NQ,
        "num_experts": d.experts,
        "num_experts_per_tok": d.topk,
        "num_hidden_layers": d.layers,
        "num_key_value_heads": NKV,
        "output_router_logits": False,
        "partial_rotary_factor": PARTIAL_ROTARY,
        "rms_norm_eps": EPS,
        "rope_scaling": None,
        "rope_theta": ROPE_THETA,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": IS,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.0.dev0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }


def qwen3_5_config(moe: bool, d: Dims) -> dict:
    tied = not moe
    text = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": ENDOFTEXT_ID,
        "dtype": "bfloat16",
        "eos_token_id": IM_END_ID,
        "full_attention_interval": FULL_ATTN_INTERVAL,
        "head_dim": DH,
        "hidden_act": "silu",
        "hidden_size": H,
        "initializer_range": 0.02,
        "layer_types": d.layer_types,
        "linear_conv_kernel_dim": CONV_K,
        "linear_key_head_dim": DK,
        "linear_num_key_heads": HK,
        "linear_num_value_heads": HV,
        "linear_value_head_dim": DV,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": MAX_POS,
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": NQ,
        "num_hidden_layers": d.layers,
        "num_key_value_heads": NKV,
        "rms_norm_eps": EPS,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": PARTIAL_ROTARY,
            "rope_theta": ROPE_THETA,
            "rope_type": "default",
        },
        "tie_word_embeddings": tied,
        "use_cache": True,
        "vocab_size": VOCAB,
    }
    if moe:
        text.update(
            {
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
                "moe_intermediate_size": IM,
                "norm_topk_prob": True,
                "num_experts": d.experts,
                "num_experts_per_tok": d.topk,
                "output_router_logits": False,
                "router_aux_loss_coef": 0.001,
                "shared_expert_intermediate_size": IS,
            }
        )
    else:
        text["intermediate_size"] = INTERMEDIATE
    text = dict(sorted(text.items()))
    return {
        "architectures": [
            "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"
        ],
        "eos_token_id": IM_END_ID,
        "image_token_id": 1996,
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": tied,
        "transformers_version": "4.57.0.dev0",
        "video_token_id": 1997,
        "vision_config": {
            "depth": 1,
            "hidden_size": 32,
            "model_type": "qwen3_5_moe" if moe else "qwen3_5",
            "num_heads": 2,
            "out_hidden_size": H,
            "patch_size": 4,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "vision_end_token_id": 1994,
        "vision_start_token_id": 1993,
    }


GENERATION_CONFIG = {
    "bos_token_id": ENDOFTEXT_ID,
    "do_sample": True,
    "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
    "pad_token_id": ENDOFTEXT_ID,
    "temperature": 0.7,
    "top_k": 20,
    "top_p": 0.8,
}

FAMILIES = {
    "qwen3_next": {"tokenizer": "mini-qwen3-next", "template": "qwen3-next-instruct.jinja"},
    "qwen3_5": {"tokenizer": "mini-qwen3.5", "template": "qwen3.5.jinja"},
    "qwen3_5_moe": {"tokenizer": "mini-qwen3.5", "template": "qwen3.5.jinja"},
}


# ----------------------------------------------------------------------------------------
# Writing raw folders and converting
# ----------------------------------------------------------------------------------------
def write_json(path: Path, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def copy_tokenizer_files(family: str, dst: Path) -> None:
    fam = FAMILIES[family]
    tok = SHARED / "tokenizers" / fam["tokenizer"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok / name, dst / name)
    shutil.copyfile(SHARED / "chat-templates" / fam["template"], dst / "chat_template.jinja")
    write_json(dst / "generation_config.json", GENERATION_CONFIG)


def write_raw(folder: Path, family: str, weights: dict, config: dict) -> None:
    folder.mkdir(parents=True)
    arrays = {}
    for k in sorted(weights):
        v = mx.array(weights[k])
        # A_log is stored in fp32 like the published checkpoints; everything else bf16.
        arrays[k] = v.astype(mx.float32) if k.endswith("A_log") else v.astype(mx.bfloat16)
    mx.save_safetensors(str(folder / "model.safetensors"), arrays, metadata={"format": "pt"})
    write_json(folder / "config.json", config)
    copy_tokenizer_files(family, folder)


def finish_converted(folder: Path, family: str, keep_index: bool) -> None:
    """Make the converted folder's side files deterministic and self-contained."""
    (folder / "README.md").unlink(missing_ok=True)  # generic model card
    # Keep the exact shared tokenizer files (save_pretrained may rewrite them).
    copy_tokenizer_files(family, folder)
    # mlx-lm always writes model.safetensors.index.json, even for a single shard. Drop it where
    # it is redundant (every tensor of model.safetensors mapped to model.safetensors), except
    # where we keep it on purpose so that the index-driven loader path is exercised.
    index = folder / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    shards = sorted(folder.glob("model*.safetensors"))
    assert [f.name for f in shards] == ["model.safetensors"], (folder, shards)
    assert set(weight_map.values()) == {"model.safetensors"}, folder
    assert set(weight_map) == set(safetensors_dtypes(folder / "model.safetensors")), folder
    if not keep_index:
        index.unlink()


def convert_checkpoint(raw: Path, out: Path, family: str, quantize: bool, keep_index: bool = False) -> None:
    kwargs = dict(hf_path=str(raw), mlx_path=str(out), dtype="bfloat16")
    if quantize:
        kwargs.update(quantize=True, q_group_size=64, q_bits=4)
    convert(**kwargs)
    finish_converted(out, family, keep_index)


# ----------------------------------------------------------------------------------------
# Reference recording
# ----------------------------------------------------------------------------------------
def text_parts(model):
    """(outer-with-args, inner Qwen model) for both families."""
    lm = model.language_model if hasattr(model, "language_model") else model
    return lm, lm.model


def manual_forward(model, ids: mx.array, cache):
    """Re-run the model's __call__ step by step, capturing intermediates.

    The residual stream is h_i = (h_{i-1} + tf_mixer.i) + tf_mlp.i in fp32 (h_{-1} = tf_embed),
    so it is not stored: a consumer recomputes it bit for bit from the stored tensors.
    """
    lm, inner = text_parts(model)
    caps = {}
    h = inner.embed_tokens(ids)
    caps["tf_embed"] = h
    fa_mask = create_attention_mask(h, cache[inner.fa_idx])
    ssm_mask = create_ssm_mask(h, cache[inner.ssm_idx])
    for i, (layer, c) in enumerate(zip(inner.layers, cache)):
        x = layer.input_layernorm(h)
        if layer.is_linear:
            r = layer.linear_attn(x, ssm_mask, c)
        else:
            r = layer.self_attn(x, fa_mask, c)
        h = h + r
        xm = layer.post_attention_layernorm(h)
        m = layer.mlp(xm)
        if hasattr(layer.mlp, "switch_mlp"):
            # router margin between the k-th and (k+1)-th expert (diagnostic only)
            probs = mx.sort(mx.softmax(layer.mlp.gate(xm).astype(mx.float32), axis=-1), axis=-1)
            k = layer.mlp.top_k
            margin = (probs[..., -k] - probs[..., -k - 1]).min()
            caps["_router_margin"] = mx.minimum(caps.get("_router_margin", margin), margin)
        h = h + m
        caps[f"tf_mixer.{i}"] = r
        caps[f"tf_mlp.{i}"] = m
        caps[f"_hidden.{i}"] = h  # only to check the identity above; not stored
    hn = inner.norm(h)
    caps["tf_final_norm"] = hn
    if lm.args.tie_word_embeddings:
        logits = inner.embed_tokens.as_linear(hn)
    else:
        logits = lm.lm_head(hn)
    return logits, caps


def greedy(model, prompt_ids: list[int], n: int = 32) -> tuple[list[int], float]:
    """Greedy ids and the smallest top1-top2 log-prob margin seen along the way."""
    sampler = lambda lp: mx.argmax(lp, axis=-1)  # noqa: E731
    out, margin = [], float("inf")
    for tok, logprobs in generate_step(mx.array(prompt_ids), model, max_tokens=n, sampler=sampler):
        out.append(int(tok.item() if hasattr(tok, "item") else tok))
        top2 = mx.sort(logprobs)[-2:]
        margin = min(margin, float((top2[1] - top2[0]).item()))
    assert len(out) == n
    return out, margin


def safetensors_dtypes(path: Path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"]) for k, v in header.items()}


def bf16_state_quality(model, tf_ids: list[int]) -> dict:
    """mlx-lm's own numbers for the bf16-state quality gate (issue: fused gated-delta op).

    The teacher-forced text runs twice in decode mode (one token per forward call): once with
    the fp32 recurrent state, once with the state rounded to bf16 after every token (what a
    kernel storing StT = bf16 does). Per position: KL(p_f32 || p_bf16) and top-1 agreement.
    """
    runs = []
    for round_state in (False, True):
        cache = model.make_cache()
        rows = []
        for t in tf_ids:
            logits = model(mx.array([[t]]), cache=cache)
            if round_state:
                for c in cache:
                    if not isinstance(c, KVCache):
                        c[1] = c[1].astype(mx.bfloat16).astype(mx.float32)
            mx.eval(logits, [c.state for c in cache])
            rows.append(np.array(logits[0, -1], dtype=np.float64))
        runs.append(np.stack(rows))
    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    lp32, lp16 = log_softmax(runs[0]), log_softmax(runs[1])
    kl = (np.exp(lp32) * (lp32 - lp16)).sum(-1)
    top1 = (runs[0].argmax(-1) == runs[1].argmax(-1)).mean()
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1_match": float(top1), "n": len(tf_ids),
            "method": "decode mode, recurrent state rounded to bf16 after every token, fp32 activations"}


def bf16_activation_quality(ckpt: Path, tf_ids: list[int], fp32_logits: np.ndarray) -> dict:
    """mlx-lm's own numbers for bf16 activations (issue: Metal backend): the checkpoint loaded
    fresh, model.set_dtype(mx.bfloat16), the teacher-forced text in one forward call;
    KL(p_fp32 || p_bf16) and top-1 agreement against the fp32 reference logits.

    mlx's CPU GatherMM is f32-only, so unquantized MoE checkpoints cannot run in bf16 here:
    those record the reason instead of numbers.
    """
    model, _ = load(str(ckpt))
    model.set_dtype(mx.bfloat16)
    try:
        logits = model(mx.array(tf_ids)[None])[0].astype(mx.float32)
        got = np.array(logits, dtype=np.float64)
    except RuntimeError as e:
        return {"unavailable": str(e)}
    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    want = fp32_logits.astype(np.float64)
    lw, lg = log_softmax(want), log_softmax(got)
    kl = (np.exp(lw) * (lw - lg)).sum(-1)
    top1 = (want.argmax(-1) == got.argmax(-1)).mean()
    return {"kl_mean": float(kl.mean()), "top1_match": float(top1), "n": len(tf_ids),
            "method": "model.set_dtype(mx.bfloat16), one teacher-forced forward, vs fp32 logits"}


def record_reference(ckpt: Path, name: str, d: Dims, notes: list[str], per_layer: bool = True) -> dict:
    """Record the reference of one checkpoint.

    per_layer=False drops tf_mixer.{i} / tf_mlp.{i} (kept: tf_embed, tf_final_norm, tf_logits,
    caches, greedy ids) to keep the references of the unquantized checkpoints small.
    """
    model, tokenizer, config = load(str(ckpt), return_config=True)
    model.set_dtype(mx.float32)  # fp32 reference: packed weights stay, scales/acts fp32
    lm, inner = text_parts(model)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == IM_END_ID
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") == ENDOFTEXT_ID

    tf_ids = tokenizer.encode(TF_TEXT, add_special_tokens=False)
    ids = mx.array(tf_ids)[None]

    logits = model(ids, cache=model.make_cache())
    mx.eval(logits)
    cache = model.make_cache()
    mlogits, caps = manual_forward(model, ids, cache)
    mx.eval(mlogits, caps, [c.keys_and_values() if isinstance(c, KVCache) else c.state for c in cache])
    if not np.array_equal(np.array(mlogits), np.array(logits)):
        max_diff = float(mx.abs(mlogits - logits).max().item())
        raise RuntimeError(f"{name}: manual pass differs from model() by {max_diff}")

    assert len(inner.layers) == d.layers, (name, len(inner.layers))
    router_margin = caps.pop("_router_margin", None)
    # The documented identity: tf_hidden.i = (tf_hidden.{i-1} + tf_mixer.i) + tf_mlp.i, exactly.
    h = caps["tf_embed"]
    for i in range(d.layers):
        h = (h + caps[f"tf_mixer.{i}"]) + caps[f"tf_mlp.{i}"]
        assert np.array_equal(np.array(h), np.array(caps.pop(f"_hidden.{i}"))), (name, i)
    if not per_layer:
        for i in range(d.layers):
            del caps[f"tf_mixer.{i}"], caps[f"tf_mlp.{i}"]
    out = {"tf_ids": mx.array(tf_ids, dtype=mx.int32), "tf_logits": logits[0]}
    for k, v in caps.items():
        out[k] = v[0]
    for i, (layer, c) in enumerate(zip(inner.layers, cache)):
        if layer.is_linear:
            out[f"state_conv.{i}"] = c[0]
            out[f"state_recurrent.{i}"] = c[1]
        else:
            keys, values = c.keys_and_values()  # [1, Nkv, N, Dh], post-RoPE
            out[f"state_keys.{i}"] = keys
            out[f"state_values.{i}"] = values

    greedy_prompt_ids = tokenizer.encode(GREEDY_PROMPT, add_special_tokens=False)
    greedy_ids, greedy_margin = greedy(model, greedy_prompt_ids)

    chat_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": GREEDY_PROMPT}], tokenize=False, add_generation_prompt=True
    )
    chat_ids = tokenizer.encode(chat_text, add_special_tokens=False)
    chat_greedy, chat_margin = greedy(model, chat_ids)

    out["greedy_prompt_ids"] = mx.array(greedy_prompt_ids, dtype=mx.int32)
    out["greedy_ids"] = mx.array(greedy_ids, dtype=mx.int32)
    out["chat_prompt_ids"] = mx.array(chat_ids, dtype=mx.int32)
    out["chat_greedy_ids"] = mx.array(chat_greedy, dtype=mx.int32)

    for k, v in out.items():
        if mx.issubdtype(v.dtype, mx.floating):
            out[k] = v.astype(mx.float32)
        assert v.dtype in (mx.float32, mx.int32), (k, v.dtype)
    out = {k: mx.contiguous(out[k]) for k in sorted(out)}
    mx.save_safetensors(str(REF / f"{name}.safetensors"), out, metadata={"format": "pt"})

    lg = np.array(logits[0])
    stats = {
        "tf_logits_std": round(float(lg.std()), 3),
        "tf_logits_mean_row_std": round(float(lg.std(axis=-1).mean()), 3),
        "tf_argmax_distinct": int(len(set(lg.argmax(-1).tolist()))),
        "greedy_distinct": len(set(greedy_ids)),
        "chat_greedy_distinct": len(set(chat_greedy)),
        "greedy_min_top2_margin": round(greedy_margin, 4),
        "chat_greedy_min_top2_margin": round(chat_margin, 4),
    }
    sorted_lg = np.sort(lg, axis=-1)
    stats["tf_min_top2_margin"] = round(float((sorted_lg[:, -1] - sorted_lg[:, -2]).min()), 4)
    if router_margin is not None:
        stats["tf_router_min_topk_margin"] = float(f"{float(router_margin.item()):.3g}")
    if stats["greedy_distinct"] < 2 or stats["chat_greedy_distinct"] < 2:
        raise RuntimeError(f"{name}: degenerate greedy output {stats}")

    header = safetensors_dtypes(ckpt / "model.safetensors")
    gdn_dtypes = {}
    for k, (dt, shape) in header.items():
        if k.endswith(("layers.0.linear_attn.A_log", "layers.0.linear_attn.dt_bias")):
            gdn_dtypes[k.rsplit(".", 1)[-1]] = dt
    meta = {
        "checkpoint": name,
        "model_type": config["model_type"],
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "device": "cpu",
        "dtype": "float32 (model.set_dtype(mx.float32) after mlx_lm.load)",
        "text": TF_TEXT,
        "N": len(tf_ids),
        "vocab": VOCAB,
        "hidden": H,
        "layers": d.layers,
        "layer_types": d.layer_types,
        "greedy_prompt": GREEDY_PROMPT,
        "greedy_prompt_ids": greedy_prompt_ids,
        "greedy_ids": greedy_ids,
        "chat_prompt_text": chat_text,
        "chat_prompt_ids": chat_ids,
        "chat_greedy_ids": chat_greedy,
        "eos_token_id": IM_END_ID,
        "stored_dtypes": gdn_dtypes,
        "quantization": config.get("quantization"),
        "stats": stats,
        "bf16_state": bf16_state_quality(model, tf_ids),
        "bf16_activations": bf16_activation_quality(ckpt, tf_ids, np.array(logits[0])),
        "notes": notes,
    }
    write_json(REF / f"{name}.json", meta)
    print(f"[ref] {name}: N={len(tf_ids)} {stats}")
    return meta


# ----------------------------------------------------------------------------------------
# Quantization vectors
# ----------------------------------------------------------------------------------------
def record_quant_vectors() -> None:
    rng = np.random.default_rng(SEEDS["quant"])
    out = {}
    for bits in (2, 3, 4, 5, 6, 8):
        for g in (32, 64, 128):
            base = rng.standard_normal((QUANT_ROWS, QUANT_COLS), dtype=np.float32) * 0.05
            base += rng.uniform(-0.05, 0.05, size=(QUANT_ROWS, 1)).astype(np.float32)
            w = mx.array(base).astype(mx.bfloat16)
            wq, scales, biases = mx.quantize(w, group_size=g, bits=bits)
            s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
            deq = mx.dequantize(wq, s32, b32, group_size=g, bits=bits)
            x = mx.array(rng.standard_normal((3, QUANT_COLS), dtype=np.float32))
            y = mx.quantized_matmul(x, wq, s32, b32, transpose=True, group_size=g, bits=bits)
            p = f"b{bits}_g{g}"
            assert wq.dtype == mx.uint32 and scales.dtype == mx.bfloat16
            assert bool((scales < 0).any().item()), f"{p}: no negative scales"
            out.update(
                {
                    f"{p}.weight": wq,
                    f"{p}.scales": scales,
                    f"{p}.biases": biases,
                    f"{p}.dequant": deq.astype(mx.float32),
                    f"{p}.x": x,
                    f"{p}.y": y.astype(mx.float32),
                }
            )
    mx.eval(out)
    mx.save_safetensors(str(REF / "quant.safetensors"), dict(sorted(out.items())), metadata={"format": "pt"})
    print(f"[ref] quant.safetensors: {len(out)} tensors")


# ----------------------------------------------------------------------------------------
# Checks on converted checkpoints
# ----------------------------------------------------------------------------------------
def check_converted(folder: Path, quantized: bool, expect_8bit: list[str], d: Dims, keep_index: bool) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    tcfg = cfg.get("text_config", cfg)
    assert tcfg["num_hidden_layers"] == d.layers and tcfg["layer_types"] == d.layer_types, folder
    header = safetensors_dtypes(folder / "model.safetensors")
    assert not any("mtp." in k or "visual" in k for k in header), folder
    assert (folder / "model.safetensors.index.json").exists() == keep_index, folder
    n_layers = {int(k.split("layers.")[1].split(".")[0]) for k in header if "layers." in k}
    assert n_layers == set(range(d.layers)), (folder, sorted(n_layers))
    for k, (dt, shape) in header.items():
        if k.endswith("conv1d.weight"):
            assert shape == [CONV_DIM, CONV_K, 1], (k, shape)
        if "switch_mlp" in k or k.endswith("mlp.gate.weight"):
            assert shape[0] == d.experts, (k, shape)
    if quantized:
        q = cfg["quantization"]
        assert q["bits"] == 4 and q["group_size"] == 64, q
        overrides = {k for k, v in q.items() if isinstance(v, dict)}
        assert overrides == set(expect_8bit), (sorted(overrides), sorted(expect_8bit))
        for k in expect_8bit:
            assert q[k] == {"group_size": 64, "bits": 8}, (k, q[k])
            dt, shape = header[f"{k}.weight"]
            assert dt == "U32" and shape[-1] == H * 8 // 32, (k, dt, shape)
    else:
        assert "quantization" not in cfg
        assert not any(k.endswith(".scales") for k in header)
        assert all(dt in ("BF16", "F32") for dt, _ in header.values()), folder
    model, _ = load(str(folder))  # loads strictly
    del model


def main() -> None:
    args = sys.argv[1:]
    if args:
        # The qwen4_exp fixtures are scripts of their own, which import this one (so this one
        # must not import them): gen-fixtures.sh runs them for `--only qwen4_exp[_mlx]`.
        sys.exit(
            f"usage: gen_fixtures.py (no arguments), got {' '.join(args)}; the qwen4_exp fixtures: "
            "WITH_TORCH=1 bash scripts/gen-fixtures.sh --only qwen4_exp|qwen4_exp_mlx"
        )
    for p in (SHARED / "tokenizers" / "mini-qwen3-next", SHARED / "chat-templates"):
        if not p.exists():
            sys.exit(f"missing shared input: {p} (set QWEN_GDN_SHARED)")

    MODELS.mkdir(exist_ok=True)
    names = [
        "qwen3-next-tiny-4bit",
        "qwen3-next-tiny-bf16",
        "qwen3.5-tiny-4bit",
        "qwen3.5-moe-tiny-4bit",
        "qwen3.5-moe-tiny-hf",
    ]
    for n in names + ["reference"]:
        shutil.rmtree(MODELS / n, ignore_errors=True)
    REF.mkdir()

    with tempfile.TemporaryDirectory(prefix="qwen-gdn-fixtures-") as tmp:
        tmp = Path(tmp)
        # 4-bit checkpoints (TINY dims) are converted from temporary raw folders.
        raw_next = tmp / "qwen3-next-tiny-hf"
        write_raw(raw_next, "qwen3_next", build_qwen3_next_raw(TINY, SEEDS["qwen3_next"]), qwen3_next_config(TINY))
        raw_35 = tmp / "qwen3.5-tiny-hf"
        write_raw(
            raw_35, "qwen3_5", build_qwen3_5_raw(False, TINY, SEEDS["qwen3_5"]), qwen3_5_config(False, TINY)
        )
        raw_35moe = tmp / "qwen3.5-moe-tiny-hf"
        write_raw(
            raw_35moe,
            "qwen3_5_moe",
            build_qwen3_5_raw(True, TINY, SEEDS["qwen3_5_moe"]),
            qwen3_5_config(True, TINY),
        )
        # Unquantized checkpoints (SMALL dims): a raw Qwen3-Next source converted without -q,
        # and a raw Qwen3.5-MoE folder committed as is.
        raw_next_small = tmp / "qwen3-next-small-hf"
        write_raw(
            raw_next_small,
            "qwen3_next",
            build_qwen3_next_raw(SMALL, SEEDS["qwen3_next_small"]),
            qwen3_next_config(SMALL),
        )
        write_raw(
            MODELS / "qwen3.5-moe-tiny-hf",
            "qwen3_5_moe",
            build_qwen3_5_raw(True, SMALL, SEEDS["qwen3_5_moe_small"]),
            qwen3_5_config(True, SMALL),
        )

        convert_checkpoint(raw_next, MODELS / "qwen3-next-tiny-4bit", "qwen3_next", True)
        convert_checkpoint(raw_next_small, MODELS / "qwen3-next-tiny-bf16", "qwen3_next", False)
        convert_checkpoint(raw_35, MODELS / "qwen3.5-tiny-4bit", "qwen3_5", True)
        # The only converted folder that keeps mlx-lm's (single-shard) index file.
        convert_checkpoint(raw_35moe, MODELS / "qwen3.5-moe-tiny-4bit", "qwen3_5_moe", True, keep_index=True)

    gates = ("gate", "shared_expert_gate")
    next_8bit = [f"model.layers.{i}.mlp.{m}" for i in range(TINY.layers) for m in gates]
    moe35_8bit = [f"language_model.model.layers.{i}.mlp.{m}" for i in range(TINY.layers) for m in gates]
    check_converted(MODELS / "qwen3-next-tiny-4bit", True, next_8bit, TINY, False)
    check_converted(MODELS / "qwen3-next-tiny-bf16", False, [], SMALL, False)
    check_converted(MODELS / "qwen3.5-tiny-4bit", True, [], TINY, False)
    check_converted(MODELS / "qwen3.5-moe-tiny-4bit", True, moe35_8bit, TINY, True)
    assert not (MODELS / "qwen3.5-moe-tiny-hf" / "model.safetensors.index.json").exists()

    common = [
        "Reference = mlx_lm.load(checkpoint) then model.set_dtype(mx.float32), MLX CPU device.",
        "tf_* tensors come from one forward over tf_ids with a fresh cache; caches are after it.",
        "greedy/chat_greedy: mlx_lm.generate.generate_step with an argmax sampler, 32 tokens, "
        "no EOS stop (the last prompt token is run alone, as mlx-lm does).",
    ]
    per_layer = [
        "Residual stream not stored: hidden.i = (hidden.{i-1} + tf_mixer.i) + tf_mlp.i in fp32, "
        "hidden.-1 = tf_embed (exact)."
    ]
    no_per_layer = ["No per-layer activations (tf_mixer/tf_mlp/hidden) in this reference."]
    small = "3 layers (GDN 0,1; attention 2), 4 experts top-2"
    record_reference(MODELS / "qwen3-next-tiny-4bit", "qwen3-next-tiny-4bit", TINY, common + per_layer)
    record_reference(
        MODELS / "qwen3-next-tiny-bf16",
        "qwen3-next-tiny-bf16",
        SMALL,
        common
        + no_per_layer
        + [
            f"Unquantized mlx-lm conversion (bf16 weights; A_log cast to bf16 by convert) of its own "
            f"raw Qwen3-Next weights ({small}); not the weights of qwen3-next-tiny-4bit."
        ],
        per_layer=False,
    )
    record_reference(
        MODELS / "qwen3.5-tiny-4bit", "qwen3.5-tiny-4bit", TINY, common + per_layer + ["Tied embeddings."]
    )
    record_reference(MODELS / "qwen3.5-moe-tiny-4bit", "qwen3.5-moe-tiny-4bit", TINY, common + per_layer)
    record_reference(
        MODELS / "qwen3.5-moe-tiny-hf",
        "qwen3.5-moe-tiny-hf",
        SMALL,
        common
        + no_per_layer
        + [
            "Raw HF layout loaded by mlx-lm directly (sanitize: drops model.visual.* and mtp.*, "
            "splits experts.gate_up_proj (gate first), moves conv1d [C,1,K]->[C,K,1], adds 1 "
            "to zero-centred norms in bf16). A_log stored fp32, everything else bf16.",
            f"{small}; not the weights of qwen3.5-moe-tiny-4bit.",
        ],
        per_layer=False,
    )
    record_quant_vectors()

    # Summary of hashes (for determinism checks)
    for f in sorted(MODELS.rglob("*")):
        if f.is_file() and f != MODELS / "README.md":
            h = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
            print(f"{h}  {f.relative_to(MODELS)}  {f.stat().st_size}")


if __name__ == "__main__":
    main()
