#!/usr/bin/env bash
# The whole test suite (the README's test command; .ci/run calls it):
#   1. the tools the Metal checks need (installed when missing),
#   2. no import circle inside any crate or among the scripts (scripts/check-import-circles.py,
#      its allow-list scripts/import-circles-allowed.txt), and the check's own test,
#   3. cargo test over the workspace (includes the Metal kernel emulation test),
#   4. the model's gates again with every gated-delta call in the chunked form, decode steps
#      included (by default only calls of 16 tokens or more take it),
#   5. the device plan's gates again with every MoE prefill chunk on the grouped GEMM (the
#      default on CUDA; its CPU twin here),
#   6. the model's gates again with a prefill attention score budget of 4 KiB, so that every
#      chunk's attention runs in query blocks and key tiles (online softmax),
#   7. `qwen-gdn serve` driven by the official openai, anthropic and ollama Python clients,
#      the Prometheus parser and curl (needs PyPI once),
#   8. the chat page at `/` in headless Chromium driven by Selenium (needs PyPI once),
#   9. the macOS type-check of the workspace with the `metal` feature,
#  10. the CPU kernels' NEON levels as aarch64 binaries under qemu-user (gdn-ops' CPU tests and
#      one model gate; installs qemu-user and the cross linker when missing),
#  11. MPI between 2 and 3 processes under mpirun (scripts/test-mpi.sh; installs Open MPI when
#      missing): the collectives, the pipeline gate (N ranks = 1 rank bit for bit in f32 on every
#      hybrid fixture), a dying or stalled rank, and `generate --ranks N`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
python3 scripts/check-import-circles.py
python3 scripts/test_check_import_circles.py
cargo test --workspace --locked
QWEN_GDN_GDN_PREFILL=chunked cargo test --locked -p qwen-gdn-model \
    --test reference --test device_plan --test prefill_chunks
QWEN_GDN_MOE_PREFILL=gemm cargo test --locked -p qwen-gdn-model --test device_plan
QWEN_GDN_ATTN_SCORE_BYTES=4096 cargo test --locked -p qwen-gdn-model \
    --test reference --test device_plan --test prefill_chunks --test qwen4_exp
bash scripts/test-serve-clients.sh
bash scripts/test-chat-page.sh
bash scripts/check-metal.sh
bash scripts/test-aarch64.sh
bash scripts/test-mpi.sh
