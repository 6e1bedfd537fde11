#!/usr/bin/env bash
# The GGUF half of the benchmark checkpoints (issue 7), and the llama.cpp build that
# scripts/bench-vs-peers compares against:
#
#   bash scripts/gen-bench-gguf.sh build/bench-models/qwen3-next-bench-hf
#       -> build/bench-models/qwen3-next-bench-q4_0.gguf (and llama.cpp built if missing)
#   bash scripts/gen-bench-gguf.sh --build-only      # only llama.cpp: llama-bench, llama-batched-bench, llama-quantize
#   bash scripts/gen-bench-gguf.sh --force DIR...    # redo the conversion even if up to date
#
# The -hf folders are those written by scripts/gen-bench-checkpoints.sh (raw HF bf16 layout; its
# -4bit twin is the mlx-lm conversion of the same weights). Every step is skipped when its output
# is already there:
#
# 1. llama.cpp source: the PyPI sdist of llama-cpp-python 0.3.36, fetched with
#    `pip download --no-deps --no-binary llama-cpp-python` (only that package from source: with
#    `--no-binary :all:` pip also builds cmake and ninja from source just to read the metadata)
#    into build/llama.cpp/ and unpacked; build/llama.cpp/src links to its vendor/llama.cpp.
# 2. Build: cmake, Release, GGML_NATIVE=ON, LLAMA_CURL=OFF, tests/examples/server off, and only
#    the targets llama-bench, llama-batched-bench and llama-quantize -> build/llama.cpp/build/bin/ (cmake from Debian's
#    apt, installed if missing; ~7 min on 2 cores). AMX is compiled out (-mno-amx-*) unless
#    LLAMA_AMX=1: with -march=native on a CPU that lists AMX, ggml builds its AMX matmul, and
#    in the VMs this project benchmarks on its first AMX instruction dies with SIGILL, so
#    llama.cpp runs its AVX-512 VNNI kernels there.
# 3. Converter venv: <repo>/.venv-llama (VENV_LLAMA overrides) with
#    scripts/requirements-llama-convert.txt (torch is unavoidable: ~4.9 GB, see that file).
# 4. Per -hf folder <name>-hf:
#    - a staging folder build/bench-models/.gguf-stage-<name>/ with the -hf folder's config.json,
#      generation_config.json, safetensors shards and index symlinked, and the full tokenizer
#      (tokenizer.json, tokenizer_config.json) from ../shared/tokenizers/<family>/
#      (QWEN_GDN_SHARED overrides ../shared; qwen3-next or qwen3.5 from the folder's manifest);
#    - llama.cpp's own convert_hf_to_gguf.py --outtype bf16 --no-mtp (the MTP head is left out,
#      as mlx-lm's conversion drops it) -> <name>-bf16.gguf, a temporary file (~5 GB);
#    - llama-quantize <name>-bf16.gguf <name>-q4_0.gguf Q4_0 (llama-quantize's default mix for
#      Q4_0: output.weight is Q6_K, the small GDN/norm tensors stay F32) -> <name>-q4_0.gguf,
#      with <name>-q4_0.gguf.json (the -hf manifest plus versions) for the up-to-date check.
#    Times here (2 cores): sdist + build ~7 min, conversion ~1 min, quantization ~16 s.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLAMA_CPP_PYTHON_VERSION=0.3.36
llama_dir="$repo/build/llama.cpp"
venv="${VENV_LLAMA:-$repo/.venv-llama}"
shared="${QWEN_GDN_SHARED:-$repo/../shared}"
jobs="$(nproc)"

build_only=0
force=0
folders=()
while [ $# -gt 0 ]; do
    case "$1" in
        --build-only) build_only=1 ;;
        --force) force=1 ;;
        -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "unknown option: $1" >&2; exit 2 ;;
        *) folders+=("$1") ;;
    esac
    shift
done

log() { echo "[gen-bench-gguf] $*" >&2; }

ensure_llama_source() {
    local sdist="$llama_dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    local vendored="$llama_dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
    if [ ! -f "$vendored/CMakeLists.txt" ]; then
        mkdir -p "$llama_dir"
        if [ ! -f "$sdist" ]; then
            log "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist"
            python3 -m pip download --disable-pip-version-check -q --no-deps \
                --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$llama_dir"
        fi
        tar -xzf "$sdist" -C "$llama_dir"
    fi
    ln -sfn "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp" "$llama_dir/src"
    if ! grep -q '"qwen3next"' "$llama_dir/src/src/llama-arch.cpp"; then
        echo "this llama.cpp does not know the qwen3next architecture" >&2
        exit 1
    fi
}

