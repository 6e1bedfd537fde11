#!/usr/bin/env bash
# Type-checks the workspace for Apple Silicon with the `metal` feature, from Linux.
#
# Uses Debian's rustc-web / cargo-web / rust-web-src (a toolchain whose std sources let
# -Zbuild-std build std for aarch64-apple-darwin; RUSTC_BOOTSTRAP unlocks -Z on stable).
# Crates whose build scripts compile C for the target cannot pass (no Apple C toolchain
# here): the Hub download (ring, via TLS) is therefore behind the CLI's `hub` feature, which
# this check turns off. Everything Metal is checked.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x /usr/bin/rustc || ! -d /usr/lib/rustlib/src/rust/library ]]; then
  echo "check-metal: Debian's rustc-web toolchain is missing; install it with:" >&2
  echo "  apt-get install -t bookworm-security rustc-web cargo-web rust-web-src" >&2
  exit 1
fi

export RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 RUSTFLAGS="-D warnings"
# A separate target dir: this toolchain's artefacts must not mix with rustup's.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/check-metal"
/usr/bin/cargo check --locked -Zbuild-std=std,panic_abort --target aarch64-apple-darwin \
  -p gdn-ops -p qwen-gdn-model -p qwen-gdn --no-default-features \
  --features gdn-ops/metal,qwen-gdn-model/metal,qwen-gdn/metal --all-targets "$@"
echo "check-metal: the workspace type-checks for aarch64-apple-darwin with --features metal"
