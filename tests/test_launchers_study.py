"""The study launchers as a user runs them: what a flag left at its default does, where
the output goes, and the exit status and message of a run that goes wrong."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from beyondpar.study import evaluate

ROOT = Path(__file__).resolve().parents[1]


def launch(script: str, *flags, cwd=ROOT) -> subprocess.CompletedProcess:
    """Run `launch/<script>` with `flags` from `cwd`, this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(ROOT / "launch" / script), *flags],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )


def test_train_cli_stops_a_diverged_run_with_status_2(tmp_path):
    """A learning rate of 1e30 makes the loss NaN within the first steps: the launcher
    must exit with status 2 and one `error:` line naming the step and the last good
    checkpoint, so that a scheduler sees the run as failed rather than finished."""
    result = launch(
        "train.py",
        f"--config={ROOT / 'configs' / 'smoke.py'}",
        f"--workdir={tmp_path / 'run'}",
        "--config.optim.learning_rate=1e30",
        "--config.optim.num_epochs=1",
        "--config.progress_bar=False",
    )
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert errors[0].startswith("error: training loss is nan at step ")
    assert errors[0].endswith("stopped, no checkpoint saved yet")
    assert "trained copy" not in result.stdout  # no summary line for a failed run


@pytest.fixture(scope="module")
def two_checkpoints(two_epoch_run, tmp_path_factory):
    """A runs folder with one smoke run saved at steps 8 and 16."""
    root = tmp_path_factory.mktemp("runs")
    shutil.copytree(two_epoch_run, root / "a")
    return root


def test_evaluate_cli_takes_the_latest_step_unless_told_otherwise(two_checkpoints):
    """Without --steps only the last checkpoint of each run is evaluated (step 16 of
    steps 8 and 16), and the summary line counts it as new, none skipped."""
    saved = (two_checkpoints / "a" / "checkpoints").iterdir()
    assert sorted(int(p.name) for p in saved if p.is_dir()) == [8, 16]
    result = launch("evaluate.py", f"--runs={two_checkpoints}")
    assert result.returncode == 0, result.stderr[-2000:]
    records = evaluate.read_records(two_checkpoints / evaluate.RECORDS_FILE)
    assert [(r["run"], r["step"]) for r in records] == [("a", 16)]
    assert (
        "evaluated 1 checkpoint(s), skipped 0 already recorded, failed 0; 1 record(s) in "
        f"{two_checkpoints / evaluate.RECORDS_FILE}" in result.stdout
    )


def test_example2_writes_to_out_example2_by_default(tmp_path):
    """Without --out the worked example goes to out/example2 under the working folder,
    as its usage line says: three PNGs and a summary whose mixed operator has minimax
    fidelity 5/12."""
    result = launch("example2.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    out = tmp_path / "out" / "example2"
    assert result.stdout.strip().splitlines()[-1] == "figures and summary in out/example2/"
    assert sorted(p.name for p in out.glob("*.png")) == [
        "example2_head1.png",
        "example2_head2.png",
        "example2_mixed.png",
    ]
    summary = json.loads((out / "example2.json").read_text())
    assert summary["mixed"]["minimax_fidelity"] == pytest.approx(5 / 12, rel=1e-12)
