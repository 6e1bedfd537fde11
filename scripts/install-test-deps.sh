#!/usr/bin/env bash
# Installs what the Metal checks, the browser test and the aarch64 tests need on Debian
# bookworm (root): clang-19 with compiler-rt (the kernel emulation test compiles
# kernels/gated_delta.metal as C++; compiler-rt has the bf16 conversions libgcc 12 lacks),
# Debian's rustc-web toolchain with its std sources (scripts/check-metal.sh builds std for
# aarch64-apple-darwin), Chromium with its chromedriver (scripts/test-chat-page.sh drives the
# chat page in it), and qemu-user with the aarch64 cross linker and C runtime
# (scripts/test-aarch64.sh).
set -euo pipefail
need=()
command -v clang++-19 >/dev/null || need+=(clang-19 libclang-rt-19-dev)
[[ -x /usr/bin/rustc && -d /usr/lib/rustlib/src/rust/library ]] || need+=(rustc-web cargo-web rust-web-src)
[[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]] || need+=(chromium chromium-driver)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
if [[ ${#need[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-test-deps: missing ${need[*]}; run this script as root (apt-get)" >&2
  exit 1
fi
echo "install-test-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# No `-t bookworm-security`: rustc-web is in both pockets, and pinning the security pocket
# drags in its older libc6-i386 (libclang-rt-19-dev needs it) against the newer libc6 that
# is installed, which apt refuses ("held broken packages"). Fall back to the pin only when
# the plain install fails.
apt-get install -y -qq "${need[@]}" >/dev/null ||
  apt-get install -y -qq -t bookworm-security "${need[@]}" >/dev/null
