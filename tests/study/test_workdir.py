"""Trustworthy runs: one experiment and one process per workdir, damaged files named and
skipped, failed runs recorded, finite checkpoints, readable output."""

import contextlib
import ctypes
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import checkpoints, released
from beyondpar.base import files, locks, settings
from beyondpar.study import ablation, evaluate, report, train, workdir
from configs import ablation as ablation_config
from configs import smoke
from helpers.launchers import launch_many
from helpers.paths import DATA
from helpers.short_reference import short_reference

ROOT = Path(__file__).resolve().parents[2]
# A script of the batch given by its whole path (`launch_many` joins it to launch/).
FLOAT64_WARNING = ROOT / "tests" / "helpers" / "float64_warning.py"


def short():
    config = smoke.get_config()
    config.optim.num_epochs = 1  # 8 steps, checkpoints at 8
    config.evaluation.update(optimal_weights=False, pruning=False)
    return config


@pytest.fixture(scope="module")
def run(one_epoch_run, tmp_path_factory):
    """The shared run of `short()`, copied: a refused resume still takes its lock."""
    path = tmp_path_factory.mktemp("run") / "run"
    shutil.copytree(one_epoch_run, path)
    return path


def snapshot(path: Path) -> dict:
    """Every file but the lock (which holds the pid of the last process to take it)."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name != locks.LOCK_FILE)
    return {p: p.stat().st_mtime_ns for p in files}


LOCK_HOLDER = """
import sys, time
from beyondpar.base import locks
with locks.lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


@contextlib.contextmanager
def held_by_another_process(folder: Path):
    """A process holding `folder`'s lock until the block ends (then killed: a killed
    holder releases the lock); yields that process."""
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()


def damaged_tree(run: Path, root: Path) -> Path:
    """Three copies of `run` under `root`: good, bad_config (garbled config.json) and
    bad_checkpoint (its step 8 cut short)."""
    for name in ("good", "bad_config", "bad_checkpoint"):
        shutil.copytree(run, root / name)
    (root / "bad_config" / "config.json").write_text('{"model": ')
    for data in (root / "bad_checkpoint" / "checkpoints" / "8").rglob("d/*"):
        data.write_bytes(data.read_bytes()[:20])
    return root


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    """(a workdir, the process holding its lock): held from the command lines' batch until
    the test of a busy workdir kills its holder (one holder for the command line and the
    call in this process)."""
    folder = tmp_path_factory.mktemp("busy")
    with held_by_another_process(folder) as holder:
        yield folder, holder


@pytest.fixture(scope="module")
def command_lines(run, busy, tmp_path_factory):
    """The command lines of this file's tests that need nothing done between them, run as
    a user runs them but from one batch (`launch_many`: the launchers' libraries imported
    once, each command line in a process of its own): {test: (its result, its folder)}.
    `busy`'s workdir is held by another process while they run; `damaged` is evaluated
    twice, its records file starting with a valid JSON line that is not a record;
    `reference` is a folder of the released 1-head cycle checkpoint cut to 16 positions."""
    folder = {
        name: tmp_path_factory.mktemp(name)
        for name in ("overrides", "damaged", "nothing", "summary", "reference")
    }
    folder["busy"] = busy[0]
    folder["damaged_again"] = folder["damaged"]
    folder["float64"] = None
    damaged_tree(run, folder["damaged"])
    (folder["damaged"] / evaluate.RECORDS_FILE).write_text('{"hello": 1}\n')
    short_reference(folder["reference"] / "ref")
    cases = {
        "busy": ("train.py", ["--config=configs/smoke.py", f"--workdir={folder['busy']}"]),
        "overrides": (
            "ablate.py",
            [
                "--config=configs/ablation.py:base=smoke",
                "--config.overrides.optim__learning_rate=1e-2",
                f"--workdir={folder['overrides']}",
                "--dry_run",
            ],
        ),
        "damaged": ("evaluate.py", [f"--runs={folder['damaged']}"]),
        "damaged_again": ("evaluate.py", [f"--runs={folder['damaged']}"]),
        "nothing": ("evaluate.py", [f"--runs={folder['nothing']}"]),
        "reference": (
            "evaluate.py",
            [f"--reference={folder['reference'] / 'ref'}", f"--out={folder['reference'] / 'out'}"],
        ),
        "summary": (
            "train.py",
            [
                "--config=configs/smoke.py",
                f"--workdir={folder['summary']}",
                "--config.optim.num_epochs=1",
                "--config.model.num_layers=1",
                "--config.progress_bar=False",
            ],
        ),
    }
    # Not a launcher: a script of a user's own, which the batch runs as it runs them.
    cases["float64"] = (str(FLOAT64_WARNING), [])
    done = launch_many(list(cases.values()))
    return {name: (result, folder[name]) for name, result in zip(cases, done, strict=True)}


