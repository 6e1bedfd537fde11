#!/usr/bin/env bash
# The one-pass streamed products over 2..8 dense rows (`affine_stream_rows_*`) against the
# one-row kernel over T block rows, alone on the GPU machine (~2 min): kernels/affine_stream.cu
# to PTX with the device's nvcc, then scripts/gpu/affine_rows_cuda.py (bits and times).
#   bash scripts/gpu/affine-rows.sh      (from the repo root; logs in $OUT or gpu-artefacts/out)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-artefacts/out}
ART=/tmp/affine-rows-build
mkdir -p "$ART" "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/affine_stream.cu -o "$ART/affine_stream.ptx" || exit 1
timeout 300 python3 scripts/gpu/affine_rows_cuda.py --ptx "$ART/affine_stream.ptx" 2>&1 | tee "$OUT/affine_rows.txt"
