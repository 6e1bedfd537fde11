#!/usr/bin/env bash
# The GPU benchmark (issue 6), run ON the GPU machine. One device call (~8 min on an H100):
#   on the dev box, once:  bash scripts/gpu/build-cuda.sh
#                          python3 -m pip download fla-core==0.6.0 --no-deps -d gpu-artefacts/wheels
#                          bash scripts/gen-bench-checkpoints.sh --family qwen3-next
#                          python3 scripts/gpu/full_checkpoint.py skeleton \
#                            --template build/bench-models/qwen3-next-bench-4bit --out gpu-artefacts/full-skeleton
#   run tool: carry ["gpu-artefacts/cuda", "gpu-artefacts/wheels", "gpu-artefacts/full-skeleton"],
#             command: bash scripts/gpu/bench-cuda.sh
# 1. Kernels (scripts/gpu/run.sh bench): the GDN decode step at Qwen3-Next-80B shapes (B 1 and
#    4, f32 and bf16 state) against the bytes floor at the measured copy bandwidth and against
#    fla's fused_recurrent_gated_delta_rule; prefill T 512 and 4096 against fla's
#    chunk_gated_delta_rule. CUDA events / CUDA graphs, medians after warm-up, random data.
# 2. End to end: a random 4-bit checkpoint at the full Qwen3-Next-80B-A3B size (48 layers, 512
#    experts, top-10, ~45 GB; scripts/gpu/full_checkpoint.py write) on the device's disk, then
#    `qwen-gdn bench --device cuda -p $P -g $G -r $R`, the peak GPU memory (nvidia-smi, sampled),
#    and the decode roofline: bytes per decoded token (scripts/bench_vs_peers.py roofline) over
#    the 1 GiB device copy bandwidth.
# Logs go to $OUT; the last lines are the two tables. P, G, R, SKIP_KERNELS=1 and CKPT override.
# PS="512 4096" runs the end-to-end part for each prompt length on one written checkpoint (one
# table each); PROFILE=1 adds `bench --profile` (the time of each prefill phase, a table per
# prompt length, saved as $OUT/profile-p<P>.txt and printed last). PROFILE_DECODE=1 runs
# `bench --profile-decode` once more, on its own (its 1 GiB copy-bandwidth buffers stay out of
# the timed runs' peak memory), at depth PROFILE_DECODE_P (default: the first of PS): every
# kernel of one eager decode step, saved as $OUT/decode-profile.txt (and .json), printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/common.sh
P=${P:-512} G=${G:-128} R=${R:-3}
PS=${PS:-$P}
CKPT=${CKPT:-/tmp/qwen3-next-80b-a3b-4bit}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"

if [ "${SKIP_KERNELS:-0}" != 1 ]; then
  echo "== kernels: scripts/gpu/run.sh bench"
  OUT=$OUT/kernels bash scripts/gpu/run.sh bench >"$OUT/kernels.log" 2>&1 || echo "kernel bench failed (see kernels.log)"
fi

echo "== full-size checkpoint -> $CKPT"
python3 scripts/gpu/full_checkpoint.py write --skeleton gpu-artefacts/full-skeleton --out "$CKPT" \
  --layers 48 --experts 512 || exit 1
du -sh "$CKPT"

echo "== copy bandwidth (1 GiB device to device, read + write)"
bandwidth=$(python3 - <<'PY'
import statistics, torch
n = 1 << 30
src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
times = []
for i in range(23):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); dst.copy_(src); b.record(); b.synchronize()
    if i >= 3:
        times.append(a.elapsed_time(b) / 1e3)
print(2 * n / statistics.median(times))
PY
)
echo "copy bandwidth: $(python3 -c "print(f'{$bandwidth / 1e9:.0f}')") GB/s"