# ---------------------------------------------------------------- one experiment


@pytest.mark.parametrize(
    "change,listed",
    [
        (lambda c: c.model.update(num_heads=4), "model.num_heads: 2 -> 4"),
        (lambda c: c.model.update(mlp_dim=64), "model.mlp_dim: 32 -> 64"),
        (lambda c: c.optim.update(learning_rate=0.01), "optim.learning_rate: 0.003 -> 0.01"),
        (lambda c: c.update(seed=3), "seed: 0 -> 3"),
    ],
)
def test_resume_with_another_experiment_is_refused_before_writing(run, change, listed, monkeypatch):
    """Refused before anything is written, and before the model is built."""
    monkeypatch.setattr(train, "create_state", lambda *a: pytest.fail("built the model"))
    config = short()
    change(config)
    before = snapshot(run)
    with pytest.raises(ValueError, match=f"holds another experiment.*{listed}"):
        train.train_and_evaluate(config, str(run))
    assert snapshot(run) == before


@pytest.mark.parametrize("entry", ["check", "prepare"])
def test_check_and_prepare_refuse_with_one_message_and_write_nothing(tmp_path, entry):
    """Both entries to a workdir (`check` before the model is built, `prepare` after)
    refuse a changed experiment with the same whole message, writing nothing; a change
    that only extends the run passes `check` and writes nothing either."""
    workdir.prepare(tmp_path, short(), 0)
    before = snapshot(tmp_path)
    changed = short()
    changed.model.num_heads = 4
    message = (
        f"workdir {tmp_path} holds another experiment; resuming it with this config would "
        "change (model.num_heads: 2 -> 4); use a new workdir, or the old values"
    )
    refuse = {"check": workdir.check, "prepare": lambda p, c: workdir.prepare(p, c, 8)}[entry]
    with pytest.raises(ValueError) as refused:
        refuse(tmp_path, changed)
    assert str(refused.value) == message
    assert snapshot(tmp_path) == before
    extended = short()
    extended.optim.num_epochs = 2
    workdir.check(tmp_path, extended)
    assert snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def extended(run, tmp_path_factory):
    """A copy of the shared run extended to a second epoch, logged and saved every 4 steps
    (saves at 12 and 16, two kept): one training for the tests that read an extension."""
    path = tmp_path_factory.mktemp("extended") / "run"
    shutil.copytree(run, path)
    config = short()
    config.optim.num_epochs = 2
    config.log_every_steps = 4
    config.checkpoint_every_steps = 4
    train.train_and_evaluate(config, str(path))
    return path


def test_extending_a_run_is_recorded_in_its_history(extended):
    history = [json.loads(x) for x in (extended / "config_history.jsonl").read_text().splitlines()]
    changes = {
        "checkpoint_every_steps": [8, 4],
        "log_every_steps": [8, 4],
        "optim.num_epochs": [1, 2],
    }
    assert history == [{"step": 8, "changes": changes}]
    assert json.loads((extended / "config.json").read_text())["optim"]["num_epochs"] == 2
    assert checkpoints.list_steps(extended / "checkpoints")[-1] == 16


