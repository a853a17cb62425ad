"""The study launchers as a user runs them: what a flag left at its default does, where
the output goes, and the exit status and message of a run that goes wrong."""

import json
import os
import shutil

import pytest

from beyondpar.study import evaluate
from helpers.launchers import launch_many
from helpers.paths import ROOT

SMOKE = ROOT / "configs" / "smoke.py"


@pytest.fixture(scope="module")
def launched(two_epoch_run, tmp_path_factory):
    """Each test's command line, all run from one batch (`launch_many`: the launchers'
    libraries imported once) in an empty working folder, this checkout first on the path:
    {test: (its result, the folder it was told to write in)}. The evaluated runs folder
    holds one smoke run saved at steps 8 and 16."""
    cwd, runs = tmp_path_factory.mktemp("cwd"), tmp_path_factory.mktemp("runs")
    shutil.copytree(two_epoch_run, runs / "a")
    diverged, misspelt = tmp_path_factory.mktemp("diverged"), tmp_path_factory.mktemp("misspelt")
    cases = {
        "diverged": (
            "train.py",
            [f"--config={SMOKE}", f"--workdir={diverged / 'run'}"]
            + ["--config.optim.learning_rate=1e30", "--config.optim.num_epochs=1"]
            # One layer: the loss is NaN at step 2 all the same, and half the layers compile.
            + ["--config.progress_bar=False", "--config.model.num_layers=1"],
            diverged / "run",
        ),
        "misspelt": (
            "train.py",
            [f"--config={SMOKE}", "--config.optim.learnin_rate=0.1", f"--workdir={misspelt}"],
            misspelt,
        ),
        "evaluate": ("evaluate.py", [f"--runs={runs}"], runs),
        "example2": ("example2.py", [], cwd / "out" / "example2"),
    }
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", path)
        done = launch_many([(script, flags) for script, flags, _ in cases.values()], cwd=cwd)
    return {name: (d, case[2]) for (name, case), d in zip(cases.items(), done, strict=True)}


def test_train_cli_stops_a_diverged_run_with_status_2(launched):
    """A learning rate of 1e30 makes the loss NaN within the first steps: the launcher
    must exit with status 2 and one `error:` line naming the step and the last good
    checkpoint, so that a scheduler sees the run as failed rather than finished."""
    result, _ = launched["diverged"]
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert errors[0].startswith("error: training loss is nan at step ")
    assert errors[0].endswith("stopped, no checkpoint saved yet")
    assert "trained copy" not in result.stdout  # no summary line for a failed run


def test_train_cli_rejects_misspelt_override(launched):
    result, workdir = launched["misspelt"]
    assert result.returncode != 0
    assert "learnin_rate" in result.stderr
    assert not (workdir / "config.json").exists()


def test_evaluate_cli_takes_the_latest_step_unless_told_otherwise(launched):
    """Without --steps only the last checkpoint of each run is evaluated (step 16 of
    steps 8 and 16), and the summary line counts it as new, none skipped."""
    result, runs = launched["evaluate"]
    saved = (runs / "a" / "checkpoints").iterdir()
    assert sorted(int(p.name) for p in saved if p.is_dir()) == [8, 16]
    assert result.returncode == 0, result.stderr[-2000:]
    records = evaluate.read_records(runs / evaluate.RECORDS_FILE)
    assert [(r["run"], r["step"]) for r in records] == [("a", 16)]
    assert (
        "evaluated 1 checkpoint(s), skipped 0 already recorded, failed 0; 1 record(s) in "
        f"{runs / evaluate.RECORDS_FILE}" in result.stdout
    )


def test_example2_writes_to_out_example2_by_default(launched):
    """Without --out the worked example goes to out/example2 under the working folder,
    as its usage line says: three PNGs and a summary whose mixed operator has minimax
    fidelity 5/12."""
    result, out = launched["example2"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "figures and summary in out/example2/"
    assert sorted(p.name for p in out.glob("*.png")) == [
        "example2_head1.png",
        "example2_head2.png",
        "example2_mixed.png",
    ]
    summary = json.loads((out / "example2.json").read_text())
    assert summary["mixed"]["minimax_fidelity"] == pytest.approx(5 / 12, rel=1e-12)
