"""`launch/gpu_check.sh` on an image that already has its Python (`SETUP=none`): each step's
output in its own file, a failing or stalled step named at the end while the others still
run, and the table built from whatever the steps left. The Python it calls is a stand-in
that answers each step at once (the steps themselves are tested where they live)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in
  "- "*) exec {python} "$@" ;;  # the table, read from stdin
  "-c "*) echo "0.0 [FakeDevice(id=0)]" ;;
  *"-m pytest "*) echo "3 passed" ;;
  *"benchmark.py metrics"*)
    echo "fused 2.5 us/matrix"
    echo '{{"us_per_matrix": {{"fused": 2.5}}, "speedup_vs_paper": 1234.4,' \
      '"fraction_of_matmul": 0.031}}' ;;
  *"benchmark.py train"*)
    if [ "$FAKE_FAIL" = 1 ]; then echo "train: out of memory" >&2; exit 3; fi
    echo '{{"ms_per_step": {{"1": 1.5, "16": 2.25}}, "floor_ms": 0.125}}' ;;
  *"benchmark.py synergy"*) if [ "$FAKE_FAIL" = 1 ]; then sleep 30; fi ;;
  *benchmark.py*) echo '{{}}' ;;
  *launch/train.py*)
    for arg in "$@"; do case "$arg" in --workdir=*) run="${{arg#--workdir=}}" ;; esac; done
    mkdir -p "$run"
    printf '%s\\n' '{{"eval/accuracy": 0.5}}' '{{"eval/accuracy": 0.9876}}' \
      > "$run/metrics.jsonl" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def run_gpu_check(tmp_path, fail: bool) -> tuple[subprocess.CompletedProcess, Path]:
    """gpu_check.sh with the stand-in Python first on PATH; (the process, its OUT)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    out, run = tmp_path / "out", tmp_path / "run"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SETUP="none")
    env |= {"OUT": str(out), "WORKDIR": str(run), "STEP_SECONDS": "2", "FAKE_FAIL": str(int(fail))}
    script = ROOT / "launch" / "gpu_check.sh"
    done = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=60)
    return done, out


def table_rows(out: Path) -> dict:
    rows = (out / "table.txt").read_text().splitlines()
    return {row.split("|")[1].strip(): row.split("|")[2].strip() for row in rows}


def test_gpu_check_names_failed_steps_and_tabulates_the_rest(tmp_path):
    done, out = run_gpu_check(tmp_path, fail=True)
    assert done.returncode == 1, done.stderr
    assert "gpu_check: failed or timed out: train synergy" in done.stderr
    steps = ["devices", "tests", "metrics", "train", "synergy", "pretrained", "load", "run"]
    assert sorted(p.stem for p in out.glob("*.txt")) == sorted([*steps, "table"])
    assert "out of memory" in (out / "train.txt").read_text()
    assert (out / "tests.txt").read_text() == "3 passed\n"
    rows = table_rows(out)
    assert list(rows) == [
        "metrics us/matrix (fused)",
        "metrics speed-up vs paper",
        "metrics fraction of matmul",
        "2,000-step run: steps/s (wall)",
        "2,000-step run: eval accuracy",
    ]
    assert list(rows.values())[:3] == ["2.50", "1234x", "3.1%"]
    assert rows["2,000-step run: eval accuracy"] == "0.9876"  # the run's last line
    # 2,000 steps over the run step's wall time, which is under the whole script's 60 s
    assert float(rows["2,000-step run: steps/s (wall)"]) > 2000 / 60
    table = (out / "table.txt").read_text().splitlines()
    assert done.stdout.splitlines()[-len(table) :] == table


def test_gpu_check_exits_zero_when_every_step_passes(tmp_path):
    done, out = run_gpu_check(tmp_path, fail=False)
    assert done.returncode == 0, done.stderr
    assert "failed" not in done.stderr
    rows = table_rows(out)
    assert rows["train ms/step H=1"] == "1.50" and rows["train ms/step H=16"] == "2.25"
    assert rows["train floor ms"] == "0.12"
    assert len(rows) == 8
