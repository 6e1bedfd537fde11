#!/usr/bin/env bash
# Builds the CUDA binaries here (no GPU, no CUDA toolkit needed) and packs them for the GPU
# machine: the recipe of ../shared/research/cuda-feasibility.md, automated.
#
#   bash scripts/gpu/build-cuda.sh        # ~10 min the first time (candle's CUDA kernels), ~2 min after
#   CHECK_ONLY=1 bash scripts/gpu/build-cuda.sh   # compile only, pack nothing
#   PACK="qwen-gdn cuda_moe device_plan" bash scripts/gpu/build-cuda.sh   # pack only these
#     (xz -9e of every binary takes ~8 min here; a call's carry holds ~6 of them anyway)
#
# 1. CUDA 13.0 nvcc, headers and libraries from PyPI wheels -> build/cuda/venv (1.2 GB, once).
#    13.0 exactly: the device's driver (CUDA 13.0) may reject PTX from a newer nvcc.
#    NCCL 2.28.3 from its wheel too (`--ranks N --device cuda`, the `nccl` feature): linked
#    here, the GPU host's libnccl.so.2 (2.28 there) loaded at run time.
# 2. A stub libcuda.so.1 and unversioned library names -> build/cuda/link, for linking only
#    (no wheel ships libcuda; on the GPU machine the real driver library is found instead).
# 3. CUDA_COMPUTE_CAP=90 (H100/H200), target dir build/cuda/target (kept between builds: candle's
#    MoE kernels take ~7 min to compile), `--features cuda`: the qwen-gdn binary and the
#    test binaries that run there (gdn-ops' cuda_* op tests, qwen-gdn-model's device_plan,
#    fused_decode, prompt_cache, grouped_moe, and qwen4_exp for its device-plan gates).
# 4. Stripped and xz-compressed into gpu-artefacts/cuda/ (ignored by git; ~5 MB each), which
#    the device call carries: scripts/gpu/test-cuda.sh unpacks and runs them.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
cuda=$root/build/cuda
mkdir -p "$cuda" gpu-artefacts/cuda

if [ ! -x "$cuda/venv/bin/pip" ]; then
  python3 -m venv "$cuda/venv"
fi
if [ ! -x "$cuda/venv/nvcc-ok" ]; then
  "$cuda/venv/bin/pip" install -q nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 \
    nvidia-cuda-cccl==13.0.85 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
    nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88
  printf '#!/bin/sh\n' >"$cuda/venv/nvcc-ok" && chmod +x "$cuda/venv/nvcc-ok"
fi
if [ ! -x "$cuda/venv/nccl-ok" ]; then
  "$cuda/venv/bin/pip" install -q nvidia-nccl-cu13==2.28.3
  printf '#!/bin/sh\n' >"$cuda/venv/nccl-ok" && chmod +x "$cuda/venv/nccl-ok"
