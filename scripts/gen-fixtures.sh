#!/usr/bin/env bash
# Regenerate everything under models/ (tiny checkpoints + mlx-lm reference outputs).
#
#   bash scripts/gen-fixtures.sh
#
# Creates (or reuses) the virtual environment .venv at the repository root, installs the pinned
# versions from scripts/requirements-fixtures.txt (pip does not touch the network when they are
# already installed), then runs scripts/gen_fixtures.py. The shared tokenizers and chat
# templates are read from <repo>/../shared; set QWEN_GDN_SHARED to use another folder.
# Environment: VENV (default <repo>/.venv), PYTHON (interpreter used to create the venv).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$repo/.venv}"
req="$repo/scripts/requirements-fixtures.txt"

if [ ! -x "$venv/bin/python" ]; then
    echo "[gen-fixtures] creating $venv" >&2
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req"

cd "$repo"
exec "$venv/bin/python" "$repo/scripts/gen_fixtures.py" "$@"
