#!/usr/bin/env bash
# The chat page at `/` in a real headless browser: Debian's Chromium and chromedriver
# (installed by scripts/install-test-deps.sh) driven by Selenium (pinned in
# scripts/requirements-chat-page-test.txt, installed into a venv), against two servers on the
# tiny model that scripts/test_chat_page.py starts. Screenshots are left in
# target/ci-artefacts/ (chat-page.png, chat-page-conversation.png).
#
#   bash scripts/test-chat-page.sh
#
# VENV (default <repo>/.venv-chat-page), PYTHON (the interpreter that creates it), QWEN_GDN (a
# debug binary; default: target/debug/qwen-gdn, built here), CHROMIUM and CHROMEDRIVER (default
# /usr/bin/chromium, /usr/bin/chromedriver) can be set.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="${VENV:-$repo/.venv-chat-page}"

if [ -z "${QWEN_GDN:-}" ]; then
    cargo build -q -p qwen-gdn --bin qwen-gdn
    QWEN_GDN="$repo/target/debug/qwen-gdn"
fi
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -q -r scripts/requirements-chat-page-test.txt
# Selenium must use the chromedriver given, never fetch one.
export SE_OFFLINE=true
"$venv/bin/python" scripts/test_chat_page.py "$QWEN_GDN" "$repo/models/qwen3.5-tiny-4bit" \
    "$repo/target/ci-artefacts" || { echo "test-chat-page: FAILED" >&2; exit 1; }
