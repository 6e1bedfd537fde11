#!/usr/bin/env bash
# Build kernels/gated_delta.cu to PTX with the device's nvcc, check it against a float64
# reference and benchmark it against fla's Triton kernels. Runs ON the GPU machine.
#
# From the dev box (fla-core is pure Python/Triton; its wheel travels with the call):
#   python3 -m pip download fla-core==0.6.0 --no-deps -d gpu-artefacts/wheels
#   run tool: carry ["gpu-artefacts/wheels"], command: bash scripts/gpu/run.sh all
# Modes: check | bench | all. Logs and the PTX land in $OUT (or gpu-artefacts/out).
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-all}
OUT=${OUT:-gpu-artefacts/out}
ART=gpu-artefacts/build
mkdir -p "$ART" "$OUT"

{
  echo "== environment"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  nvcc --version | tail -2
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"

if ls gpu-artefacts/wheels/fla_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    gpu-artefacts/wheels/*.whl && export PYTHONPATH=/tmp/site
fi

echo "== build"
t0=$(date +%s)
# Exactly what candle will load (get_or_load_custom_func takes this PTX text).
nvcc -ptx -arch=sm_90 -O3 kernels/gated_delta.cu -o "$ART/gated_delta.ptx" &
p1=$!
# The same plus the sequential variant and an empty kernel, for the benchmark.
nvcc -ptx -arch=sm_90 -O3 -DGDN_BENCH_VARIANTS kernels/gated_delta.cu -o "$ART/gated_delta_bench.ptx" &
p2=$!
# Resource report and SASS (registers, spills, vector widths).
nvcc -cubin -arch=sm_90 -O3 -DGDN_BENCH_VARIANTS -Xptxas -v kernels/gated_delta.cu \
  -o "$ART/gated_delta.cubin" 2>"$OUT/ptxas.txt" &
p3=$!
rc=0
wait $p1 || rc=1
wait $p2 || rc=1
wait $p3 || rc=1
echo "nvcc: rc=$rc, $(($(date +%s) - t0)) s; PTX $(wc -c <"$ART/gated_delta.ptx") bytes"
[ $rc -eq 0 ] || { cat "$OUT/ptxas.txt"; exit 1; }
cp "$ART/gated_delta.ptx" "$OUT/"
grep -c "spill" "$OUT/ptxas.txt" >/dev/null && grep -E "bytes spill" "$OUT/ptxas.txt" | sort | uniq -c | head
cuobjdump -sass "$ART/gated_delta.cubin" >"$ART/sass.txt"
python3 - "$ART/sass.txt" <<'EOF' | tee "$OUT/sass_summary.txt"
import re, sys
funcs = {}
cur = None
for line in open(sys.argv[1]):
    m = re.search(r"Function : (\S+)", line)
    if m:
        cur = m.group(1); funcs[cur] = {}
        continue
    if cur:
        for op in ("LDG.E.128", "LDG.E.64", "LDG.E.U16", "LDG.E ", "STG.E.128", "STG.E.64", "LDL", "STL", "SHFL.BFLY"):
            if op in line:
                funcs[cur][op] = funcs[cur].get(op, 0) + 1
for f in sorted(funcs):
    if "_bf16_" in f or f == "gated_delta_step_f32_f32":
        print(f, funcs[f])
print("functions with local memory (LDL/STL):", [f for f in funcs if funcs[f].get("LDL") or funcs[f].get("STL")])
EOF

echo "== run ($MODE)"
PYTHONUNBUFFERED=1 python3 scripts/gpu/gdn_cuda.py --ptx "$ART/gated_delta_bench.ptx" \
  --ptx-plain "$ART/gated_delta.ptx" --mode "$MODE" --out "$OUT"
