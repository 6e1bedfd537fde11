#!/usr/bin/env bash
# The grouped quantized GEMM (kernels/affine_grouped.cu) alone on the GPU machine, in one device
# call (~2 min): build it to PTX with the device's nvcc (as candle loads it), print the compiler's
# resource report, then check and time it (scripts/gpu/grouped_gemm_cuda.py) at Qwen3-Next's MoE
# shapes against a torch reference and cuBLAS ceilings.
#
# OLD_CU=path/to/an/older/affine_grouped.cu adds that build to the same run (side by side; its
# geometry in OLD_GEOM, default the first kernel's: 128 threads, 64 rows per block, static
# shared memory); OLDER_CU (geometry OLDER_GEOM) a second one. NEW_GEOM is the geometry of
# kernels/affine_grouped.cu (the host's, in crates/gdn-ops/src/ops/affine_grouped/cuda.rs).
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
NEW_GEOM=${NEW_GEOM:-threads=256:tile_rows=128:smem=55296}
OLD_GEOM=${OLD_GEOM:-threads=128:tile_rows=64:smem=0}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/env.txt"
build() {  # name source [nvcc flags]
  local dir
  dir=$(dirname "$2")
  nvcc -ptx -arch=sm_90 -O3 ${3:-} -I kernels -I "$dir" "$2" -o "$ART/$1.ptx" || return 1
  [ "${PTXAS:-1}" = 1 ] || return 0  # PTXAS=0: no resource report (half the build time)
  nvcc -cubin -arch=sm_90 -O3 ${3:-} -I kernels -I "$dir" -Xptxas -v "$2" -o "$ART/$1.cubin" 2>"$ART/ptxas_$1.txt"
  echo "== $1: ptxas (bf16_bf16 entry)"
  grep -A3 "entry function 'affine_grouped_bf16_bf16'" "$ART/ptxas_$1.txt" | grep -E "registers|spill" | head -3
}
# The builds run side by side (nvcc is single-threaded), each logging to its own file.
KERNELS=() PIDS=()
if [ -n "${OLD_CU:-}" ]; then
  build old "$OLD_CU" >"$ART/build_old.txt" 2>&1 & PIDS+=($!)
  KERNELS+=(--kernel "old:$ART/old.ptx:$OLD_GEOM")
fi
if [ -n "${OLDER_CU:-}" ]; then
  build older "$OLDER_CU" >"$ART/build_older.txt" 2>&1 & PIDS+=($!)
  KERNELS+=(--kernel "older:$ART/older.ptx:${OLDER_GEOM:-$NEW_GEOM}")
fi
build new kernels/affine_grouped.cu >"$ART/build_new.txt" 2>&1 & PIDS+=($!)
KERNELS+=(--kernel "new:$ART/new.ptx:$NEW_GEOM")
for v in ${VARIANTS:-}; do
  IFS=: read -r vname vflags vsmem <<<"$v"
  build "$vname" kernels/affine_grouped.cu "$vflags" >"$ART/build_$vname.txt" 2>&1 & PIDS+=($!)
  geom=$NEW_GEOM
  [ -n "$vsmem" ] && geom=${NEW_GEOM%%:smem=*}:smem=$vsmem
  KERNELS+=(--kernel "$vname:$ART/$vname.ptx:$geom")
done
FAILED=0
for pid in "${PIDS[@]}"; do wait "$pid" || FAILED=1; done
cat "$ART"/build_*.txt
[ "$FAILED" = 0 ] || { echo "a build failed"; exit 1; }
PYTHONUNBUFFERED=1 python3 scripts/gpu/grouped_gemm_cuda.py "${KERNELS[@]}" --out "$OUT" ${GEMM_ARGS:-}
