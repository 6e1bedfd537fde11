#!/usr/bin/env bash
# Nsight Compute's detail sections (speed of light, memory workload, warp states, occupancy,
# launch statistics) for the decode kernels named by KERNELS (an ncu regex), at a context depth
# of P prompt tokens: where a kernel's time goes, rather than how long it takes. Eager launches
# (QWEN_GDN_CUDA_GRAPH=0), the card's own clocks, caches as the step leaves them.
#   run tool: carry ["gpu-artefacts/ab-<build>", "gpu-artefacts/skel"],
#             command: BUILD=<build> P=16384 KERNELS='attn_decode_split' bash scripts/gpu/ncu-kernels.sh
# Writes $OUT/ncu-details-<build>-<P>.txt; prints its summary lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-artefacts/out}
mkdir -p "$OUT" gpu-artefacts/full-skeleton /tmp/ab
CKPT=/tmp/qwen3-next-80b-a3b-4bit
BUILD=${BUILD:?which gpu-artefacts/ab-<build>} P=${P:-16384} KERNELS=${KERNELS:-attn_decode_split}
nv=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])")
export LD_LIBRARY_PATH=$nv/cu13/lib:${LD_LIBRARY_PATH:-}
cp gpu-artefacts/skel/*.json gpu-artefacts/skel/*.jinja gpu-artefacts/full-skeleton/
xz -dc gpu-artefacts/skel/tokenizer.json.xz >gpu-artefacts/full-skeleton/tokenizer.json
xz -dc "gpu-artefacts/ab-$BUILD/qwen-gdn.xz" >/tmp/ab/qwen-gdn-$BUILD && chmod +x /tmp/ab/qwen-gdn-$BUILD
[ -f $CKPT/config.json ] || python3 scripts/gpu/full_checkpoint.py write --skeleton gpu-artefacts/full-skeleton \
  --out "$CKPT" --layers 48 --experts 512 >/dev/null || exit 1
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
report=/tmp/ncu-$BUILD-$P
QWEN_GDN_CUDA_GRAPH=0 "$ncu" --clock-control none --cache-control none \
  --kernel-name "regex:$KERNELS" --launch-skip ${SKIP:-12} --launch-count ${COUNT:-4} \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section LaunchStats --section SchedulerStats -f -o "$report" \
  /tmp/ab/qwen-gdn-$BUILD bench --model "$CKPT" --device cuda -p "$P" -g 3 -r 1 \
  >"$OUT/ncu-kernels.out" 2>&1
echo "ncu: rc=$?"
"$ncu" -i "$report.ncu-rep" --page details --print-units base >"$OUT/ncu-details-$BUILD-$P.txt" 2>&1
grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|L1/TEX Hit|L2 Hit|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|One or More" \
  "$OUT/ncu-details-$BUILD-$P.txt" | head -80
