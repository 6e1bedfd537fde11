"""Tiny hybrid checkpoints with a multi-token-prediction (MTP) head trained on the model's own
greedy continuations, and their torch references (issue 28).

Run as `WITH_TORCH=1 bash scripts/with-fixture-venv.sh scripts/gen_fixture_mtp.py`. Writes only:

  models/mtp/qwen3.5-mtp-tiny-hf/    raw HF qwen3_5 (dense, tied embeddings) + trained mtp.*
  models/mtp/qwen3-next-mtp-tiny-hf/ raw HF qwen3_next (MoE, experts one tensor each) + mtp.*
  models/mtp/qwen3.5-moe-mtp-tiny-hf/ raw HF qwen3_5_moe (MoE, fused gate_up_proj) + mtp.*
  models/mtp/qwen3.5-mtp-tiny-4bit/  mlx_lm.convert -q of the first, plus its head appended the
                                     way an MTP-keeping MLX conversion stores it: quantized
                                     (4-bit g64) under `language_model.mtp.*`, norms shifted (1+w)
  models/mtp/reference/<name>.safetensors / .json   for the three raw folders

(A folder of their own: the tests that walk models/ and models/reference/ expect the mlx-lm
fixtures there and nothing else.)

The main models are gen_fixtures.py's raw builders (SMALL dims: GDN, GDN, attention) with
seeds of their own. Their reference is transformers 5.23.0 in fp32 (eager attention). The head
is written here in torch from the published structure (docs/mtp.md cites what was read):

    e = pre_fc_norm_embedding(embed(t[i+1]))       norms zero-centred: x·rsqrt(mean x²+eps)·(1+w)
    h = pre_fc_norm_hidden(hidden[i])              hidden = the main model's last hidden state
                                                   AFTER its final norm (what vLLM, SGLang and
                                                   mlx-vlm feed the head)
    x = fc(cat[e, h])                              embedding first
    x = decoder layer (full gated attention + MLP/MoE of the family, its own KV cache,
        RoPE position i)
    g = mtp.norm(x);  logits = lm_head(g)          predicts t[i+2]; g is the hidden state of
                                                   the next chained draft

Training (recorded in the reference .json): the main model greedily continues random and text
prompts; the head learns t[i+2] from (hidden[i], t[i+1]) over those sequences, teacher forced,
Adam, fixed seeds, torch on the CPU with one thread. The embedding and lm_head are the main
model's, frozen. Deterministic for a given torch build.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import gen_fixtures as gf

MODELS = gf.MODELS / "mtp"
REF = MODELS / "reference"
DIMS = gf.SMALL  # 3 layers: GDN 0, 1; attention 2; 4 experts top-2 in the MoE families
FIXTURES = {
    # name: (family, seed of the main weights, seed of the head's init and training)
    "qwen3.5-mtp-tiny-hf": ("qwen3_5", 1201, 2201),
    "qwen3-next-mtp-tiny-hf": ("qwen3_next", 1202, 2202),
    "qwen3.5-moe-mtp-tiny-hf": ("qwen3_5_moe", 1203, 2203),
}
MLX_NAME = "qwen3.5-mtp-tiny-4bit"  # the MLX twin of the first

# Training data: greedy continuations of the main model.
TRAIN_PROMPTS = 384  # random-token prompts (plus the text prompts below)
HELD_OUT_PROMPTS = 64
PROMPT_LEN = 8
CONTINUATION = 56
REGULAR_TOKENS = gf.ENDOFTEXT_ID  # ids below the special tokens
TEXT_PROMPTS = [
    gf.TF_TEXT,
    "Once upon a time there was a small village by the sea.",
    "The quick brown fox jumps over the lazy dog.",
    "In the morning the market opens early and the bakers sell fresh bread.",
]
# Adam on the head's parameters.
STEPS = 600
BATCH = 32
LR = 3e-3

REF_GREEDY = 64  # greedy tokens recorded after the prompt
REF_POSITIONS = 12  # head logits recorded at this many positions


def torch_mod():
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    return torch


# ----------------------------------------------------------------------------------------
# Main weights and folders
# ----------------------------------------------------------------------------------------
def main_weights(family: str, seed: int) -> tuple[dict, dict]:
    if family == "qwen3_next":
        w, cfg = gf.build_qwen3_next_raw(DIMS, seed), gf.qwen3_next_config(DIMS)
    else:
        moe = family == "qwen3_5_moe"
        w, cfg = gf.build_qwen3_5_raw(moe, DIMS, seed), gf.qwen3_5_config(moe, DIMS)
    # gen_fixtures adds a few loose mtp.* tensors (for loaders that must skip them); the head
    # here is complete and trained instead.
    return {k: v for k, v in w.items() if not k.startswith("mtp.")}, cfg


def load_main(folder: Path):
    torch = torch_mod()
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"], info["missing_keys"]
    unexpected = [k for k in info["unexpected_keys"] if not k.startswith(("mtp.", "model.visual."))]
    assert not unexpected, unexpected
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# ----------------------------------------------------------------------------------------
# The MTP head, from the published structure
# ----------------------------------------------------------------------------------------
def make_head(main, seed: int):
    torch = torch_mod()
    nn = torch.nn

    class ZeroCentredRmsNorm(nn.Module):
        """RMSNorm whose weight is stored zero-centred and applied as 1 + w, in f32."""

        def __init__(self, dim: int, eps: float):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(dim))
            self.eps = eps

        def forward(self, x):
            x = x.float()
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    class MtpHead(nn.Module):
        def __init__(self):
            super().__init__()
            cfg = copy.deepcopy(main.config)
            cfg.layer_types = ["full_attention"]
            cfg.num_hidden_layers = 1
            self.cfg = cfg
            hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
            self.pre_fc_norm_embedding = ZeroCentredRmsNorm(hidden, eps)
            self.pre_fc_norm_hidden = ZeroCentredRmsNorm(hidden, eps)
            self.fc = nn.Linear(2 * hidden, hidden, bias=False)
            # The family's own decoder layer class (gated attention + MLP or MoE).
            kinds = main.config.layer_types
            attention_layer = main.model.layers[kinds.index("full_attention")]
            self.layer = type(attention_layer)(cfg, 0)
            self.norm = ZeroCentredRmsNorm(hidden, eps)

        def forward(self, next_tokens, hidden, positions, cache=None):
            """`next_tokens` [B, S] are t[i+1], `hidden` [B, S, H] the main model's normed
            hidden[i], `positions` [B, S] the positions i. Returns (g, logits)."""
            e = self.pre_fc_norm_embedding(main.model.embed_tokens(next_tokens))
            h = self.pre_fc_norm_hidden(hidden)
            x = self.fc(torch.cat([e, h], dim=-1))
            s = x.shape[1]
            past = 0 if cache is None else cache.get_seq_length()
            mask = torch.full((s, past + s), float("-inf")).triu(past + 1)[None, None]
            rope = main.model.rotary_emb(x, positions)
            x = self.layer(
                x,
                position_embeddings=rope,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
            )
            if isinstance(x, tuple):
                x = x[0]
            g = self.norm(x)
            return g, main.lm_head(g)

    head = MtpHead()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(p.shape[-1]))
    return head


def round_to_bf16(head) -> None:
    """What the checkpoint stores: every parameter rounded to bf16 (the reference then runs on
    exactly the stored values)."""
    torch = torch_mod()
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def head_tensors(head, family: str) -> dict:
    """The head's parameters under the checkpoint names of `family` (raw HF layout)."""
    out = {}
    for name, p in head.state_dict().items():
        v = p.detach().float().numpy()
        if name.startswith("layer."):
            rest = name[len("layer.") :]
            if family == "qwen3_next" and rest.startswith("mlp.experts."):
                # Qwen3-Next ships one tensor per expert; transformers fuses them at load.
                experts = v.shape[0]
                if rest == "mlp.experts.gate_up_proj":
                    inter = v.shape[1] // 2
                    for e in range(experts):
                        out[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] = v[e, :inter]
                        out[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] = v[e, inter:]
                else:
                    assert rest == "mlp.experts.down_proj", rest
                    for e in range(experts):
                        out[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = v[e]
                continue
            out[f"mtp.layers.0.{rest}"] = v
        else:
            out[f"mtp.{name}"] = v
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


# ----------------------------------------------------------------------------------------
# Data: the main model's greedy continuations and its normed hidden states
# ----------------------------------------------------------------------------------------
def greedy_batch(main, prompts, n: int):
    """Greedy continuations of equal-length prompts [B, P] → ids [B, P + n]."""
    torch = torch_mod()
    from transformers import DynamicCache

    cache = DynamicCache(config=main.config)
    ids = torch.tensor(prompts)
    x = ids
    with torch.no_grad():
        for _ in range(n):
            logits = main(x, past_key_values=cache, use_cache=True).logits[:, -1]
            x = logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, x], dim=1)
    return ids


