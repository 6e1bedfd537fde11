"""The mlx-vlm 4-bit layout of `qwen4_exp`: models/qwen4-exp-tiny-4bit and its references.

Run as `WITH_TORCH=1 bash scripts/gen-fixtures.sh --only qwen4_exp_mlx` (it needs torch and
the mlx-vlm wheel). Writes only:

  models/qwen4-exp-tiny-4bit/                   what `mlx_vlm.convert -q` writes (4-bit g64)
  models/reference/qwen4-exp-tiny-4bit.safetensors / .json

Steps, per candidate seed:
  1. a raw HF source checkpoint made by gen_fixture_qwen4_exp.build_raw with four dimensions
     widened (below), into a temporary folder;
  2. converted by **mlx-vlm 0.7.10's own code** (its qwen4_exp `Model.sanitize`,
     `quant_predicate` / `cast_predicate`, `quant_utils.quantize_model`, `utils.save_weights`,
     the same calls as `mlx_vlm.convert(quantize=True)` makes) with 4 bits, group 64.
     mlx-vlm is imported module by module from its wheel (installed `--no-deps`), with stand-ins
     for the image/audio/HTTP packages its utils import but the conversion never calls;
  3. the converted weights dequantized (mx.dequantize with f32 scales and biases) and written
     back in the raw HF layout in f32, and transformers 5.23.0 run on them in fp32: the
     reference. mlx-vlm itself cannot run the model here (its generate/cache stack needs the
     full package), so the reference is transformers on the dequantized weights.

Why the source is not models/qwen4-exp-tiny-hf itself: mlx-vlm quantizes a linear (or an
n-gram table shard) only when its input width divides the group size, after its fallback to
group 32 for the tables. The tiny HF fixture's 16-wide table rows, rank-32 hyper-connection
up-projections and 32-wide expert down-projections would all stay bf16, so the quantized
table rows (the release's 160-wide rows are 4-bit group 32) and 4-bit down-projections would
not be exercised. Widening PLE_DIM to 128 (32-wide rows: group 64 does not divide them, the
group-32 fallback does, exactly the release's case), HC_RANK to 64 and IM/IS to 64 makes every
linear 4-bit as in the release.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import json
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

import gen_fixtures as gf
import gen_fixture_qwen4_exp as hf

import mlx.core as mx

NAME = "qwen4-exp-tiny-4bit"
# The dimensions that differ from models/qwen4-exp-tiny-hf (see the module docstring).
WIDENED = {"PLE_DIM": 128, "HC_RANK": 64, "IM": 64, "IS": 64}
Q_GROUP, Q_BITS = 64, 4  # mlx_vlm.convert's defaults (-q)
# The first seed whose decisions all have margins (gen_fixture_qwen4_exp.record); 2001..2006
# fail them (QSA score ties at the top-k cut-off, close top-2 logits), so the search starts here.
SEEDS = range(2007, 2100)
# Packages mlx_vlm.utils imports at module level for images, audio and HTTP; the conversion
# path never calls them.
STUBBED = ("PIL", "cv2", "requests", "soundfile", "scipy", "mlx_audio", "fastapi")


@contextlib.contextmanager
def widened_dims():
    saved = {k: getattr(hf, k) for k in WIDENED}
    for k, v in WIDENED.items():
        setattr(hf, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(hf, k, v)


# ----------------------------------------------------------------------------------------
# mlx-vlm, imported without its package __init__ (which imports generation, server, audio)
# ----------------------------------------------------------------------------------------
class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubMeta(name, (), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubMeta(name, (), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def import_mlx_vlm():
    """mlx_vlm.utils, mlx_vlm.quant_utils and the qwen4_exp model class, from the installed
    wheel (scripts/requirements-fixtures-mlx-vlm.txt)."""
    import importlib.util

    if "mlx_vlm" not in sys.modules:
        spec = importlib.util.find_spec("mlx_vlm")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(
                "mlx-vlm is not installed: WITH_TORCH=1 bash scripts/gen-fixtures.sh --only qwen4_exp_mlx"
            )
        package = types.ModuleType("mlx_vlm")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["mlx_vlm"] = package
        sys.meta_path.insert(0, _StubFinder())
    import mlx_vlm.quant_utils as quant_utils
    import mlx_vlm.utils as utils
    from importlib.metadata import version

    assert version("mlx-vlm") == "0.7.10", version("mlx-vlm")
    return utils, quant_utils


def convert_with_mlx_vlm(src: Path, out: Path) -> dict:
    """What `mlx_vlm.convert(hf_path=src, mlx_path=out, quantize=True)` does (convert.py),
    minus the processor (the tokenizer files are copied as the other fixtures do)."""
    from mlx.utils import tree_map_with_path

    utils, quant_utils = import_mlx_vlm()
    # strict=False: the source's vision tower is one stub tensor (as in qwen4-exp-tiny-hf); the
    # text model's weights are all checked below against the converted file.
    model = utils.load_model(src, lazy=True, strict=False)
    config = utils.load_config(src)
    model_quant_predicate = model.quant_predicate

    def base_quant_predicate(path, module):
        if utils.skip_multimodal_module(path):
            return False
        return model_quant_predicate(path, module)

    dtype = getattr(mx, config["text_config"]["dtype"])  # bfloat16
    cast_predicate = model.cast_predicate

    def set_dtype(k, v):
        if cast_predicate(k) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(dtype)
        return v

    model.update(tree_map_with_path(set_dtype, model.parameters()))
    config.setdefault("vision_config", {})
    model, config = quant_utils.quantize_model(
        model, config, Q_GROUP, Q_BITS, mode="affine", quant_predicate=base_quant_predicate
    )
    utils.save_weights(out, model, donate_weights=True)
    utils.save_config(config, config_path=out / "config.json")
    # Single shard: the index is redundant (as finish_converted does for mlx-lm fixtures).
    (out / "model.safetensors.index.json").unlink()
    # The vision tower mlx-vlm initialised (non-strict load) is not part of the text model:
    # keep one tensor, so that loaders are still shown a vision tensor to skip.
    weights = mx.load(str(out / "model.safetensors"))
    kept = {
        k: v
        for k, v in weights.items()
        if not k.startswith("vision_tower.") or k == "vision_tower.patch_embed.proj.weight"
    }
    mx.save_safetensors(str(out / "model.safetensors"), kept, metadata={"format": "mlx"})
    gf.copy_tokenizer_files("qwen3_5_moe", out)
    return config


# ----------------------------------------------------------------------------------------
# Back to the raw HF layout, dequantized, for transformers
# ----------------------------------------------------------------------------------------
def quant_params(config: dict, module: str) -> tuple[int, int]:
    spec = config["quantization"].get(module, config["quantization"])
    return spec["group_size"], spec["bits"]


def dequantized(folder: Path, config: dict) -> dict[str, np.ndarray]:
    """Every tensor of the converted checkpoint in f32 under its mlx name (quantized ones
    dequantized with f32 scales and biases, as the Rust loader computes them)."""
    weights = mx.load(str(folder / "model.safetensors"))
    out = {}
    for k, v in weights.items():
        if k.endswith((".scales", ".biases")):
            continue
        module = k[: -len(".weight")] if k.endswith(".weight") else None
        if module is not None and f"{module}.scales" in weights:
            g, bits = quant_params(config, module)
            v = mx.dequantize(
                v,
                weights[f"{module}.scales"].astype(mx.float32),
                weights[f"{module}.biases"].astype(mx.float32),
                group_size=g,
                bits=bits,
            )
        if v.dtype in (mx.bfloat16, mx.float16):
            v = v.astype(mx.float32)
        out[k] = np.array(v)
    return out


def to_hf_layout(weights: dict[str, np.ndarray], experts: int) -> dict[str, np.ndarray]:
    """Undo mlx-vlm's sanitize: key prefixes, stacked experts, `shards.j`, conv1d [C, K, 1]."""
    out = {}
    for k, v in weights.items():
        if k.startswith("language_model.model."):
            k = "model.language_model." + k[len("language_model.model.") :]
        elif k.startswith("language_model.lm_head"):
            k = k[len("language_model.") :]
        elif k.startswith("vision_tower."):
            k = "model.visual." + k[len("vision_tower.") :]
        k = k.replace(".ngram_embedding.shards.", ".ngram_embedding.shard_")
        if "conv1d.weight" in k:
            v = np.swapaxes(v, 1, 2)
        if ".switch_mlp." in k:
            prefix, rest = k.split(".switch_mlp.")
            assert v.shape[0] == experts, (k, v.shape)
            for e in range(experts):
                out[f"{prefix}.experts.{e}.{rest}"] = np.ascontiguousarray(v[e])
            continue
        out[k] = np.ascontiguousarray(v)
    return out