def test_observing_fields_may_change_and_every_change_is_kept(run, tmp_path):
    """`evaluation.*` and the intervals observe a run: a resume may change them, and each
    resume's changes append one line to the history (earlier lines are kept)."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = short()
    config.evaluation.num_sequences = 4
    config.evaluation.horizon = 10
    train.train_and_evaluate(config, str(copy))
    config.keep_checkpoints = 5
    config.evaluation.num_sequences = 6
    train.train_and_evaluate(config, str(copy))
    history = [json.loads(x) for x in (copy / "config_history.jsonl").read_text().splitlines()]
    assert history == [
        {
            "step": 8,
            "changes": {"evaluation.horizon": [20, 10], "evaluation.num_sequences": [8, 4]},
        },
        {"step": 8, "changes": {"evaluation.num_sequences": [4, 6], "keep_checkpoints": [2, 5]}},
    ]
    assert json.loads((copy / "config.json").read_text())["evaluation"]["num_sequences"] == 6


def test_history_records_the_step_of_the_newest_checkpoint(two_epoch_run, tmp_path):
    """A workdir with checkpoints at 8 and 16 (the shared two-epoch run) resumed with
    more epochs: the change is recorded at step 16, where the resumed run starts, not at
    the oldest kept step nor the new last one."""
    copy = tmp_path / "run"
    shutil.copytree(two_epoch_run, copy)
    assert checkpoints.list_steps(copy / "checkpoints") == [8, 16]
    assert not (copy / "config_history.jsonl").exists()
    config = short()
    config.optim.num_epochs = 3
    train.train_and_evaluate(config, str(copy))
    history = [json.loads(x) for x in (copy / "config_history.jsonl").read_text().splitlines()]
    assert history == [{"step": 16, "changes": {"optim.num_epochs": [2, 3]}}]


def test_nan_loss_after_a_resume_names_the_checkpoint_it_resumed_from(run, tmp_path, monkeypatch):
    """Resumed from step 8 and stopped by a NaN loss at step 11, before any new save: the
    message names step 8 as the last good checkpoint, and nothing newer is saved."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    real = train.make_train_step

    def poisoned(*args):
        step_fn = real(*args)

        def wrapped(state, batch):
            new, loss = step_fn(state, batch)
            return new, (nan_like(loss) if int(new["step"]) == 11 else loss)

        return wrapped

    monkeypatch.setattr(train, "make_train_step", poisoned)
    config = short()
    config.optim.num_epochs = 2
    with pytest.raises(
        FloatingPointError,
        match="loss is nan at step 11; stopped, the last good checkpoint is step 8",
    ):
        train.train_and_evaluate(config, str(copy))
    assert checkpoints.list_steps(copy / "checkpoints") == [8]


def test_workdir_change_rules_field_by_field():
    assert workdir.is_mutable("evaluation.walk") and workdir.is_mutable("distributed.process_id")
    assert workdir.is_mutable("optim.num_epochs") and workdir.is_mutable("keep_checkpoints")
    for fixed in ("evaluation", "evaluationx.walk", "optim.num_epochs_x", "optim.learning_rate"):
        assert not workdir.is_mutable(fixed), fixed
    assert settings.changes({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 4}) == {
        "a.c": (2, 3),
        "d": (None, 4),
    }


def test_checksums_follow_checkpoint_rotation(extended, tmp_path):
    """keep_checkpoints = 2: after three saves (8, then 12 and 16: `extended`) only the
    two newest steps remain, and the checksums file holds exactly theirs, so a damaged
    kept step is caught."""
    copy = tmp_path / "run"
    shutil.copytree(extended, copy)  # its checksums file is damaged below
    folder = copy / "checkpoints"
    assert checkpoints.list_steps(folder) == [12, 16]
    sums = json.loads((folder / "checksums.json").read_text())
    assert set(sums) == {"12", "16"}
    for step in (12, 16):
        _, state = checkpoints.load(folder, step)
        assert checkpoints.checksum(state) == sums[str(step)]
    sums["12"] = "f" * 64
    (folder / "checksums.json").write_text(json.dumps(sums))
    with pytest.raises(checkpoints.CheckpointError, match="step 12 does not match its checksum"):
        checkpoints.load(folder, 12)


