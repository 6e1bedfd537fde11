#!/usr/bin/env bash
# The whole test suite (the README's test command; .ci/run calls it):
#   1. the tools the Metal checks need (installed when missing),
#   2. cargo test over the workspace (includes the Metal kernel emulation test),
#   3. `qwen-gdn serve` driven by the official openai Python client and curl (needs PyPI once),
#   4. the macOS type-check of the workspace with the `metal` feature.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
cargo test --workspace --locked
bash scripts/test-serve-openai.sh
bash scripts/check-metal.sh
