#!/usr/bin/env bash
# The chunked gated delta kernels (kernels/gated_delta_chunk.cu, three passes) on the GPU
# machine, in one device call (~3 min): build both GDN kernels to PTX with the device's nvcc (as
# candle loads them), check the chunk passes with the host's chunk/tail split against a float64
# recurrence, and time them (together and each pass alone) at T = 512 and 4096 against our
# recurrence kernel, fla's chunk_gated_delta_rule and a PyTorch version of the chunk algorithm
# (scripts/gpu/gdn_chunk_cuda.py).
#
# From the dev box (fla-core is pure Python/Triton; its wheel travels with the call):
#   python3 -m pip download fla-core==0.6.0 --no-deps -d gpu-artefacts/wheels
#   run tool: carry ["gpu-artefacts/wheels"], command: bash scripts/gpu/bench-chunk.sh
# Logs land in $OUT (or gpu-artefacts/out); the last lines are the table and RESULT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-artefacts/out}
ART=gpu-artefacts/build
mkdir -p "$ART" "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"
if ls gpu-artefacts/wheels/fla_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    gpu-artefacts/wheels/*.whl && export PYTHONPATH=/tmp/site
fi
nvcc -ptx -arch=sm_90 -O3 -I kernels kernels/gated_delta_chunk.cu -o "$ART/gated_delta_chunk.ptx" || exit 1
nvcc -ptx -arch=sm_90 -O3 kernels/gated_delta.cu -o "$ART/gated_delta.ptx" || exit 1
nvcc -cubin -arch=sm_90 -O3 -I kernels -Xptxas -v kernels/gated_delta_chunk.cu -o "$ART/gated_delta_chunk.cubin" \
  2>"$OUT/ptxas_chunk.txt"
grep -E "registers|spill" "$OUT/ptxas_chunk.txt" | sort | uniq -c | head
PYTHONUNBUFFERED=1 python3 scripts/gpu/gdn_chunk_cuda.py --chunk-ptx "$ART/gated_delta_chunk.ptx" \
  --step-ptx "$ART/gated_delta.ptx" --out "$OUT"
