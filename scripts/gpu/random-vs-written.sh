#!/usr/bin/env bash
# Issue 31 item 4, shown once: `bench --config <config.json> --random-weights` measures what a
# written checkpoint of the same shapes measures, within run-to-run noise. Run ON the GPU
# machine (one call, ~6 min on an H200):
#   here: PACK=qwen-gdn bash scripts/gpu/build-cuda.sh
#   run tool: carry ["gpu-artefacts/cuda", "gpu-artefacts/full-skeleton"],
#             command: bash scripts/gpu/random-vs-written.sh
# The written checkpoint is the full-size random 80B one of bench-cuda.sh (written once per
# machine from the skeleton); the random model is built from that checkpoint's own config.json,
# so both declare the same quantized layouts. Written and random runs alternate ROUNDS times
# (the card's clocks drift over a call); then one random run of the release config
# (tests/data/configs), whose layouts mlx's conversion declares per module.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/common.sh
P=${P:-512} G=${G:-128} R=${R:-3} ROUNDS=${ROUNDS:-2}
CKPT=${CKPT:-/tmp/qwen3-next-80b-a3b-4bit}
nvidia-smi --query-gpu=name --format=csv,noheader
[ -f $CKPT/config.json ] || python3 scripts/gpu/full_checkpoint.py write --skeleton gpu-artefacts/full-skeleton \
  --out "$CKPT" --layers 48 --experts 512 >/dev/null || exit 1
show() {
  python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); print("%-28s pp%s %.1f  tg%s %.1f  %s" % (sys.argv[2], b.get("prompt_tokens", ""), b["prompt_tps"]["median"], b.get("generation_tokens", ""), b["generation_tps"]["median"], [round(x,1) for x in b["generation_tps"]["samples"]]))' "$1" "$2" || tail -3 "${1%.json}.err"
}
for i in $(seq "$ROUNDS"); do
  $bin/qwen-gdn bench --device cuda --model $CKPT -p $P -g $G -r $R --json >$OUT/written-$i.json 2>$OUT/written-$i.err
  show $OUT/written-$i.json "written $i"
  $bin/qwen-gdn bench --device cuda --config $CKPT/config.json --random-weights -p $P -g $G -r $R --json \
    >$OUT/random-$i.json 2>$OUT/random-$i.err
  show $OUT/random-$i.json "random $i"
done
$bin/qwen-gdn bench --device cuda --config tests/data/configs/qwen3-next-80b-a3b-instruct-4bit.json --random-weights \
  -p $P -g $G -r $R --json >$OUT/random-release.json 2>$OUT/random-release.err
show $OUT/random-release.json "random, release config"
