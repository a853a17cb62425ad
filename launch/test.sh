#!/usr/bin/env bash
# Lint, format check and the test suite (CPU only), in .venv. Extra arguments go to pytest.
# The suite runs in TEST_WORKERS processes (default 2), one test file per process at a time.
set -euo pipefail
source "$(dirname "$0")/setup_env.sh" test
ruff check .
ruff format --check .
python -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
