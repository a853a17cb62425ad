#!/usr/bin/env bash
# Lint, format check and the test suite (CPU only), in .venv. Extra arguments go to pytest.
# As root, installs Chromium (apt) for the browser tests when it is missing.
# The suite runs in TEST_WORKERS processes (default 2), one test file per process at a time,
# the longest files first (tests/helpers/file_order.py).
set -euo pipefail
source "$(dirname "$0")/setup_env.sh" test
# The browser tests (tests/reports/test_html_browser.py) drive Debian's Chromium: where it is
# missing and this runs as root (CI), install it; elsewhere those tests skip, saying why.
chromium="${BEYONDPAR_CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$chromium" ] && [ "$(id -u)" = 0 ]; then
  echo "installing chromium for the browser tests" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
fi
# The suite starts many interpreters (its test processes, the launchers, two-process runs):
# each reads the modules' bytecode from a cache, as Python does by default, rather than
# compiling their source again where PYTHONDONTWRITEBYTECODE turns caching off; the cache
# lives in .venv, not beside the sources (less that of modules the tests wrote to /tmp).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$PWD/.venv/pycache"
rm -rf "$PYTHONPYCACHEPREFIX/tmp"
ruff check .
ruff format --check .
python -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