def test_a_busy_workdir_stops_a_second_process_at_once(command_lines, busy):
    """The command line's workdir, still held: refused in this process too, at once."""
    folder, holder = busy
    start = time.perf_counter()
    with pytest.raises(locks.FolderBusy, match=f"workdir {folder} is in use .*pid {holder.pid}"):
        train.train_and_evaluate(short(), str(folder))
    assert time.perf_counter() - start < 5
    assert not (folder / "checkpoints").exists() and not (folder / "metrics.jsonl").exists()
    cli, _ = command_lines["busy"]
    assert cli.returncode == 2 and "is in use by another process" in cli.stderr
    holder.kill()  # a killed holder releases the lock
    holder.wait()
    with locks.lock(folder), locks.lock(folder):  # free again, and re-entrant
        pass


# ---------------------------------------------------------------- ablations


def smoke_grid(**levels):
    config = ablation_config.get_config("base=smoke")
    config.levels.task = ("copy",)
    config.levels.update(**levels)
    config.overrides.optim__num_epochs = 1
    config.overrides.evaluation__optimal_weights = False
    config.overrides.evaluation__pruning = False
    return config


def test_invalid_grid_points_are_listed_before_any_training(tmp_path):
    config = smoke_grid(heads=(2, 3, 5))
    for call in (ablation.run, ablation.dry_run):
        with pytest.raises(
            ValueError, match="2 of 3 grid points are invalid; nothing was trained"
        ) as err:
            call(config, tmp_path)
        assert (
            "heads-3_seed-0_task-copy: num_heads must divide embed_dim=16, got num_heads=3"
            in str(err.value)
        )
        assert "heads-5_seed-0_task-copy" in str(err.value)
    assert not list(tmp_path.iterdir())
    config = smoke_grid(heads=(2,))
    config.overrides.evaluation__walk = "lazy"
    with pytest.raises(
        ValueError,
        match=r"evaluation.walk must be one of \('reference', 'normalized'\), got 'lazy'",
    ):
        ablation.run(config, tmp_path)


# A failure of each kind, each at its own grid point; heads=2 trains.
FAILURES = {
    1: FloatingPointError("training loss is nan at step 3; stopped, no checkpoint saved yet"),
    4: RuntimeError("out of memory allocating 4 GB"),
    8: OSError(28, "No space left on device"),
}


def test_failed_runs_are_recorded_and_the_grid_goes_on(run, tmp_path, monkeypatch):
    def failing(config, path):
        if config.model.num_heads in FAILURES:
            raise FAILURES[config.model.num_heads]
        # heads=2 is the shared run's experiment (it differs in observing fields at most):
        # a copy of that run stands for training it.
        saved = json.loads((run / workdir.CONFIG_FILE).read_text())
        changed = settings.changes(saved, json.loads(config.to_json()))
        assert all(workdir.is_mutable(k) for k in changed), changed
        shutil.copytree(run, path, dirs_exist_ok=True)

    monkeypatch.setattr(train, "train_and_evaluate", failing)
    written, failures = ablation.run(smoke_grid(heads=(1, 2, 4, 8)), tmp_path, progress=False)
    named = {h: f"heads-{h}_seed-0_task-copy" for h in FAILURES}
    assert failures == [(named[h], f"{type(e).__name__}: {e}") for h, e in FAILURES.items()]
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Failed" in text
    for heads, error in FAILURES.items():
        assert f"- {named[heads]}: {type(error).__name__}" in text
    assert "| layer | H=2 |" in text  # the rest is reported