for P in $PS; do
# Decode variants, each one bench run on the same checkpoint (VARIANTS overrides):
#   graph    fused decode kernels, the step replayed as a CUDA graph (the default);
#   eager    fused decode kernels, launched one by one (QWEN_GDN_CUDA_GRAPH=0);
#   composed the composed ops the fused kernels replace (--composed-decode).
VARIANTS=${VARIANTS:-graph}
for variant in $VARIANTS; do
  case $variant in
    graph) extra=(); envs=() ;;
    eager) extra=(); envs=(QWEN_GDN_CUDA_GRAPH=0) ;;
    composed) extra=(--composed-decode); envs=(QWEN_GDN_CUDA_GRAPH=0) ;;
    *) echo "unknown variant $variant" >&2; exit 1 ;;
  esac
  echo "== [$variant] qwen-gdn bench --device cuda -p $P -g $G -r $R ${extra[*]}"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >"$OUT/gpu_mem.txt" &
  smi=$!
  t0=$SECONDS
  [ "${PROFILE:-0}" = 1 ] && [ "$variant" = graph ] && extra+=(--profile)
  env "${envs[@]}" "$bin/qwen-gdn" bench --model "$CKPT" --device cuda -p "$P" -g "$G" -r "$R" \
    "${extra[@]}" --json >"$OUT/bench-$variant.json" 2>"$OUT/bench-$variant.err"
  rc=$?
  kill $smi 2>/dev/null
  echo "bench [$variant]: rc=$rc in $((SECONDS - t0)) s (loading included)"
  [ $rc -eq 0 ] || { tail -5 "$OUT/bench-$variant.err"; exit 1; }
  cp "$OUT/bench-$variant.json" "$OUT/bench.json"
  cp "$OUT/bench-$variant.json" "$OUT/bench-$variant-p$P.json"
  if grep -q "^prefill profile" "$OUT/bench-$variant.err"; then
    awk '/^decode profile/{exit} /^prefill profile/{on=1} on' "$OUT/bench-$variant.err" >"$OUT/profile-p$P.txt"
  fi
done
python3 scripts/bench_vs_peers.py roofline --model "$CKPT" --context $((P + G / 2)) >"$OUT/roofline.json"

VARIANTS=$VARIANTS python3 - "$OUT" "$bandwidth" <<'PY'
import json, sys
out, bw = sys.argv[1], float(sys.argv[2])
import os
variants = os.environ.get("VARIANTS", "graph").split()
b = json.load(open(f"{out}/bench.json"))
r = json.load(open(f"{out}/roofline.json"))
mem = max((int(l) for l in open(f"{out}/gpu_mem.txt") if l.strip().isdigit()), default=0)
roof = bw / r["bytes_per_token"]
tg, pp = b["generation_tps"], b["prompt_tps"]
print()
print(f"Qwen3-Next-80B-A3B shapes, random 4-bit (mlx-community layout), {r['stored_bytes'] / 1e9:.1f} GB, "
      f"{r['layers']} layers, {r['experts']} experts, top-{r['top_k']}; GDN state {b['gdn_state_dtype']}")
print(f"| test | qwen-gdn t/s (median, min-max over {b['repetitions']}) | roofline t/s | of roofline |")
print("|---|---|---|---|")
print(f"| pp{b['prompt_tokens']} | {pp['median']:.1f} ({pp['min']:.1f}-{pp['max']:.1f}) | | |")
for v in variants:
    bv = json.load(open(f"{out}/bench-{v}.json"))
    tv = bv["generation_tps"]
    print(f"| tg{bv['gen_tokens']} [{v}] | {tv['median']:.1f} ({tv['min']:.1f}-{tv['max']:.1f}) | {roof:.0f} | {tv['median'] / roof * 100:.1f}% |")
print(f"decode bytes/token {r['bytes_per_token'] / 1e6:.1f} MB (weights {r['weights_total'] / 1e6:.1f} MB); "
      f"copy bandwidth {bw / 1e9:.0f} GB/s; peak GPU memory {mem / 1024:.1f} GiB; "
      f"peak host RSS {b['peak_memory_bytes'] / 1e9:.1f} GB")
PY
done

if [ "${PROFILE_DECODE:-0}" = 1 ]; then
  DP=${PROFILE_DECODE_P:-${PS%% *}}
  echo "== qwen-gdn bench --device cuda -p $DP -g 1 -r 1 --profile-decode"
  t0=$SECONDS
  "$bin/qwen-gdn" bench --model "$CKPT" --device cuda -p "$DP" -g 1 -r 1 --profile-decode \
    --json >"$OUT/decode-profile.json" 2>"$OUT/decode-profile.err"
  rc=$?
  echo "bench --profile-decode: rc=$rc in $((SECONDS - t0)) s (loading included)"
  if [ $rc -eq 0 ]; then
    sed -n '/^decode profile/,$p' "$OUT/decode-profile.err" >"$OUT/decode-profile.txt"
  else
    tail -5 "$OUT/decode-profile.err"
  fi
fi

if [ -s "$OUT/kernels.log" ]; then
  echo
  echo "== kernel table"
  tail -n 30 "$OUT/kernels.log"
fi
for f in "$OUT"/profile-p*.txt; do
  [ -f "$f" ] && { echo; cat "$f"; }
done
if [ -s "$OUT/decode-profile.txt" ]; then
  echo
  cat "$OUT/decode-profile.txt"
fi