ensure_llama_build() {
    local bin="$llama_dir/build/bin"
    if [ -x "$bin/llama-bench" ] && [ -x "$bin/llama-quantize" ] && [ -x "$bin/llama-batched-bench" ]; then
        return
    fi
    command -v cmake >/dev/null || { log "installing cmake (apt)"; apt-get install -y -q cmake >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q cmake >/dev/null; }; }
    log "building llama.cpp (llama-bench, llama-batched-bench, llama-quantize) with $jobs jobs; log in $llama_dir/build.log"
    local t0=$SECONDS
    local no_amx=()
    if [ "${LLAMA_AMX:-0}" != 1 ]; then
        no_amx=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
            -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    fi
    {
        cmake -S "$llama_dir/src" -B "$llama_dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON "${no_amx[@]}" \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_BUILD_SERVER=OFF
        cmake --build "$llama_dir/build" --config Release -j "$jobs" --target llama-bench llama-batched-bench llama-quantize
    } >"$llama_dir/build.log" 2>&1 || { tail -30 "$llama_dir/build.log" >&2; exit 1; }
    log "llama.cpp built in $((SECONDS - t0)) s"
}

ensure_venv() {
    if [ ! -x "$venv/bin/python" ]; then
        log "creating $venv"
        "${PYTHON:-python3}" -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$repo/scripts/requirements-llama-convert.txt"
}

convert() {
    local hf="${1%/}"
    [ -f "$hf/.bench-checkpoint.json" ] || { echo "$hf: not a folder of scripts/gen-bench-checkpoints.sh (no .bench-checkpoint.json)" >&2; exit 1; }
    local base name out manifest stage tok
    base="$(cd "$(dirname "$hf")" && pwd)"
    name="$(basename "$hf")"
    name="${name%-hf}"
    out="$base/$name-q4_0.gguf"
    manifest="$out.json"
    local want
    want="$(python3 - "$hf/.bench-checkpoint.json" "$LLAMA_CPP_PYTHON_VERSION" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
print(json.dumps({"source": m, "llama_cpp_python": sys.argv[2], "outtype": "bf16", "no_mtp": True, "quant": "Q4_0"}, sort_keys=True))
EOF
)"
    if [ "$force" = 0 ] && [ -f "$out" ] && [ -f "$manifest" ] && [ "$(cat "$manifest")" = "$want" ]; then
        log "$out is up to date (--force redoes it)"
        return
    fi
    case "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["family"])' "$hf/.bench-checkpoint.json")" in
        qwen3_next) tok="$shared/tokenizers/qwen3-next" ;;
        qwen3_5 | qwen3_5_moe) tok="$shared/tokenizers/qwen3.5" ;;
        *) echo "$hf: unknown family" >&2; exit 1 ;;
    esac
    [ -f "$tok/tokenizer.json" ] || { echo "missing $tok/tokenizer.json (set QWEN_GDN_SHARED)" >&2; exit 1; }

    stage="$base/.gguf-stage-$name"
    rm -rf "$stage" "$out" "$manifest"
    mkdir -p "$stage"
    local f
    for f in "$hf"/config.json "$hf"/generation_config.json "$hf"/*.safetensors "$hf"/model.safetensors.index.json; do
        if [ -e "$f" ]; then ln -s "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$stage/"; fi
    done
    cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$stage/"

    local bf16="$base/$name-bf16.gguf" t0=$SECONDS
    log "converting $hf (tokenizer $tok) -> $bf16; log in $base/$name-gguf.log"
    "$venv/bin/python" "$llama_dir/src/convert_hf_to_gguf.py" "$stage" --outtype bf16 --no-mtp \
        --outfile "$bf16" >"$base/$name-gguf.log" 2>&1 || { tail -30 "$base/$name-gguf.log" >&2; exit 1; }
    log "converted in $((SECONDS - t0)) s; quantizing to Q4_0"
    t0=$SECONDS
    "$llama_dir/build/bin/llama-quantize" "$bf16" "$out" Q4_0 "$jobs" >>"$base/$name-gguf.log" 2>&1 ||
        { tail -30 "$base/$name-gguf.log" >&2; exit 1; }
    rm -f "$bf16"
    rm -rf "$stage"
    printf '%s' "$want" >"$manifest"
    log "$out: $(du -h "$out" | cut -f1) in $((SECONDS - t0)) s"
}

ensure_llama_source
ensure_llama_build
[ "$build_only" = 1 ] && exit 0
[ ${#folders[@]} -gt 0 ] || { echo "usage: bash scripts/gen-bench-gguf.sh [--force] <name>-hf... | --build-only" >&2; exit 2; }
ensure_venv
for f in "${folders[@]}"; do
    convert "$f"
done
