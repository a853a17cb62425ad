#!/usr/bin/env bash
# One short prepared check for a GPU machine: the parallel-path tests, the benchmarks
# (GGUF loading included) and a 2,000-step run of the paper's config, then a table.
# Usage: bash launch/gpu_check.sh   (installs the cuda12 extra into .venv; TPU: EXTRA=tpu)
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/setup_env.sh "${EXTRA:-cuda12}"
out="${OUT:-out/gpu_check}"
mkdir -p "$out"
python -c 'import jax; print(jax.devices())' | tee "$out/devices.txt"
python -m pytest -q tests/study/test_train.py -k "data_parallel or nan or resumes" 2>&1 | tail -3 | tee "$out/tests.txt"
python launch/benchmark.py metrics --repeats 5 | tee "$out/metrics.txt"
python launch/benchmark.py train --repeats 5 | tee "$out/train.txt"
python launch/benchmark.py synergy | tee "$out/synergy.txt"
python launch/benchmark.py pretrained | tee "$out/pretrained.txt"
python launch/benchmark.py load --repeats 2 | tee "$out/load.txt"
start=$(date +%s)
python launch/train.py --config=configs/paper.py:task=cycle,heads=8 \
  --config.optim.num_epochs=20 --config.progress_bar=False --workdir="$out/run"
end=$(date +%s)
python - "$out" "$((end - start))" <<'PY'
import json, pathlib, sys
out, seconds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
m = json.loads((out / "metrics.txt").read_text().splitlines()[-1])
t = json.loads((out / "train.txt").read_text().splitlines()[-1])
last = json.loads((out / "run" / "metrics.jsonl").read_text().splitlines()[-1])
rows = [
    ("metrics us/matrix (fused)", f"{m['us_per_matrix']['fused']:.2f}"),
    ("metrics speed-up vs paper", f"{m['speedup_vs_paper']:.0f}x"),
    ("metrics fraction of matmul", f"{m['fraction_of_matmul']:.1%}"),
    *[(f"train ms/step H={h}", f"{v:.2f}") for h, v in t["ms_per_step"].items()],
    ("train floor ms", f"{t['floor_ms']:.2f}"),
    ("2,000-step run: steps/s (wall)", f"{2000 / seconds:.1f}"),
    ("2,000-step run: eval accuracy", f"{last['eval/accuracy']:.4f}"),
]
for name, value in rows:
    print(f"| {name:<32} | {value:>10} |")
PY
