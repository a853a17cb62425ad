"""Small training runs made once per test run and shared: a run is a pure function of its
config, so every test that only reads a trained run can read the same one."""

import fcntl
import os
import shutil
from pathlib import Path

from beyondpar.study import train
from configs import smoke


def smoke_config(epochs: int | None = None, evaluation_extras: bool = True):
    """configs/smoke.py (8 epochs of 8 steps), with `epochs` and without the weight search
    and pruning curves of its evaluation unless `evaluation_extras`."""
    config = smoke.get_config()
    if epochs is not None:
        config.optim.num_epochs = epochs
    if not evaluation_extras:
        config.evaluation.update(optimal_weights=False, pruning=False)
    return config


def shared_folder(tmp_path_factory) -> Path:
    """A folder every process of this test run sees: the parent of the worker folders under
    pytest-xdist, this process's base folder without it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def trained_once(folder: Path, name: str, config) -> Path:
    """folder/name trained with `config`, trained by the first process that asks for it;
    the others wait on its lock and read it. Tests that change a run copy it first."""
    run, done = folder / f"trained-{name}", folder / f"trained-{name}.done"
    with open(folder / f"trained-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(run, ignore_errors=True)  # what a failed attempt left
            train.train_and_evaluate(config, str(run))
            done.touch()
    return run
