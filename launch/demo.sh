#!/usr/bin/env bash
# The main job on a small CPU default. Writes everything under ${OUT:-out}/.
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"
out="${OUT:-out}"
python launch/example2.py --out "$out/example2"
echo "done: see $out/"