fi
nccl_lib=$("$cuda/venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "nccl", "lib"))')
cu13=$("$cuda/venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
[ -x "$cu13/bin/nvcc" ] || { echo "build-cuda: no nvcc under $cu13" >&2; exit 1; }

cargo fetch --locked >/dev/null
cudarc_version=$(awk '/^name = "cudarc"/ {getline; gsub(/"/, "", $3); print $3}' Cargo.lock)
cudarc_src=$(ls -d ~/.cargo/registry/src/*/cudarc-"$cudarc_version" | head -1)
mkdir -p "$cuda/link"
if [ ! -f "$cuda/link/libcuda.so" ]; then
  grep -ohE 'pub unsafe fn (cu[A-Za-z0-9_]+)\(' "$cudarc_src/src/driver/sys/mod.rs" |
    sed -E 's/pub unsafe fn (cu[A-Za-z0-9_]+)\(/\1/' | sort -u |
    awk '{print "int "$1"(void){return 999;}"}' >"$cuda/link/stub_cuda.c"
  gcc -shared -fPIC -o "$cuda/link/libcuda.so" -Wl,-soname,libcuda.so.1 "$cuda/link/stub_cuda.c"
  ln -sf libcuda.so "$cuda/link/libcuda.so.1"
fi
for n in cudart:cudart.so.13 cublas:cublas.so.13 cublasLt:cublasLt.so.13 curand:curand.so.10 nvrtc:nvrtc.so.13; do
  ln -sf "$cu13/lib/lib${n#*:}" "$cuda/link/lib${n%%:*}.so"
done
ln -sf "$nccl_lib/libnccl.so.2" "$cuda/link/libnccl.so"

export PATH=$cu13/bin:$PATH NVCC=$cu13/bin/nvcc CUDA_COMPUTE_CAP=90 CUDARC_CUDA_VERSION=13000
export LIBRARY_PATH=$cuda/link CARGO_TARGET_DIR=$cuda/target
echo "build-cuda: $(nvcc --version | tail -1)"
tests_json=$(mktemp)
# One cargo invocation, so that candle is built (and its CUDA kernels compiled) once: every
# CUDA op test of gdn-ops (tests/cuda_*.rs), the model tests that run the device plan on CUDA
# (QWEN_GDN_TEST_DEVICE=cuda), and one CLI test, which makes cargo build the qwen-gdn binary.
cuda_tests=$(cd crates/gdn-ops/tests && ls cuda_*.rs | sed 's/\.rs$//')
# pipeline_mpi, experts_mpi and tensor_mpi: the plans' gates between processes, here as two NCCL
# ranks (the test binary launches itself, one rank a GPU).
model_tests="device_plan fused_decode fused_verify prompt_cache grouped_moe qwen4_exp conv_front batched_decode pipeline_mpi experts_mpi tensor_mpi"
cargo test --release --locked --no-run --message-format=json \
  -p gdn-ops -p qwen-gdn-model -p qwen-gdn \
  --features gdn-ops/cuda,qwen-gdn-model/cuda,qwen-gdn/cuda,qwen-gdn-model/nccl,qwen-gdn/nccl \
  $(for t in $cuda_tests $model_tests device_flags; do printf -- '--test %s ' "$t"; done) >"$tests_json"
# CHECK_ONLY=1: stop here (a compile check of the CUDA code, without the slow packing).
if [ "${CHECK_ONLY:-0}" = 1 ]; then
  rm -f "$tests_json"
  echo "build-cuda: compiled (CHECK_ONLY=1: nothing packed)"
  exit 0
fi
pack() { # pack NAME PATH
  strip -o "$cuda/$1" "$2"
  xz -9e -T2 -c "$cuda/$1" >"gpu-artefacts/cuda/$1.xz"
  echo "build-cuda: gpu-artefacts/cuda/$1.xz $(du -h "gpu-artefacts/cuda/$1.xz" | cut -f1)"
}
wanted() { [ -z "${PACK:-}" ] || [[ " $PACK " == *" $1 "* ]]; }
rm -f gpu-artefacts/cuda/*.xz
wanted qwen-gdn && pack qwen-gdn "$CARGO_TARGET_DIR/release/qwen-gdn"
for t in $cuda_tests $model_tests; do
  wanted "$t" || continue
  exe=$(python3 - "$tests_json" "$t" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[2] and m.get("executable"):
        print(m["executable"])
PY
)
  [ -n "$exe" ] || { echo "build-cuda: no test binary $t" >&2; exit 1; }
  pack "$t" "$exe"
done
rm -f "$tests_json"
# Smoke test here: every library must load; with the stub driver CUDA itself then fails.
if LD_LIBRARY_PATH=$cuda/link:$cu13/lib:$nccl_lib "$cuda/qwen-gdn" --version >/dev/null; then
  echo "build-cuda: done; carry gpu-artefacts/cuda and run scripts/gpu/test-cuda.sh on the GPU machine"
fi
