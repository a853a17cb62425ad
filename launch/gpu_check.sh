#!/usr/bin/env bash
# One short prepared check for a GPU machine: the parallel-path tests, the benchmarks
# (GGUF loading included) and a 2,000-step run of the paper's config, then a table.
# Usage: bash launch/gpu_check.sh   (installs the cuda12 extra into .venv; TPU: EXTRA=tpu)
#   SETUP=none bash launch/gpu_check.sh   uses the python3 on PATH as it is (an image that
#                                         already holds a GPU build of JAX, no network)
#   OUT=dir      where the step outputs and the table go (default out/gpu_check)
#   WORKDIR=dir  the training run's folder (default $OUT/run)
#   STEP_SECONDS=n  stop any one step after n seconds (default 1800)
# A step that fails or runs out of time is named at the end; the others still run.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${SETUP:-venv}" = none ]; then
  py=python3
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  # shellcheck disable=SC1091
  source launch/setup_env.sh "${EXTRA:-cuda12}" || exit 1
  set +e
  py=python
fi
out="${OUT:-out/gpu_check}"
run="${WORKDIR:-$out/run}"
mkdir -p "$out"
failed=()

step() { # step NAME COMMAND...: the command's output to the screen and $out/NAME.txt
  local name=$1
  shift
  echo "== $name" >&2
  timeout "${STEP_SECONDS:-1800}" "$@" 2>&1 | tee "$out/$name.txt" || failed+=("$name")
}

step devices "$py" -c 'import jax; print(jax.__version__, jax.devices())'
step tests "$py" -m pytest -q -p no:cacheprovider tests/study/test_train.py \
  -k "data_parallel or nan or resumes"
step metrics "$py" launch/benchmark.py metrics --repeats 5
step train "$py" launch/benchmark.py train --repeats 5
step synergy "$py" launch/benchmark.py synergy
step pretrained "$py" launch/benchmark.py pretrained
step load "$py" launch/benchmark.py load --repeats 2
start=$(date +%s.%N)
step run "$py" launch/train.py --config=configs/paper.py:task=cycle,heads=8 \
  --config.optim.num_epochs=20 --config.progress_bar=False --workdir="$run"
end=$(date +%s.%N)
"$py" - "$out" "$run" "$start" "$end" <<'PY' | tee "$out/table.txt" || failed+=(table)
import json, pathlib, sys
out, run = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
seconds = float(sys.argv[4]) - float(sys.argv[3])


def last_json(path):
    """The last line of a step's output as JSON, or None where the step left none."""
    try:
        return json.loads(path.read_text().splitlines()[-1])
    except (OSError, IndexError, ValueError):
        return None


rows = []
if m := last_json(out / "metrics.txt"):
    rows += [
        ("metrics us/matrix (fused)", f"{m['us_per_matrix']['fused']:.2f}"),
        ("metrics speed-up vs paper", f"{m['speedup_vs_paper']:.0f}x"),
        ("metrics fraction of matmul", f"{m['fraction_of_matmul']:.1%}"),
    ]
if t := last_json(out / "train.txt"):
    rows += [(f"train ms/step H={h}", f"{v:.2f}") for h, v in t["ms_per_step"].items()]
    rows += [("train floor ms", f"{t['floor_ms']:.2f}")]
if last := last_json(run / "metrics.jsonl"):
    rows += [
        ("2,000-step run: steps/s (wall)", f"{2000 / seconds:.1f}"),
        ("2,000-step run: eval accuracy", f"{last['eval/accuracy']:.4f}"),
    ]
for name, value in rows:
    print(f"| {name:<32} | {value:>10} |")
PY
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu_check: failed or timed out: ${failed[*]}" >&2
  exit 1
fi
