"""Ablations: the grid, dry runs, resumption without retraining, the CLI."""

import json
import shutil
from pathlib import Path

import pytest

from beyondpar import checkpoints
from beyondpar.study import ablation, config_lib, evaluate, train
from configs import ablation as ablation_config
from helpers.launchers import launch_many


def smoke_ablation():
    config = ablation_config.get_config("base=smoke")
    config.levels.heads = (1, 2)
    config.levels.task = ("copy",)
    config.overrides.optim__num_epochs = 2
    # Tested on their own (test_evaluate, test_pruning_curves, test_report); here the grid,
    # its resumption and its report are what is checked.
    config.overrides.evaluation__pruning = False
    config.overrides.evaluation__optimal_weights = False
    return config


def test_default_grid_is_the_papers():
    points = ablation.grid(ablation_config.get_config("seeds=2"))
    assert len(points) == 4 * 2 * 2
    assert {p["heads"] for p in points} == {1, 4, 8, 16}
    assert {p["task"] for p in points} == {"copy", "cycle"}
    config = ablation.run_config(ablation_config.get_config(), points[0])
    assert config.task.seq_len == 32  # the CPU base


def test_dry_run_prints_train_commands(tmp_path):
    commands = ablation.dry_run(smoke_ablation(), tmp_path)
    assert len(commands) == 2
    assert "--config.model.num_heads=2" in commands[1]
    assert "--config.optim.num_epochs=2" in commands[1]
    assert f"--workdir={tmp_path}/heads-2_seed-0_task-copy" in commands[1]
    assert commands[0].startswith("python launch/train.py --config=")


def two_task_ablation():
    """Two runs of one model (H=2 on copy and on cycle), one layer and one epoch each:
    the grid, its resumption and its report, with every program compiled once for both
    runs (a second layer would only lengthen each program's compile)."""
    config = smoke_ablation()
    config.levels.heads = (2,)
    config.levels.task = ("copy", "cycle")
    config.overrides.optim__num_epochs = 1
    config.overrides.model__num_layers = 1
    return config


COPY, CYCLE = "heads-2_seed-0_task-copy", "heads-2_seed-0_task-cycle"


@pytest.fixture(scope="module")
def resumed_grid(tmp_path_factory):
    """`two_task_ablation` killed while training its second run, then run again: (folder,
    the runs training was asked for, the first run's checkpoint time before the resume,
    what the resumed `run` returned). The CLI test starts from its trained cycle run."""
    root, trained = tmp_path_factory.mktemp("grid"), []
    real_train = train.train_and_evaluate

    def counting(config, workdir):
        trained.append(Path(workdir).name)
        if len(trained) == 2:
            raise KeyboardInterrupt  # killed while training the second run
        return real_train(config, workdir)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train, "train_and_evaluate", counting)
        with pytest.raises(KeyboardInterrupt):
            ablation.run(two_task_ablation(), root, progress=False)
        stamp = (root / COPY / "checkpoints" / "8").stat().st_mtime_ns
        result = ablation.run(two_task_ablation(), root, progress=False)
    return root, trained, stamp, result


@pytest.mark.slow
def test_interrupted_ablation_resumes_without_retraining(resumed_grid, monkeypatch):
    tmp_path, trained, stamp, (written, failures) = resumed_grid
    first, second = tmp_path / COPY, tmp_path / CYCLE
    assert trained == [first.name, second.name, second.name]
    assert failures == []
    assert (first / "checkpoints" / "8").stat().st_mtime_ns == stamp
    assert checkpoints.list_steps(second / "checkpoints")[-1] == 8
    records = evaluate.read_records(tmp_path / evaluate.RECORDS_FILE)
    assert sorted(r["task"] for r in records) == ["copy", "cycle"]
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Task: copy" in text and "## Task: cycle" in text
    assert "| layer | H=2 |" in text
    assert {p.name for p in written} >= {
        "report.md",
        "results.csv",
        "metrics_vs_heads.png",
        "index.html",
    }
    # A third run trains and evaluates nothing.
    again = []
    monkeypatch.setattr(train, "train_and_evaluate", lambda c, w: again.append(Path(w).name))
    ablation.run(two_task_ablation(), tmp_path, progress=False)
    assert again == [] and len(evaluate.read_records(tmp_path / evaluate.RECORDS_FILE)) == 2


def test_bad_grid():
    config = smoke_ablation()
    config.axes.heads = "model.num_head"
    with pytest.raises(
        ValueError, match=r"axes.heads must name a config field, got 'model.num_head'"
    ):
        ablation.run_config(config, {"heads": 2})
    config = smoke_ablation()
    config.overrides.optim__num_epoch = 1
    with pytest.raises(ValueError, match=r"overrides.optim__num_epoch must name a config field"):
        ablation.run_config(config, {"heads": 2})
    with pytest.raises(FileNotFoundError, match="base config must be an existing file"):
        config_lib.load_config_file("configs/nope.py")


