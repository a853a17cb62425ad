#!/usr/bin/env bash
# Lint, format check and the test suite (CPU only), in .venv. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/setup_env.sh" test
ruff check .
ruff format --check .
python -m pytest -q "$@"
