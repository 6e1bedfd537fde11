#!/usr/bin/env bash
# Decode/prefill of several qwen-gdn builds on ONE GPU machine, in one call (a comparison is
# only valid on one machine: lent cards differ by a few percent). Run on the GPU machine:
#   here: PACK=qwen-gdn bash scripts/gpu/build-cuda.sh; mkdir gpu-artefacts/ab-<name>;
#         cp gpu-artefacts/cuda/qwen-gdn.xz gpu-artefacts/ab-<name>/   (one folder per build)
#   run tool: carry ["gpu-artefacts/ab-<a>", "gpu-artefacts/ab-<b>", "gpu-artefacts/full-skeleton"],
#     command: RUNS="a:-:512:2 b:-:512:2 b:QWEN_GDN_CUDA_GRAPH=0:512:1" bash scripts/gpu/ab-bench.sh
# RUNS: "name:envs:P:R ..." (envs as VAR=VAL,VAR=VAL, or -), each one
# `qwen-gdn bench --device cuda -p P -g 128 -r R` on the full-size random checkpoint (written
# once per machine from the skeleton, as bench-cuda.sh does); prints pp and tg medians.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-artefacts/out}
mkdir -p "$OUT"
CKPT=/tmp/qwen3-next-80b-a3b-4bit
nv=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])")
export LD_LIBRARY_PATH=$nv/cu13/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader
for d in gpu-artefacts/ab-*; do n=${d#gpu-artefacts/ab-}; mkdir -p /tmp/ab/$n; xz -dc $d/qwen-gdn.xz >/tmp/ab/$n/qwen-gdn; chmod +x /tmp/ab/$n/qwen-gdn; done
[ -f $CKPT/config.json ] || python3 scripts/gpu/full_checkpoint.py write --skeleton gpu-artefacts/full-skeleton --out "$CKPT" --layers 48 --experts 512 >/dev/null || exit 1
for run in $RUNS; do
  IFS=: read -r name envs P R <<<"$run"
  e=(); [ "$envs" != - ] && IFS=, read -ra e <<<"$envs"
  env "${e[@]}" /tmp/ab/$name/qwen-gdn bench --model $CKPT --device cuda -p $P -g 128 -r $R --json >$OUT/$name-$P-${envs//[=,]/_}.json 2>$OUT/$name-$P.err
  python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); print(sys.argv[2], "pp %.1f tg %.1f %s" % (b["prompt_tps"]["median"], b["generation_tps"]["median"], [round(x,1) for x in b["generation_tps"]["samples"]]))' "$OUT/$name-$P-${envs//[=,]/_}.json" "$run" || tail -3 $OUT/$name-$P.err
done
