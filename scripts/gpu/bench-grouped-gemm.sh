#!/usr/bin/env bash
# The grouped quantized GEMM (kernels/affine_grouped.cu) alone on the GPU machine, in one device
# call (~2 min): build it to PTX with the device's nvcc (as candle loads it), print the compiler's
# resource report, then check and time it (scripts/gpu/grouped_gemm_cuda.py) at Qwen3-Next's MoE
# shapes against a torch reference and cuBLAS ceilings.
#
# OLD_CU=path/to/an/older/affine_grouped.cu adds that build to the same run (side by side; its
# geometry in OLD_GEOM, default the first kernel's: 128 threads, 64 rows per block, static
# shared memory). NEW_GEOM is the geometry of kernels/affine_grouped.cu (the host's, in
# crates/gdn-ops/src/ops/affine/cuda_grouped.rs).
#
# From the dev box, with the files under a carried folder (the run tool sends the lead's checkout):
#   run tool: carry ["gpu-artefacts/gemm"],
#   command: cd gpu-artefacts/gemm && OLD_CU=old/affine_grouped.cu bash scripts/gpu/bench-grouped-gemm.sh
# Logs land in $OUT (or gpu-artefacts/out); the last lines are the table and RESULT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-artefacts/out}
ART=/tmp/grouped-gemm-build
mkdir -p "$ART" "$OUT"
NEW_GEOM=${NEW_GEOM:-threads=256:tile_rows=128:smem=56320}
OLD_GEOM=${OLD_GEOM:-threads=128:tile_rows=64:smem=0}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/env.txt"
build() {  # name source
  local dir
  dir=$(dirname "$2")
  nvcc -ptx -arch=sm_90 -O3 -I kernels -I "$dir" "$2" -o "$ART/$1.ptx" || return 1
  nvcc -cubin -arch=sm_90 -O3 -I kernels -I "$dir" -Xptxas -v "$2" -o "$ART/$1.cubin" 2>"$OUT/ptxas_$1.txt"
  echo "== $1: ptxas (bf16_bf16 entry)"
  grep -A2 "affine_grouped_bf16_bf16" "$OUT/ptxas_$1.txt" | grep -E "registers|spill" | head -3
}
KERNELS=()
if [ -n "${OLD_CU:-}" ]; then
  build old "$OLD_CU" || exit 1
  KERNELS+=(--kernel "old:$ART/old.ptx:$OLD_GEOM")
fi
build new kernels/affine_grouped.cu || exit 1
KERNELS+=(--kernel "new:$ART/new.ptx:$NEW_GEOM")
PYTHONUNBUFFERED=1 python3 scripts/gpu/grouped_gemm_cuda.py "${KERNELS[@]}" --out "$OUT" ${GEMM_ARGS:-}