def test_each_grid_point_gets_its_own_copy_of_the_base_config():
    configs = ablation.validated_configs(smoke_ablation())
    assert sorted(c.model.num_heads for c in configs.values()) == [1, 2]
    assert all(c.optim.num_epochs == 2 for c in configs.values())
    assert len({id(c) for c in configs.values()}) == 2


def test_a_missing_base_config_is_one_error_for_the_whole_grid(tmp_path):
    config = smoke_ablation()
    config.base = str(tmp_path / "nope.py")
    with pytest.raises(FileNotFoundError, match=r"^base config must be an existing file") as err:
        ablation.dry_run(config, tmp_path / "runs")
    assert isinstance(err.value, ValueError) and "grid points" not in str(err.value)


@pytest.mark.slow
def test_ablate_cli(resumed_grid, tmp_path):
    """The dry run and the run, from one batch of command lines (`launch_many`); the dry
    run is given a workdir of its own, where it may write nothing. The run's folder starts
    with the grid's trained and evaluated cycle run (the same config: one layer, one
    epoch), which the CLI's flags must name exactly for it to be found finished and
    recorded: the CLI writes the report from it, training and evaluating nothing (both
    are the in-process grid's, and `launch/evaluate.py`'s in tests/test_launchers_study.py)."""
    flags = [
        "--config=configs/ablation.py:base=smoke",
        "--config.levels.heads=(2,)",
        "--config.levels.task=('cycle',)",
        "--config.overrides.optim__num_epochs=1",
        "--config.overrides.model__num_layers=1",
        "--config.overrides.evaluation__pruning=False",
        "--config.overrides.evaluation__optimal_weights=False",
    ]
    dry_dir, run_dir = tmp_path / "dry", tmp_path / "run"
    shutil.copytree(resumed_grid[0] / CYCLE, run_dir / CYCLE)
    lines = (resumed_grid[0] / evaluate.RECORDS_FILE).read_text().splitlines(keepends=True)
    recorded = "".join(line for line in lines if json.loads(line)["run"] == CYCLE)
    (run_dir / evaluate.RECORDS_FILE).write_text(recorded)
    saved = run_dir / CYCLE / "checkpoints" / "8"
    stamp = saved.stat().st_mtime_ns
    dry, result = launch_many(
        [
            ("ablate.py", [*flags, f"--workdir={dry_dir}", "--dry_run"]),
            ("ablate.py", [*flags, f"--workdir={run_dir}"]),
        ]
    )
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert dry.stdout.count("launch/train.py") == 1 and not dry_dir.exists()
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"wrote {run_dir / 'report' / 'report.md'}" in result.stdout
    assert "## Task: cycle" in (run_dir / "report" / "report.md").read_text()
    assert checkpoints.list_steps(run_dir / CYCLE / "checkpoints") == [8]
    assert saved.stat().st_mtime_ns == stamp
    assert recorded.count("\n") == 1
    assert (run_dir / evaluate.RECORDS_FILE).read_text() == recorded  # none added


def test_run_reports_training_and_evaluation_failures_together(tmp_path, monkeypatch):
    """A run whose training raises is named with the first line of its error, the other
    runs still train, and a run left without a checkpoint is reported by evaluation: both
    kinds of failure come back from `run`, training's first, and a run whose training
    failed before its first checkpoint is named once, by its training error."""
    study = ablation_config.get_config()
    study.levels.task = ("cycle",)
    study.levels.heads = (1, 2)
    study.levels.seed = (3,)
    trained = []

    def fake_train(config, workdir):
        trained.append((config.model.num_heads, config.seed, Path(workdir).name))
        (Path(workdir) / "checkpoints").mkdir(parents=True)
        (Path(workdir) / "config.json").write_text(json.dumps(config.to_dict()))
        if config.model.num_heads == 1:
            raise RuntimeError("loss is NaN at step 7\nTraceback details")

    monkeypatch.setattr(train, "train_and_evaluate", fake_train)
    written, failures = ablation.run(study, tmp_path, progress=False)
    assert trained == [(1, 3, "heads-1_seed-3_task-cycle"), (2, 3, "heads-2_seed-3_task-cycle")]
    assert written == []
    assert failures == [
        ("heads-1_seed-3_task-cycle", "RuntimeError: loss is NaN at step 7"),
        ("heads-2_seed-3_task-cycle@?", "FileNotFoundError: no checkpoint saved"),
    ]


def test_grid_values_are_cast_to_the_type_of_the_field():
    run = ablation.run_config(smoke_ablation(), {"heads": "2", "seed": "1", "task": "copy"})
    assert run.model.num_heads == 2 and type(run.model.num_heads) is int
    assert run.seed == 1 and type(run.seed) is int


def test_a_bad_steps_value_is_refused_before_anything_trains(tmp_path, monkeypatch):
    """`steps` is read only when the trained grid is evaluated; a typo in it is refused
    by the dry run and before the first run trains."""
    monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: pytest.fail("trained"))
    config = smoke_ablation()
    config.steps = "some"
    message = r"^steps must be 'latest' or 'all', got 'some'$"
    with pytest.raises(ValueError, match=message):
        ablation.dry_run(config, tmp_path)
    with pytest.raises(ValueError, match=message):
        ablation.run(config, tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []
