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
