"""mlx-vlm's separate drafter checkpoints of the tiny `qwen4_exp` head, made by **mlx-vlm 0.7.10's
own split** (`mlx_vlm.speculative.drafters.qwen4_exp_mtp.split`, what `mlx_vlm.convert --mtp`
runs), and their references from **mlx-vlm itself** loading those folders (`load_drafter`,
`Qwen4ExpMTPDraftModel`), run by mlx on the CPU in f32.

Run as `WITH_TORCH=1 bash scripts/gen-fixtures.sh --only qwen4_exp_drafter` after
gen_fixture_qwen4_exp_mtp.py (it splits that fixture's trained head). Writes only:

  models/mtp/qwen4-exp-mtp-tiny-drafter-bf16/    split(source): config.json
                                                 (`model_type: qwen4_exp_mtp`, the main
                                                 model's text_config), model.safetensors
                                                 (keys without `mtp.`, `switch_mlp` stacks),
                                                 the tokenizer files
  models/mtp/qwen4-exp-mtp-tiny-drafter-4bit/    split(source, q_bits=4): mlx affine 4-bit,
                                                 group 64, where a tensor's width splits into
                                                 groups (the router gate kept), `quantization`
                                                 in config.json
  models/mtp/reference/qwen4-exp-mtp-tiny-drafter-{bf16,4bit}.safetensors / .json

The split's source is the HF head of models/mtp/qwen4-exp-mtp-tiny-hf with its experts fused
(`experts.gate_up_proj` [E, 2I, H], gate first, and `experts.down_proj`): mlx-vlm 0.7.10 stacks
experts into `switch_mlp` only from that layout (or the official FP8 per-expert one, through
`convert_qwen4_exp_fp8_weights`); a bf16 per-expert source keeps its per-expert keys, which its
own drafter then cannot load. The values are the same bf16 numbers either way.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

import gen_fixtures as gf
import gen_fixture_qwen4_exp_mtp as mtpfix

import mlx.core as mx

HF = gf.MODELS / "mtp" / "qwen4-exp-mtp-tiny-hf"
REF = gf.MODELS / "mtp" / "reference"
HF_REF = REF / "qwen4-exp-mtp-tiny-hf.safetensors"
OUTS = {"bf16": {}, "4bit": {"q_bits": 4}}


def fused_source(folder: Path) -> None:
    """The HF head's `mtp.*` tensors with the experts fused, and the main config."""
    head = {k: v for k, v in mx.load(str(HF / "model.safetensors")).items() if k.startswith("mtp.")}
    experts = sorted(
        {int(k.split(".experts.")[1].split(".")[0]) for k in head if ".experts." in k}
    )
    mlp = "mtp.layers.0.mlp.experts"
    stack = lambda proj: mx.stack([head.pop(f"{mlp}.{e}.{proj}.weight") for e in experts])
    gate, up, down = stack("gate_proj"), stack("up_proj"), stack("down_proj")
    head[f"{mlp}.gate_up_proj"] = mx.concatenate([gate, up], axis=-2)
    head[f"{mlp}.down_proj"] = down
    mx.save_safetensors(str(folder / "model.safetensors"), head, metadata={"format": "pt"})
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(HF / name, folder / name)


def f32_copy(model) -> None:
    """The loaded drafter computed in f32 (mlx's CPU GatherMM is f32 only): every float
    parameter cast, the packed quantized weights as they are."""
    from mlx.utils import tree_flatten, tree_unflatten

    params = [
        (k, v.astype(mx.float32) if v.dtype in (mx.bfloat16, mx.float16) else v)
        for k, v in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())


def main() -> None:
    model_mod, ModelConfig, _ = mtpfix.import_mlx_vlm()
    from mlx_vlm.speculative.drafters import load_drafter
    from mlx_vlm.speculative.drafters.qwen4_exp_mtp.split import split_qwen4_exp_mtp

    model, _ = mtpfix.load_main(model_mod, ModelConfig)
    lm = model.language_model
    ref = mx.load(str(HF_REF))
    ids = np.array(ref["ids"])
    streams, _ = mtpfix.streams_of(lm, ids)
    hf_logits = ref["head_logits"]
    at, k = int(np.array(ref["chain_at"])[0]), len(np.array(ref["chain_tokens"]))

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp)
        fused_source(source)
        for tag, quant in OUTS.items():
            name = f"qwen4-exp-mtp-tiny-drafter-{tag}"
            out = gf.MODELS / "mtp" / name
            if out.exists():
                shutil.rmtree(out)
            split_qwen4_exp_mtp(str(source), str(out), **quant)
            head, kind = load_drafter(str(out))
            f32_copy(head)
            head.bind(model)
            logits, _ = mtpfix.head_logits(head, streams[None], mx.array(ids[None]))
            logits = logits[0]
            margins = mtpfix.selection_margins(head, streams, ids)
            tokens, chain_logits = mtpfix.chain(head, model, ids, streams, at, k)
            scale = float(mx.abs(logits).max())
            top2 = mx.sort(logits, axis=-1)[:, -2:]
            config = json.loads((out / "config.json").read_text())
            meta = {
                "checkpoint": name,
                "split": f"mlx-vlm 0.7.10 split_qwen4_exp_mtp(source, out, **{quant})",
                "quantization": config.get("quantization"),
                "mlx_version": mx.__version__,
                "reference": f"mlx-vlm 0.7.10 load_drafter({name}) (kind {kind}), float parameters in f32, bound to its qwen4_exp Model of qwen4-exp-mtp-tiny-hf in f32, CPU",
                "ids": "qwen4-exp-mtp-tiny-hf.safetensors' ids",
                "head_logits": "head logits of the pair (streams[i], ids[i+1]) at position i, every pair in one causal call, on mlx-vlm's streams",
                "chain": f"mlx-vlm draft_block (greedy) after prefill_from_target_hidden over the pairs up to position {at}",
                "head_max_abs_logit": scale,
                "vs_hf_head_rel": float(mx.abs(logits - hf_logits).max()) / scale,
                "head_min_top2_margin": round(float((top2[:, 1] - top2[:, 0]).min()), 5),
                "head_tied_rows": [int(i) for i in np.nonzero(margins < 1e-4)[0]],
                "chain_at": at,
            }
            mx.save_safetensors(
                str(REF / f"{name}.safetensors"),
                {
                    "ids": mx.array(ids.astype(np.int64)),
                    "streams": streams.astype(mx.float32),
                    "head_logits": logits.astype(mx.float32),
                    "chain_at": mx.array([at], dtype=mx.int64),
                    "chain_tokens": mx.array(np.array(tokens, dtype=np.int64)),
                    "chain_logits": chain_logits.astype(mx.float32),
                    "head_selection_margins": mx.array(margins),
                },
            )
            (REF / f"{name}.json").write_text(json.dumps(meta, indent=2) + "\n")
            print(f"[{tag}] vs HF head {meta['vs_hf_head_rel']:.2e}, tied {meta['head_tied_rows']}, chain {tokens}", flush=True)


if __name__ == "__main__":
    main()
