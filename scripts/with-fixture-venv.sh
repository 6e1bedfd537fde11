#!/usr/bin/env bash
# Runs a Python script of this repo in the fixture virtual environment:
#
#   bash scripts/with-fixture-venv.sh scripts/gen_fixtures.py [args...]
#
# Creates (or reuses) the venv (VENV, default <repo>/.venv; PYTHON is the interpreter used to
# create it), installs the pinned versions of scripts/requirements-fixtures.txt (pip does not
# touch the network when they are already installed), then runs the script from the repo root.
# WITH_TORCH=1 also installs scripts/requirements-fixtures-torch.txt (transformers references).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$repo/.venv}"
script="$1"
shift

if [ ! -x "$venv/bin/python" ]; then
    echo "[$(basename "$script")] creating $venv" >&2
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$repo/scripts/requirements-fixtures.txt"
if [ "${WITH_TORCH:-0}" = 1 ]; then
    # torch only for the transformers references (the qwen4_exp fixture); large, so opt-in.
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$repo/scripts/requirements-fixtures-torch.txt"
    # mlx-vlm's own conversion code for the qwen4_exp 4-bit fixture; --no-deps: its image,
    # audio and server dependencies are not needed to convert (gen_fixture_qwen4_exp_mlx.py).
    "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps -r "$repo/scripts/requirements-fixtures-mlx-vlm.txt"
fi

cd "$repo"
exec "$venv/bin/python" "$script" "$@"
