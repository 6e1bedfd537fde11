# Sourced by the device-side scripts: unpacks the binaries that scripts/gpu/build-cuda.sh packed
# into gpu-artefacts/cuda (carried by the device call) into $bin, and points the loader at
# PyTorch's CUDA 13 libraries (cuBLAS, cuRAND, NVRTC, runtime), which the device image has.
OUT=${OUT:-gpu-artefacts/out}
bin=/tmp/qwen-gdn-cuda
mkdir -p "$OUT" "$bin"
for f in gpu-artefacts/cuda*/*.xz; do
  [ -f "$f" ] || { echo "no gpu-artefacts/cuda*/*.xz: run scripts/gpu/build-cuda.sh and carry gpu-artefacts/cuda" >&2; exit 1; }
  xz -dc "$f" >"$bin/$(basename "$f" .xz)" && chmod +x "$bin/$(basename "$f" .xz)"
done
nv=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])")
export LD_LIBRARY_PATH=$nv/cu13/lib:${LD_LIBRARY_PATH:-}
# The driver's JIT cache of our PTX modules, kept between calls: a fresh machine spends minutes
# JIT-compiling the large modules (gated_delta_norm's PTX is ~20 MB) at their first launch,
# and ptxas ahead of time costs as much again on the 2-core build machine. A call that carries
# gpu-artefacts/jit/cuda-cache.tar.xz (from an earlier call's $OUT) starts with every unchanged
# module already compiled; each call leaves the cache it ended with in $OUT.
export CUDA_CACHE_PATH=/tmp/cuda-jit-cache CUDA_CACHE_MAXSIZE=4294967296
mkdir -p "$CUDA_CACHE_PATH"
if [ -f gpu-artefacts/jit/cuda-cache.tar.xz ]; then
  tar -xJf gpu-artefacts/jit/cuda-cache.tar.xz -C "$CUDA_CACHE_PATH" && echo "common.sh: JIT cache restored ($(du -sh "$CUDA_CACHE_PATH" | cut -f1))"
fi
save_jit_cache() { tar -cf - -C "$CUDA_CACHE_PATH" . | xz -1 -T0 >"$OUT/cuda-cache.tar.xz"; }
trap save_jit_cache EXIT