def test_overrides_from_the_command_line(command_lines):
    result, _ = command_lines["overrides"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("--config.optim.learning_rate=0.01") == 8


# ---------------------------------------------------------------- damaged files


def test_damaged_latest_checkpoint_is_skipped_on_resume(two_epoch_run, tmp_path, capfd):
    """The shared two-epoch run (steps 8 and 16) with step 16 cut short, resumed with a
    third epoch: step 16 is named and set aside, and the run goes on from step 8."""
    copy = tmp_path / "run"
    shutil.copytree(two_epoch_run, copy)
    for data in (copy / "checkpoints" / "16").rglob("d/*"):
        data.write_bytes(data.read_bytes()[:20])
    capfd.readouterr()
    config = short()
    config.optim.num_epochs = 3
    train.train_and_evaluate(config, str(copy))
    err = capfd.readouterr().err
    assert f"{copy}: checkpoint step 16 is unreadable" in err
    assert f"{copy}: resuming from step 8" in err
    assert len(err.strip().splitlines()) == 2, err[:3000]
    assert checkpoints.list_steps(copy / "checkpoints") == [16, 24]
    assert (copy / "damaged_checkpoints" / "step16").is_dir()


# A thread that holds the interpreter while it sleeps: a C call through `ctypes.PyDLL`
# keeps the GIL, so the other threads wait for it as they would for a busy one, while the
# machine's cores stay free (threads that computed to stay busy burnt a whole core for the
# test's 5 to 10 seconds).
GIL_HOLD_US = 5_000


@contextlib.contextmanager
def interpreter_held(threads: int = 4):
    """`threads` threads taking turns holding the interpreter until the block ends."""
    libc, busy = ctypes.PyDLL(None), [True]

    def hold():
        while busy[0]:
            libc.usleep(GIL_HOLD_US)

    holders = [threading.Thread(target=hold) for _ in range(threads)]
    for thread in holders:
        thread.start()
    try:
        yield
    finally:
        busy[0] = False
        for thread in holders:
            thread.join()


def test_a_failed_read_leaves_no_late_reports_on_a_busy_machine(run, tmp_path):
    """Orbax's abandoned reads report "Event loop is closed" as they finish; on a busy
    machine (threads holding the interpreter here) that comes late. None may reach the
    program's hooks after the one-line error."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for data in (copy / "checkpoints" / "8").rglob("d/*"):
        data.write_bytes(data.read_bytes()[:20])
    late = []
    hook = sys.unraisablehook
    sys.unraisablehook = late.append
    try:
        with interpreter_held():
            for _ in range(2):  # a second read meets the first one's late reports, if any
                with pytest.raises(checkpoints.CheckpointError, match="step 8 is unreadable"):
                    checkpoints.load(copy / "checkpoints")
                time.sleep(1.0)
    finally:
        gc.collect()
        sys.unraisablehook = hook
    assert [str(r.exc_value) for r in late] == []


def test_a_good_read_runs_no_full_collection_and_leaves_nothing_to_report(run):
    """Only a failed read needs a full collection (to finalise its abandoned reads while
    their reports are swallowed): in a process holding many programs one costs a second."""
    full, late = [], []
    hook = sys.unraisablehook
    sys.unraisablehook = late.append
    gc.disable()  # automatic collections off: a full one seen here is the loader's own
    gc.callbacks.append(lambda phase, info: full.append(info["generation"] == 2))
    try:
        step, state = checkpoints.load(run / "checkpoints")
    finally:
        gc.callbacks.pop()
        gc.enable()
    try:
        gc.collect()  # a good read's leftovers, if any, report now
    finally:
        sys.unraisablehook = hook
    stored = json.loads((run / "checkpoints" / "checksums.json").read_text())
    assert (step, any(full), late) == (8, False, [])
    assert checkpoints.checksum(state) == stored["8"]


def test_checksum_mismatch_and_flipped_bits_never_load(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    sums = copy / "checkpoints" / "checksums.json"
    stored = json.loads(sums.read_text())
    assert set(stored) == {"8"}
    sums.write_text(json.dumps({"8": "0" * 64}))
    with pytest.raises(checkpoints.CheckpointError, match="step 8 does not match its checksum"):
        checkpoints.load(copy / "checkpoints")
    sums.write_text(json.dumps(stored))
    _, good = checkpoints.load(copy / "checkpoints")
    assert checkpoints.checksum(good) == stored["8"]
    for data in (copy / "checkpoints" / "8").rglob("d/*"):
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        data.write_bytes(bytes(raw))
    with pytest.raises(checkpoints.CheckpointError, match="step 8"):
        checkpoints.load(copy / "checkpoints")


def test_evaluation_names_damaged_files_and_goes_on(command_lines):
    result, root = command_lines["damaged"]
    assert result.returncode == 1
    out = result.stdout
    assert "evaluated 1 checkpoint(s), skipped 0 already recorded, failed 2" in out
    assert (
        f"FAILED bad_config@8: ValueError: {root / 'bad_config' / 'config.json'} is not valid JSON"
        in out
    )
    assert "FAILED bad_checkpoint@8: CheckpointError: step 8 is unreadable" in out
    assert f"wrote {root / 'report' / 'report.md'}" in out
    assert len(result.stderr.splitlines()) < 20, result.stderr[-3000:]
    # A valid JSON line that is not a record: named, skipped, the rest reported, and the
    # evaluated run skipped when evaluated again.
    not_a_record = f"skipped {root / evaluate.RECORDS_FILE}:1: not a record"
    assert not_a_record in out
    again, _ = command_lines["damaged_again"]
    assert not_a_record in again.stdout
    assert "evaluated 0 checkpoint(s), skipped 1 already recorded, failed 2" in again.stdout


def test_evaluate_cli_on_reference(command_lines):
    """`launch/evaluate.py --reference` on a folder holding the released 1-head cycle
    checkpoint cut to 16 positions (the same weights and file name; the paper's 100
    positions cost seconds of metrics and say nothing more about the command line). What
    the launcher prints and returns for failed checkpoints is tests/test_launchers.py's."""
    result, folder = command_lines["reference"]
    assert result.returncode == 0, result.stderr[-2000:]
    out = folder / "out"
    records = [json.loads(ln) for ln in (out / "records.jsonl").read_text().splitlines()]
    assert [r["run"] for r in records] == ["1_heads_cycle.npz"]
    assert "## Task: cycle" in (out / "report.md").read_text()


def test_nothing_to_evaluate_is_an_error(command_lines):
    result, empty = command_lines["nothing"]
    assert result.returncode == 2
    assert (
        f"no runs under {empty}: looked for folders holding config.json and checkpoints/"
        in result.stderr
    )


@pytest.fixture(scope="module")
def damaged_references(tmp_path_factory):
    """(records, failures) of a folder of the released cycle model's first layer at 16
    tokens, a 4_heads_copy.npz cut short and a 2_heads_copy.npz of garbage."""
    folder = tmp_path_factory.mktemp("references")
    short_reference(folder, layers=1)
    (folder / "4_heads_copy.npz").write_bytes((DATA / "4_heads_copy.npz").read_bytes()[:1000])
    (folder / "2_heads_copy.npz").write_bytes(b"garbage" * 100)
    return evaluate.evaluate_reference_folder(
        folder, evaluate.EvalSpec(num_sequences=2, pruning=False, optimal_weights=False)
    )


def test_damaged_reference_files_are_named(damaged_references):
    records, failures = damaged_references
    assert [r["run"] for r in records] == ["1_heads_cycle.npz"]
    assert records[0]["step"] is None and records[0]["seed"] is None
    assert [name for name, _ in failures] == ["2_heads_copy.npz", "4_heads_copy.npz"]
    assert all(message.startswith("unreadable: ") for _, message in failures)


def test_a_reference_file_of_an_unknown_task_is_named_for_its_task_not_as_unreadable(
    tmp_path, capsys
):
    shutil.copy(DATA / "1_heads_cycle.npz", tmp_path / "1_heads_zzz.npz")
    shutil.copy(DATA / "1_heads_cycle.npz", tmp_path / "x_heads_copy.npz")
    spec = evaluate.EvalSpec(num_sequences=2, pruning=False, optimal_weights=False)
    records, failures = evaluate.evaluate_reference_folder(tmp_path, spec)
    bar = capsys.readouterr().err
    assert "evaluating: 100%" in bar and "2/2" in bar
    assert records == []
    assert dict(failures) == {
        "1_heads_zzz.npz": (
            "path '1_heads_zzz.npz' must name a task of ('copy', 'cycle', 'zero', 'shift', "
            "'pair_sum', 'induction') after '_heads_', got 'zzz'"
        ),
        "x_heads_copy.npz": (
            "path must be named <H>_heads_<task>.npz or .pt, got 'x_heads_copy.npz'"
        ),
    }


def test_a_reference_failure_is_one_line(tmp_path, monkeypatch):
    """A reading error of several lines is named by its first, after 'unreadable:'."""
    (tmp_path / "4_heads_copy.npz").write_bytes(b"")

    def fails(path, spec):
        raise OSError("cannot read the archive\nsecond line\nthird line")

    monkeypatch.setattr(evaluate, "evaluate_reference", fails)
    records, failures = evaluate.evaluate_reference_folder(tmp_path, progress=False)
    assert records == []
    assert failures == [("4_heads_copy.npz", "unreadable: OSError: cannot read the archive")]


# ---------------------------------------------------------------- NaN


def test_non_finite_state_is_never_saved(tmp_path, monkeypatch):
    real = train.make_train_step

    def poisoned(*args):
        step_fn = real(*args)

        def wrapped(state, batch):
            new, loss = step_fn(state, batch)
            if int(new["step"]) >= 8:  # the loss stays finite: only the state goes bad
                new["opt_state"] = jax.tree.map(nan_like, new["opt_state"])
            return new, loss

        return wrapped

    monkeypatch.setattr(train, "make_train_step", poisoned)
    with pytest.raises(
        FloatingPointError,
        match="not finite at step 8; stopped before saving them, no checkpoint saved yet",
    ):
        train.train_and_evaluate(short(), str(tmp_path))
    assert checkpoints.list_steps(tmp_path / "checkpoints") == []


def nan_like(x):
    """`x` with every float set to NaN, placed as `x` is (put, not computed: no program
    is compiled for it); other dtypes unchanged."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    return jax.device_put(np.full(x.shape, np.nan, x.dtype), x.sharding)


def test_train_cli_ends_with_one_summary_line(command_lines):
    result, workdir = command_lines["summary"]
    assert result.returncode == 0, result.stderr[-2000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("trained copy H=2 to step 8 in ") and f"workdir {workdir}" in last
    assert "Unable to initialize backend" not in result.stdout + result.stderr


def test_float64_in_float32_mode_warns_once(command_lines):
    out, _ = command_lines["float64"]
    assert out.returncode == 0, out.stderr[-2000:]
    x64_after_import, printed = out.stdout.split("\n", 1)
    # x64 as the environment set it: importing beyondpar switched nothing on.
    asked = os.environ.get("JAX_ENABLE_X64", "0").lower() in ("1", "true", "yes", "on")
    assert x64_after_import == str(asked)
    count, message = printed.split(" ", 1)
    assert count == "1" and "float64 but JAX runs in float32 mode" in message


def test_report_of_reference_records_shows_no_placeholders(damaged_references):
    """The record of the released cycle model's first layer, evaluated on 16 tokens."""
    records, _ = damaged_references
    text = report.markdown(records)
    assert "| 1_heads_cycle.npz | - | cycle | 1 | - |" in text
    assert "Single-head models only: nothing to mix." in text
    assert np.isfinite(records[0]["metrics"]["fidelity"]["mean"]).all()


def test_a_damaged_npz_is_named_and_its_file_closed(tmp_path):
    import warnings

    good = files.read_npz(DATA / "1_heads_cycle.npz")
    assert good.keys() == dict(np.load(DATA / "1_heads_cycle.npz")).keys()
    cut = tmp_path / "cut.npz"
    cut.write_bytes((DATA / "4_heads_copy.npz").read_bytes()[:1000])
    single = tmp_path / "single.npz"
    np.save(tmp_path / "single.npy", np.ones(3))
    (tmp_path / "single.npy").rename(single)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for path in (cut, single):
            with pytest.raises(Exception) as err:
                released.read_state_dict(path)
            del err
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    with pytest.raises(ValueError, match="single.npz must be an .npz archive"):
        files.read_npz(single)


@pytest.mark.parametrize("damage", [b'{"model": ', b"\xff\xfe not text", b"[1, 2]"])
def test_a_damaged_config_json_is_one_error_naming_it(tmp_path, damage):
    (tmp_path / workdir.CONFIG_FILE).write_bytes(damage)
    with pytest.raises(ValueError) as err:
        workdir.read_config(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / workdir.CONFIG_FILE} ")
