#!/usr/bin/env bash
# Generate the random-weight benchmark checkpoints (Qwen3-Next-80B-A3B and Qwen3.5-35B-A3B layer
# shapes, 8 layers, 64 experts) under build/bench-models/: a raw HF bf16 folder and its
# mlx-community 4-bit conversion for each. See scripts/gen_bench_checkpoints.py for the details
# (the GGUF twin, <name>-q4_0.gguf from the same -hf folder, is scripts/gen-bench-gguf.sh's job).
#
#   bash scripts/gen-bench-checkpoints.sh                       # both, full size (~14 GB disk)
#   bash scripts/gen-bench-checkpoints.sh --family qwen3-next --layers 1 --experts 2   # small
#
# Up-to-date folders are kept (--force regenerates them). Uses the same virtual environment and
# pinned versions as scripts/gen-fixtures.sh (VENV, default <repo>/.venv; PYTHON creates it) and
# the real tokenizers in <repo>/../shared/tokenizers (QWEN_GDN_SHARED overrides ../shared).
set -euo pipefail

exec bash "$(dirname "${BASH_SOURCE[0]}")/with-fixture-venv.sh" "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gen_bench_checkpoints.py" "$@"