def write_hf_f32(folder: Path, weights: dict[str, np.ndarray]) -> None:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    tensors = {k: torch.from_numpy(weights[k]) for k in sorted(weights)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = hf.config()
    config["text_config"]["dtype"] = "float32"
    gf.write_json(folder / "config.json", config)
    gf.copy_tokenizer_files("qwen3_5_moe", folder)


def fingerprints(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per float tensor of the converted checkpoint (mlx names, dequantized): the f64 sums of
    each row and of each column of its last two axes (experts and conv taps folded into rows).
    Small enough to ship, and any wrong value, scale, group, row order or transpose shows."""
    out = {}
    for k, v in weights.items():
        if not np.issubdtype(v.dtype, np.floating):
            continue
        m = v.astype(np.float64).reshape(-1, v.shape[-1]) if v.ndim > 1 else v.astype(np.float64)[None]
        out[f"deq_rows.{k}"] = m.sum(axis=1)
        out[f"deq_cols.{k}"] = m.sum(axis=0)
    return out


def generate(tokenizer) -> None:
    import torch
    from safetensors.torch import save_file

    folder = gf.MODELS / NAME
    for seed in SEEDS:
        with tempfile.TemporaryDirectory(prefix="qwen4-exp-mlx-") as tmp:
            tmp = Path(tmp)
            src, deq = tmp / "src-hf", tmp / "dequantized-hf"
            with widened_dims():
                hf.write_raw(src, hf.build_raw(seed))
                shutil.rmtree(folder, ignore_errors=True)
                config = convert_with_mlx_vlm(src, folder)
                weights = dequantized(folder, config)
                write_hf_f32(deq, to_hf_layout(weights, hf.EXPERTS))
                try:
                    result = hf.record(deq, tokenizer)
                except ValueError as e:
                    print(f"[qwen4_exp_mlx] seed {seed}: {e}")
                    continue
        tensors = dict(result["tensors"])
        for k, v in fingerprints(weights).items():
            tensors[k] = torch.from_numpy(v)
        # The 256 FP8 e4m3 codes as mlx decodes them (mx.from_fp8), for the FP8 table reader.
        codes = mx.arange(256).astype(mx.uint8)
        tensors["fp8_e4m3_values"] = torch.from_numpy(np.array(mx.from_fp8(codes, dtype=mx.float32)))
        tensors = {k: tensors[k].contiguous() for k in sorted(tensors)}
        gf.REF.mkdir(exist_ok=True)
        save_file(tensors, str(gf.REF / f"{NAME}.safetensors"), metadata={"format": "pt"})
        meta = result["meta"]
        meta.update(
            checkpoint=NAME,
            seed=seed,
            reference="transformers 5.23.0 AutoModelForCausalLM, float32, eager attention, CPU, "
            "on the DEQUANTIZED weights of the converted checkpoint (mlx-vlm cannot run here)",
            converter="mlx-vlm 0.7.10 (Model.sanitize, quant_predicate, quantize_model, save_weights), "
            f"{Q_BITS}-bit group {Q_GROUP}",
            source_dims_widened=WIDENED,
        )
        meta["notes"] = meta["notes"] + [
            "deq_rows.<mlx name> / deq_cols.<mlx name>: f64 row and column sums of every float "
            "tensor of the converted checkpoint, dequantized (f32 scales and biases) — the "
            "weights transformers ran on.",
            "fp8_e4m3_values [256]: mx.from_fp8 of every e4m3 code (the official FP8 table format).",
        ]
        gf.write_json(gf.REF / f"{NAME}.json", meta)
        print(f"[ref] {NAME}: seed {seed} {meta['stats']}")
        return
    raise SystemExit(f"[qwen4_exp_mlx] no seed in {SEEDS} gives clear margins")


def main() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SystemExit(
            "qwen4_exp references need torch: WITH_TORCH=1 bash scripts/gen-fixtures.sh --only qwen4_exp_mlx"
        )
    from transformers import AutoTokenizer

    mx.set_default_device(mx.cpu)
    tokenizer = AutoTokenizer.from_pretrained(str(gf.SHARED / "tokenizers" / "mini-qwen3.5"))
    generate(tokenizer)


if __name__ == "__main__":
    main()
