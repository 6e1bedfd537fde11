"""Qwen3.8-Flash-Next's (`qwen4_exp`) own MTP head on the tiny fixture, trained on the tiny
model's own greedy continuations, and its reference from **mlx-vlm 0.7.10's drafter**
(`mlx_vlm/speculative/drafters/qwen4_exp_mtp`, `Qwen4ExpMTPDraftModel`), run by mlx on the CPU.

Run as `WITH_TORCH=1 bash scripts/gen-fixtures.sh --only qwen4_exp_mtp` (WITH_TORCH=1 installs
the mlx-vlm wheel; torch itself is not used here). Writes only:

  models/mtp/qwen4-exp-mtp-tiny-hf/                 models/qwen4-exp-tiny-hf (its main weights
                                                    unchanged, its placeholder `mtp.fc` dropped)
                                                    + the trained head in the raw HF layout
                                                    (`mtp.*`, bf16, experts one tensor each as
                                                    the main layers store them, norms
                                                    zero-centred)
  models/mtp/reference/qwen4-exp-mtp-tiny-hf.safetensors / .json

What mlx-vlm runs (read, docs/mtp.md §8):

    e  = fc_embedding(pre_fc_norm_embedding(embed(t[i+1])))
    hs = pre_fc_norm_hidden(streams[i])      streams: the main model's S residual streams
                                             BEFORE its final hyper_connection_mixer (mlx-vlm's
                                             `return_hidden` capture); one norm over all S·H
    x  = fc_hidden(hs as [S, H]) + e         per stream
    y  = Qwen4ExpDecoderLayer (QSA attention, MoE; layer 0 of a one-layer model, no PLE)
    logits = lm_head(hyper_connection_mixer(y))   the head's own mixer; y chains the next draft

The main model is mlx-vlm's own `qwen4_exp` Model (weights cast to f32: mlx's CPU GatherMM is
f32 only), so both the streams and the head's logits come from mlx-vlm. mlx-vlm is imported
module by module as gen_fixture_qwen4_exp_mlx.py does (stand-ins for the image/audio/HTTP
packages its utils import).

Training (recorded in the .json): random prompts of 12 tokens continued greedily for 52 by the
main model; the head learns t[i+2] from (streams[i], t[i+1]), teacher forced, Adam with a
cosine schedule, mlx on the CPU, fixed seeds. The embedding and lm_head are the main model's,
frozen. The head's weights are then rounded to bf16 (as stored) before the reference runs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
import time
import types
from pathlib import Path

import numpy as np

import gen_fixtures as gf
import gen_fixture_qwen4_exp_mlx as mlxfix

import mlx.core as mx

NAME = "qwen4-exp-mtp-tiny-hf"
SRC = gf.MODELS / "qwen4-exp-tiny-hf"
OUT = gf.MODELS / "mtp" / NAME
REF = gf.MODELS / "mtp" / "reference"
SEED = 2401
PROMPT, CONTINUE = 12, 52  # 64 tokens: past the QSA indexer's budget (8 blocks of 4)
TRAIN, HELD = 192, 32
STEPS, BATCH, LR = 300, 16, 3e-3
# Ids the random prompts avoid: the tokenizer's special tokens start at 1984.
VOCAB_PLAIN = 1984


def import_mlx_vlm():
    """The qwen4_exp model and drafter modules of the mlx-vlm wheel, without its package
    __init__ (which imports generation, server and audio)."""
    if "mlx_vlm" not in sys.modules:
        spec = importlib.util.find_spec("mlx_vlm")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(
                "mlx-vlm is not installed: WITH_TORCH=1 bash scripts/with-fixture-venv.sh "
                "scripts/gen_fixture_qwen4_exp_mtp.py"
            )
        package = types.ModuleType("mlx_vlm")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["mlx_vlm"] = package
        sys.meta_path.insert(0, mlxfix._StubFinder())
    from mlx_vlm.version import __version__

    assert __version__ == "0.7.10", __version__
    from mlx_vlm.models.qwen4_exp import qwen4_exp as model_mod
    from mlx_vlm.models.qwen4_exp.config import ModelConfig
    from mlx_vlm.speculative.drafters import qwen4_exp_mtp as drafter_mod

    return model_mod, ModelConfig, drafter_mod


def load_main(model_mod, ModelConfig):
    config = json.loads((SRC / "config.json").read_text())
    model = model_mod.Model(ModelConfig.from_dict(config))
    weights = mx.load(str(SRC / "model.safetensors"))
    weights = {
        k: v.astype(mx.float32) if v.dtype in (mx.bfloat16, mx.float16) else v
        for k, v in model.sanitize(weights).items()
    }
    # The vision tower is not run; the language model's weights must all be there.
    model.load_weights(list(weights.items()), strict=False)
    mx.eval(model.parameters())
    return model, config


def greedy(lm, prompts: np.ndarray, n: int) -> np.ndarray:
    """Greedy continuations of equal-length prompts [B, P] → [B, P + n], one row at a time
    (the batched forward of mlx-vlm's qwen4_exp splits rows anyway)."""
    rows = []
    for prompt in prompts:
        cache = lm.make_cache()
        ids = list(int(t) for t in prompt)
        x = mx.array([ids])
        for _ in range(n):
            logits = lm(x, cache=cache).logits[:, -1]
            t = int(mx.argmax(logits, axis=-1).item())
            ids.append(t)
            x = mx.array([[t]])
        rows.append(ids)
    return np.array(rows, dtype=np.int64)


def streams_of(lm, ids: np.ndarray):
    """The main model's streams before its final mixer [T, S·H] and its logits [T, V]."""
    out = lm(mx.array(ids[None]), cache=lm.make_cache(), return_hidden=True)
    return out.hidden_states[0][0], out.logits[0]


def make_head(drafter_mod, config: dict, model, seed: int):
    mx.random.seed(seed)
    head = drafter_mod.Model(drafter_mod.ModelConfig.from_dict(config))
    head.bind(model)
    # Norms start at 0 (applied as 1 + w); a little noise so that a convention mistake shows.
    from mlx.utils import tree_flatten, tree_unflatten

    params = []
    for k, v in tree_flatten(head.parameters()):
        if k.endswith("norm.weight") or k.endswith("layernorm.weight"):
            v = 0.05 * mx.random.normal(v.shape)
        params.append((k, v.astype(mx.float32)))
    head.update(tree_unflatten(params))
    mx.eval(head.parameters())
    return head


def head_logits(head, streams, ids):
    """The head over every pair (streams[:, i], ids[:, i+1]) of [B, T] sequences, without a
    cache (causal): logits [B, T−1, V] and the output streams."""
    head._next_position = 0
    nxt = ids[:, 1:]
    emb = head._input_embed(nxt)
    mixed, out = head._forward_hidden(emb, streams[:, :-1], nxt, None)
    return head._lm_head_fn(mixed), out


def train(head, lm, seqs: np.ndarray, streams: np.ndarray, held: tuple, seed: int) -> dict:
    import mlx.nn as nn
    import mlx.optimizers as optim

    # Only the head learns: the embedding and lm_head it borrows stay the main model's.
    lm.freeze()

    def loss_fn(head, s, ids):
        logits, _ = head_logits(head, s, ids)
        return nn.losses.cross_entropy(logits[:, :-1], ids[:, 2:], reduction="mean")

    # The indexer's block selection (a top-k, then a scatter into a mask) has no gradient:
    # it is taken as given (every array of it detached) while the head trains, so the
    # indexer's own projection keeps its initial weights. The reference below runs mlx-vlm's
    # code unpatched.
    indexer = head.layers[0].self_attn.indexer
    select = indexer.select

    def detached_select(x, cache, positions):
        selection = select(x, cache, positions)
        for key, value in vars(selection or object()).items():
            if isinstance(value, mx.array):
                setattr(selection, key, mx.stop_gradient(value))
        return selection

    indexer.select = detached_select
    schedule = optim.cosine_decay(LR, STEPS)
    opt = optim.Adam(learning_rate=schedule)
    step = nn.value_and_grad(head, loss_fn)
    rng = np.random.default_rng(seed)
    start = time.time()
    loss = float("nan")
    for i in range(STEPS):
        pick = rng.choice(len(seqs), BATCH, replace=False)
        loss, grads = step(head, mx.array(streams[pick]), mx.array(seqs[pick]))
        opt.update(head, grads)
        mx.eval(head.parameters(), opt.state, loss)
        if i % 50 == 0:
            print(f"[train] step {i}: loss {float(loss):.4f}", flush=True)
    indexer.select = select
    return {
        "steps": STEPS,
        "batch_sequences": BATCH,
        "lr": LR,
        "schedule": "Adam, cosine decay to 0",
        "train_sequences": len(seqs),
        "held_out_sequences": len(held[0]),
        "sequence_length": PROMPT + CONTINUE,
        "final_loss": round(float(loss), 4),
        "train_top1": round(accuracy(head, seqs[:64], streams[:64]), 4),
        "held_out_top1": round(accuracy(head, *held), 4),
        "seconds": round(time.time() - start, 1),
    }


def accuracy(head, seqs, streams) -> float:
    logits, _ = head_logits(head, mx.array(streams), mx.array(seqs))
    pred = np.array(mx.argmax(logits[:, PROMPT:-1], axis=-1))
    return float((pred == seqs[:, PROMPT + 2 :]).mean())


def hf_head_tensors(head) -> dict:
    """The head in the raw HF layout: `mtp.` + mlx-vlm's names, its stacked experts written
    one tensor per expert as the main layers of the fixture store them (bf16)."""
    from mlx.utils import tree_flatten

    out = {}
    for k, v in tree_flatten(head.parameters()):
        v = v.astype(mx.bfloat16)
        if ".switch_mlp." in k:
            proj = k.split(".switch_mlp.")[1].split(".")[0]
            for e in range(v.shape[0]):
                out[f"mtp.layers.0.mlp.experts.{e}.{proj}.weight"] = v[e]
        else:
            out[f"mtp.{k}"] = v
    return out


def round_head_to_bf16(head) -> None:
    from mlx.utils import tree_flatten, tree_unflatten

    head.update(
        tree_unflatten(
            [(k, v.astype(mx.bfloat16).astype(mx.float32)) for k, v in tree_flatten(head.parameters())]
        )
    )
    mx.eval(head.parameters())


def selection_margins(head, streams, ids: np.ndarray) -> np.ndarray:
    """Per pair row of the reference, how far the QSA indexer's top-k cut-off of the head is
    from a tie: the k-th best block score minus the next one (1e9 on rows with no more
    complete blocks than the budget, which see every block). The scores are ReLU sums, so
    blocks at exactly 0 tie often, and which of them mlx's argpartition keeps is its own
    choice: the tests compare only rows with a margin. The same calls as
    `Qwen4ExpQSAIndexer.select_from_projected` (uncached, no padding)."""
    head._next_position = 0
    nxt = mx.array(ids[None, 1:])
    x = head.fuse_inputs(head._input_embed(nxt), streams[None, :-1])
    positions = head._position_ids(length=x.shape[1])
    layer = head.layers[0]
    mixed, _, _ = layer.attn_hyper_connection(x)
    ix = layer.self_attn.indexer
    qk = ix.index_qk_proj(mixed)
    b, t, _ = qk.shape
    qk = qk.reshape(b, t, ix.n_heads + ix.kv_heads, ix.head_dim)
    q = ix._apply_rope(ix.q_layernorm(qk[:, :, : ix.n_heads]).transpose(0, 2, 1, 3), positions)
    keys = qk[:, :, ix.n_heads :].squeeze(2)
    blocks = t // ix.compress_ratio
    pooled = keys[:, : blocks * ix.compress_ratio].reshape(b, blocks, ix.compress_ratio, ix.head_dim)
    pooled = mx.expand_dims(ix.k_layernorm(mx.mean(pooled.astype(mx.float32), axis=2)), 1)
    pooled = ix._apply_rope(pooled, positions[..., mx.arange(blocks) * ix.compress_ratio])
    scores = q.astype(mx.float32) @ pooled.astype(mx.float32).transpose(0, 1, 3, 2)
    scores = np.array(mx.sum(mx.maximum(scores, 0), axis=1)[0] / math.sqrt(ix.head_dim))
    margins = np.full(t, 1e9, dtype=np.float32)
    for i in range(t):
        complete = (i + 1) // ix.compress_ratio
        if complete > ix.block_topk:
            best = np.sort(scores[i, :complete])[::-1]
            margins[i] = best[ix.block_topk - 1] - best[ix.block_topk]
    return margins


def chain(head, lm_model, ids: np.ndarray, streams, at: int, k: int):
    """mlx-vlm's own drafting from position `at` (its greedy draft_block after
    prefill_from_target_hidden over the pairs up to `at`): k tokens, and each draft's logits
    replayed through the same calls (_forward_tokens, lm_head)."""
    x = mx.array(ids[None])
    s = streams[None]
    head.reset(lm_model)
    head.prefill_from_target_hidden(x[:, : at + 1], s[:, : at + 1], int(ids[at + 1]), None, greedy=True)
    drafts = head.draft_block(int(ids[at + 1]), None, None, k + 1, None, greedy=True)
    tokens = [int(t) for t in np.array(drafts[0])]
    # The same drafts, logits kept: the pairs up to `at` in one call, then chained.
    head.reset(lm_model)
    head._next_position = 0
    mixed, out = head._forward_tokens(x[:, 1 : at + 2], s[:, : at + 1], mx.int32)
    logits = [head._lm_head_fn(mixed[:, -1:])[0, 0]]
    h = out[:, -1:]
    for j in range(k - 1):
        t = int(mx.argmax(logits[-1]).item())
        mixed, h = head._forward_tokens(mx.array([[t]]), h, mx.int32)
        logits.append(head._lm_head_fn(mixed)[0, 0])
    replay = [int(mx.argmax(l).item()) for l in logits]
    assert replay == tokens, (replay, tokens)
    return tokens, mx.stack(logits)


def main() -> None:
    model_mod, ModelConfig, drafter_mod = import_mlx_vlm()
    model, config = load_main(model_mod, ModelConfig)
    lm = model.language_model
    rng = np.random.default_rng(SEED)

    prompts = rng.integers(3, VOCAB_PLAIN, size=(TRAIN + HELD + 1, PROMPT))
    # An optional file keeps the greedy sequences between runs (a few minutes to make).
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    if data is not None and data.exists():
        seqs = np.load(data)["seqs"]
        assert (seqs[:, :PROMPT] == prompts).all(), f"{data} holds other prompts"
    else:
        t0 = time.time()
        seqs = greedy(lm, prompts, CONTINUE)
        print(f"[data] {len(seqs)} greedy sequences in {time.time() - t0:.0f}s", flush=True)
        if data is not None:
            np.savez(data, seqs=seqs)
    streams = np.stack([np.array(streams_of(lm, s)[0]) for s in seqs])
    ref_ids, seqs = seqs[0], seqs[1:]
    ref_streams = streams[0]
    train_seqs, held_seqs = seqs[:TRAIN], seqs[TRAIN:]
    train_streams, held_streams = streams[1 : TRAIN + 1], streams[TRAIN + 1 :]

    head = make_head(drafter_mod, config, model, SEED + 1)
    training = train(head, lm, train_seqs, train_streams, (held_seqs, held_streams), SEED + 2)
    print(f"[train] {json.dumps(training)}", flush=True)
    round_head_to_bf16(head)

    # The checkpoint: the main fixture's files, its placeholder head replaced by this one.
    if OUT.exists():
        shutil.rmtree(OUT)
    shutil.copytree(SRC, OUT)
    main_weights = {k: v for k, v in mx.load(str(SRC / "model.safetensors")).items() if not k.startswith("mtp.")}
    mx.save_safetensors(str(OUT / "model.safetensors"), {**main_weights, **hf_head_tensors(head)}, metadata={"format": "pt"})

    # The reference, from mlx-vlm on the bf16-rounded head.
    s, main_logits = streams_of(lm, ref_ids)
    logits, _ = head_logits(head, s[None], mx.array(ref_ids[None]))
    logits = logits[0]
    # Cached, one call: what the drafter's own prefill computes (equal to the uncached run).
    head.reset(model)
    mixed, _ = head._forward_tokens(mx.array(ref_ids[None, 1:]), s[None, :-1], mx.int32)
    cached = head._lm_head_fn(mixed)[0]
    scale = float(mx.abs(logits).max())
    cached_vs_full = float(mx.abs(cached - logits).max()) / scale
    margins = selection_margins(head, s, ref_ids)
    at, k = 40, 4
    tokens, chain_logits = chain(head, model, ref_ids, s, at, k)
    top2 = mx.sort(logits, axis=-1)[:, -2:]
    meta = {
        "checkpoint": NAME,
        "seed": SEED,
        "mlx_version": mx.__version__,
        "mlx_vlm_version": "0.7.10",
        "reference": "main model and head: mlx-vlm 0.7.10 (qwen4_exp Model, Qwen4ExpMTPDraftModel) in f32 on the CPU, head weights bf16-rounded as stored",
        "ids": "a random prompt of 12 + 52 greedy tokens of the main model",
        "streams": "main model's S residual streams before its final mixer, every position [T, S*H]",
        "head_logits": "head logits of the pair (streams[i], ids[i+1]) at position i, predicting ids[i+2]; every pair in one causal call",
        "chain": f"mlx-vlm draft_block (greedy) after prefill_from_target_hidden over the pairs up to position {at}: chain_tokens, chain_logits",
        "cached_vs_full_rel": cached_vs_full,
        "head_max_abs_logit": scale,
        "head_min_top2_margin": round(float((top2[:, 1] - top2[:, 0]).min()), 5),
        "head_agrees_with_main_on_ref": round(
            float((np.array(mx.argmax(logits[:-1], -1)) == np.array(mx.argmax(main_logits[1:-1], -1))).mean()), 4
        ),
        "head_selection_margins": "per pair row, the head's QSA top-k cut-off margin (1e9: every block visible); rows under 1e-4 are a tie that mlx's argpartition breaks its own way",
        "head_tied_rows": [int(i) for i in np.nonzero(margins < 1e-4)[0]],
        "chain_at": at,
        "train_prompt_ids": "the prompt of the first training sequence: the head memorised its training continuations (held-out top-1 is low), so acceptance is measured from it",
        "training": training,
    }
    REF.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(
        str(REF / f"{NAME}.safetensors"),
        {
            "ids": mx.array(ref_ids.astype(np.int64)),
            "streams": s.astype(mx.float32),
            "main_logits": main_logits.astype(mx.float32),
            "head_logits": logits.astype(mx.float32),
            "chain_at": mx.array([at], dtype=mx.int64),
            "chain_tokens": mx.array(np.array(tokens, dtype=np.int64)),
            "chain_logits": chain_logits.astype(mx.float32),
            "train_prompt_ids": mx.array(train_seqs[0, :PROMPT].astype(np.int64)),
            "head_selection_margins": mx.array(margins),
        },
    )
    (REF / f"{NAME}.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"[ref] {json.dumps({k: meta[k] for k in ('cached_vs_full_rel', 'head_agrees_with_main_on_ref', 'head_min_top2_margin')})}")
    print(f"[ref] chain at {at}: {tokens}")


if __name__ == "__main__":
    main()