def normed_hidden(main, ids):
    """The last hidden state after the final norm, [B, T, H], and the logits."""
    torch = torch_mod()
    with torch.no_grad():
        out = main(ids, use_cache=False, output_hidden_states=True)
    return out.hidden_states[-1], out.logits


def training_data(main, tokenizer, rng):
    torch = torch_mod()
    prompts = rng.integers(0, REGULAR_TOKENS, size=(TRAIN_PROMPTS + HELD_OUT_PROMPTS, PROMPT_LEN))
    seqs = greedy_batch(main, prompts.tolist(), CONTINUATION)
    train, held = seqs[:TRAIN_PROMPTS], seqs[TRAIN_PROMPTS:]
    text = []
    for t in TEXT_PROMPTS:
        ids = tokenizer.encode(t, add_special_tokens=False)
        # Windows of the text as prompts, so that text-like contexts are seen too.
        for start in range(0, max(1, len(ids) - PROMPT_LEN), 4):
            text.append(ids[start : start + PROMPT_LEN])
    text = [p for p in text if len(p) == PROMPT_LEN]
    train = torch.cat([train, greedy_batch(main, text, CONTINUATION)])
    return train, held


def pairs(main, seqs):
    """Per sequence: (t[i+1], hidden[i], position i) for i < T−2, and the target t[i+2]."""
    torch = torch_mod()
    hidden, _ = normed_hidden(main, seqs)
    t = seqs.shape[1]
    positions = torch.arange(t - 2)[None].expand(seqs.shape[0], -1)
    return seqs[:, 1 : t - 1], hidden[:, : t - 2], positions, seqs[:, 2:]


