#!/usr/bin/env bash
# The kernels of one decode step, measured by Nsight Compute (ncu) on the GPU machine: every
# launch of a short eager `qwen-gdn bench` (QWEN_GDN_CUDA_GRAPH=0, so that each kernel is its
# own launch) with its device time, DRAM bytes, grid and block; the last decode step is
# summarised per kernel kind by scripts/gpu/ncu_decode.py ($OUT/ncu-decode.txt, printed last).
# ncu runs with --clock-control none (the card's own clocks, as a benchmark sees them) and
# --cache-control all (caches flushed before each kernel: a decode step's 2.2 GB of weights
# never stay in the 50 MB L2, though its small activations would). CACHE=none keeps the caches
# as the step leaves them: closer to the graph's times for kernels that read what the kernel
# before them wrote.
#
#   run tool: carry ["gpu-artefacts/cuda", "gpu-artefacts/full-skeleton"],
#             command: bash scripts/gpu/profile-decode-ncu.sh
# CKPT (default /tmp/qwen3-next-80b-a3b-4bit) is written first if missing; BW (bytes/s, the
# copy bandwidth for the % column) defaults to 2.9e12.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/common.sh
CKPT=${CKPT:-/tmp/qwen3-next-80b-a3b-4bit}
BW=${BW:-2.9e12}
if [ ! -f "$CKPT/config.json" ]; then
  python3 scripts/gpu/full_checkpoint.py write --skeleton gpu-artefacts/full-skeleton --out "$CKPT" \
    --layers 48 --experts 512 >"$OUT/checkpoint.log" 2>&1 || { tail -5 "$OUT/checkpoint.log"; exit 1; }
fi
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine" >&2; exit 1; }
t0=$SECONDS
QWEN_GDN_CUDA_GRAPH=0 "$ncu" --clock-control none --cache-control "${CACHE:-all}" --csv --print-units base \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --log-file "$OUT/ncu.csv" \
  "$bin/qwen-gdn" bench --model "$CKPT" --device cuda -p ${P:-8} -g ${G:-2} -r 1 \
  >"$OUT/ncu-bench.out" 2>"$OUT/ncu-bench.err"
echo "ncu: rc=$? in $((SECONDS - t0)) s"
python3 scripts/gpu/ncu_decode.py "$OUT/ncu.csv" --bandwidth "$BW" --rows >"$OUT/ncu-decode.txt" 2>&1
sed -n '1,40p' "$OUT/ncu-decode.txt"
