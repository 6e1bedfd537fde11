#!/usr/bin/env bash
# The CPU kernels as aarch64 binaries under qemu-user: cross-builds gdn-ops' CPU tests and one
# model gate for aarch64-unknown-linux-gnu and runs them with qemu-aarch64, on a CPU with
# dotprod and i8mm (`-cpu max`: every NEON level runs) and on one without (`-cpu cortex-a72`:
# the detection leaves them out, and a pinned one is refused).
#
#   - gdn-ops' unit tests (each kernel's copies against its portable one, bit for bit), and
#     tests/cpu_levels.rs (every level this CPU runs against the portable one, through the ops);
#   - the model gate tests/q8_activations.rs on one checkpoint (8-bit activations through the
#     interleaved layout's NEON kernels, judged against mlx-lm's logits), once per NEON level
#     pinned with QWEN_GDN_CPU_LEVEL.
#
# Time (2026-11-28, the 2-core development machine, loaded by other builds): from a clean
# target dir the aarch64 build takes 6.5 min of CPU (gdn-ops' and the model crate's dependencies
# for the target, 10.5 min wall while loaded); afterwards 0.5–2 min; the qemu runs 35–90 s.
#
# Needs (installed when missing, as root, by scripts/install-test-deps.sh): Debian's qemu-user
# and gcc-aarch64-linux-gnu (the linker and the C runtime); and rustup's std for the target.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu

bash scripts/install-test-deps.sh
# The target's std from rustup; where rustup cannot fetch it, std built from Debian's
# rustc-web sources (as scripts/check-metal.sh does, in a target dir of its own).
cargo=(cargo)
if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET" &&
  ! rustup target add "$TARGET"; then
  echo "test-aarch64: no rustup std for $TARGET; building std with Debian's rustc-web"
  export RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR=target/test-aarch64
  cargo=(/usr/bin/cargo -Zbuild-std=std,panic_abort)
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# The test binaries' own `cargo test` runner: qemu with the target's libraries.
qemu() {
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu $1" \
    "${@:2}"
}
ops=("${cargo[@]}" test --locked --target "$TARGET" -p gdn-ops --lib --test cpu_levels)
gate=("${cargo[@]}" test --locked --target "$TARGET" -p qwen-gdn-model --test q8_activations
  qwen3_next_4bit)

start=$SECONDS
"${ops[@]}" --no-run
"${gate[@]}" --no-run
echo "test-aarch64: built in $((SECONDS - start)) s"

start=$SECONDS
qemu max "${ops[@]}"
for level in neon neon-dotprod neon-i8mm; do
  echo "test-aarch64: model gate at QWEN_GDN_CPU_LEVEL=$level"
  QWEN_GDN_CPU_LEVEL=$level qemu max "${gate[@]}"
done
# Without dotprod and i8mm: only portable and neon run, and pinning i8mm is refused.
qemu cortex-a72 "${ops[@]}"
echo "test-aarch64: ran in $((SECONDS - start)) s"