def accuracy(head, data, first: int) -> float:
    """Top-1 agreement of the head with the main model's next-next token, over the positions
    from `first` on (the continuation)."""
    torch = torch_mod()
    nxt, hid, pos, tgt = data
    with torch.no_grad():
        _, logits = head(nxt, hid, pos)
    return float((logits.argmax(-1) == tgt)[:, first:].float().mean())


def train_head(main, head, train, held, seed: int) -> dict:
    torch = torch_mod()
    torch.manual_seed(seed)
    data, held_data = pairs(main, train), pairs(main, held)
    nxt, hid, pos, tgt = data
    params = [p for p in head.parameters()]
    opt = torch.optim.Adam(params, lr=LR)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS)
    gen = torch.Generator().manual_seed(seed)
    start, losses = time.time(), []
    head.train()
    for step in range(STEPS):
        idx = torch.randint(0, nxt.shape[0], (BATCH,), generator=gen)
        _, logits = head(nxt[idx], hid[idx], pos[idx])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[idx].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if step % 150 == 0 or step == STEPS - 1:
            print(f"  step {step}: loss {np.mean(losses[-50:]):.4f}", flush=True)
    head.eval()
    round_to_bf16(head)
    first = PROMPT_LEN - 1  # pairs whose target is a continuation token
    return {
        "steps": STEPS,
        "batch_sequences": BATCH,
        "lr": LR,
        "schedule": "Adam, cosine annealing to 0",
        "train_sequences": int(nxt.shape[0]),
        "held_out_sequences": int(held_data[0].shape[0]),
        "sequence_length": int(train.shape[1]),
        "final_loss": round(float(np.mean(losses[-50:])), 4),
        "train_top1": round(accuracy(head, data, first), 4),
        "held_out_top1": round(accuracy(head, held_data, first), 4),
        "seconds": round(time.time() - start, 1),
        "threads": 1,
    }


# ----------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------
def record(name: str, family: str, main, head, tokenizer, training: dict, seeds: tuple) -> None:
    torch = torch_mod()
    import safetensors.torch
    import transformers

    prompt = tokenizer.encode(gf.GREEDY_PROMPT, add_special_tokens=False)
    seq = greedy_batch(main, [prompt], REF_GREEDY)
    hidden, logits = normed_hidden(main, seq)
    t = seq.shape[1]
    with torch.no_grad():
        _, head_logits = head(seq[:, 1:], hidden[:, : t - 1], torch.arange(t - 1)[None])
        # The same pairs one at a time through a KV cache: the head's decode form.
        from transformers import DynamicCache

        cache = DynamicCache(config=head.cfg)
        steps = []
        for i in range(t - 1):
            _, lg = head(seq[:, i + 1 : i + 2], hidden[:, i : i + 1], torch.tensor([[i]]), cache)
            steps.append(lg[0, 0])
        step_logits = torch.stack(steps)
    scale = float(head_logits.abs().max())
    step_vs_full = float((step_logits - head_logits[0]).abs().max()) / scale
    assert step_vs_full < 1e-5, (name, step_vs_full)
    positions = np.linspace(0, t - 2, REF_POSITIONS).round().astype(np.int64)
    agree = (head_logits[0].argmax(-1)[:-1] == seq[0, 2:]).float()
    sorted_lg = head_logits[0].sort(-1).values
    out = {
        "ids": seq[0].to(torch.int32),
        "prompt_len": torch.tensor([len(prompt)], dtype=torch.int32),
        "hidden": hidden[0],
        "main_logits": logits[0, positions],
        "head_positions": torch.from_numpy(positions.astype(np.int32)),
        "head_logits": head_logits[0, positions],
    }
    out = {k: v.contiguous() for k, v in sorted(out.items())}
    safetensors.torch.save_file(out, str(REF / f"{name}.safetensors"), metadata={"format": "pt"})
    meta = {
        "checkpoint": name,
        "family": family,
        "seeds": {"main_weights": seeds[0], "head": seeds[1]},
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "reference": "main model: transformers fp32 eager; head: scripts/gen_fixture_mtp.py (torch, fp32) on the bf16-rounded trained weights",
        "ids": "prompt (greedy_prompt of gen_fixtures.py) + 64 greedy tokens of the main model",
        "hidden": "main model's last hidden state after the final norm, every position",
        "head_logits": "head logits of the pair (hidden[i], ids[i+1]) at position i = head_positions, predicting ids[i+2]; the head ran once over every pair, causal",
        "head_step_vs_full_rel": step_vs_full,
        "head_max_abs_logit": scale,
        "head_min_top2_margin": round(float((sorted_lg[:, -1] - sorted_lg[:, -2]).min()), 5),
        "head_agrees_with_main_on_ref": round(float(agree.mean()), 4),
        "training": training,
    }
    gf.write_json(REF / f"{name}.json", meta)
    print(f"[ref] {name}: {json.dumps({k: meta[k] for k in ('head_agrees_with_main_on_ref', 'head_step_vs_full_rel')})}")


