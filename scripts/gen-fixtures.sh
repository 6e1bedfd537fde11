#!/usr/bin/env bash
# Regenerate everything under models/ (tiny checkpoints + mlx-lm reference outputs).
#
#   bash scripts/gen-fixtures.sh
#
# Creates (or reuses) the virtual environment .venv at the repository root, installs the pinned
# versions from scripts/requirements-fixtures.txt (pip does not touch the network when they are
# already installed), then runs scripts/gen_fixtures.py (or, with `--only qwen4_exp[_mlx]`,
# scripts/gen_fixture_qwen4_exp[_mlx].py, WITH_TORCH=1; `--only mtp`: scripts/gen_fixture_mtp.py,
# WITH_TORCH=1; `--only qwen4_exp_mtp`: scripts/gen_fixture_qwen4_exp_mtp.py, WITH_TORCH=1 for
# the mlx-vlm wheel; `--only qwen4_exp_drafter`: scripts/gen_fixture_qwen4_exp_drafter.py, mlx-vlm's
# split of that head, WITH_TORCH=1, after it). The shared tokenizers and chat
# templates are read from <repo>/../shared; set QWEN_GDN_SHARED to use another folder.
# Environment: VENV (default <repo>/.venv), PYTHON (interpreter used to create the venv).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# `--only qwen4_exp[_mlx]` runs that fixture's own script, which imports gen_fixtures.py.
case "$*" in
    "--only qwen4_exp") script=gen_fixture_qwen4_exp.py ;;
    "--only qwen4_exp_mlx") script=gen_fixture_qwen4_exp_mlx.py ;;
    "--only mtp") script=gen_fixture_mtp.py ;;
    "--only qwen4_exp_mtp") script=gen_fixture_qwen4_exp_mtp.py ;;
    "--only qwen4_exp_drafter") script=gen_fixture_qwen4_exp_drafter.py ;;
    "") script=gen_fixtures.py ;;
    *) echo "usage: gen-fixtures.sh [--only qwen4_exp|qwen4_exp_mlx|mtp|qwen4_exp_mtp|qwen4_exp_drafter], got $*" >&2; exit 2 ;;
esac
exec bash "$here/with-fixture-venv.sh" "$here/$script"
