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

exec bash "$(dirname "${BASH_SOURCE[0]}")/with-fixture-venv.sh" "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gen_fixtures.py" "$@"