def write_checkpoint(folder: Path, family: str, weights: dict, config: dict) -> None:
    """gen_fixtures.write_raw, plus the README's "what is in here" check."""
    gf.write_raw(folder, family, weights, config)
    header = gf.safetensors_dtypes(folder / "model.safetensors")
    assert any(k.startswith("mtp.layers.0.") for k in header), folder


def mlx_twin(raw: Path, out: Path, head: dict) -> None:
    """mlx_lm.convert -q of `raw` (which drops mtp.*), then the head appended as an MTP-keeping
    MLX conversion stores it: linear weights MLX-affine 4-bit g64, norm weights shifted to
    1 + w in bf16, everything under `language_model.mtp.*`."""
    import mlx.core as mx

    gf.convert_checkpoint(raw, out, "qwen3_5", True)
    path = out / "model.safetensors"
    tensors = dict(mx.load(str(path)))
    assert not any("mtp." in k for k in tensors)
    for k, v in head.items():
        key = "language_model." + k
        arr = mx.array(v).astype(mx.bfloat16)
        if k.endswith("norm.weight"):
            tensors[key] = (mx.array(v) + 1.0).astype(mx.bfloat16)
        elif v.ndim == 2:
            wq, scales, biases = mx.quantize(arr, group_size=64, bits=4)
            module = key[: -len(".weight")]
            tensors[f"{module}.weight"] = wq
            tensors[f"{module}.scales"] = scales
            tensors[f"{module}.biases"] = biases
        else:
            tensors[key] = arr
    mx.save_safetensors(str(path), dict(sorted(tensors.items())), metadata={"format": "mlx"})


def main() -> None:
    if sys.argv[1:]:
        sys.exit("usage: gen_fixture_mtp.py (no arguments)")
    torch = torch_mod()
    from transformers import AutoTokenizer

    REF.mkdir(parents=True, exist_ok=True)
    for name in list(FIXTURES) + [MLX_NAME]:
        shutil.rmtree(MODELS / name, ignore_errors=True)
    dense_head = None
    with tempfile.TemporaryDirectory(prefix="qwen-gdn-mtp-") as tmp:
        tmp = Path(tmp)
        for name, (family, main_seed, head_seed) in FIXTURES.items():
            print(f"[mtp] {name}", flush=True)
            weights, config = main_weights(family, main_seed)
            main_only = tmp / f"{name}-main"
            gf.write_raw(main_only, family, weights, config)
            main = load_main(main_only)
            tokenizer = AutoTokenizer.from_pretrained(str(main_only))
            torch.manual_seed(head_seed)
            head = make_head(main, head_seed)
            train, held = training_data(main, tokenizer, np.random.default_rng(head_seed))
            training = train_head(main, head, train, held, head_seed)
            print(f"  {training}", flush=True)
            tensors = head_tensors(head, family)
            write_checkpoint(MODELS / name, family, {**weights, **tensors}, config)
            record(name, family, main, head, tokenizer, training, (main_seed, head_seed))
            if family == "qwen3_5":
                dense_head = tensors
        mlx_twin(MODELS / "qwen3.5-mtp-tiny-hf", MODELS / MLX_NAME, dense_head)
    for name in list(FIXTURES) + [MLX_NAME]:
        size = sum(f.stat().st_size for f in (MODELS / name).iterdir())
        print(f"{name}: {size} bytes")


if __name__ == "__main__":
    main()
