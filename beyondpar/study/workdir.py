"""A run's workdir: the files it holds, and the rule that it belongs to one experiment.

`prepare(path, config, step)`: a run resumed with a config that changes the model, the
data, the optimiser or the seed is refused before anything is written, naming every
differing field; changes that only extend or observe a run are allowed, appended with the
step to `config_history.jsonl`, and config.json is rewritten atomically (`settings.guard`).
One process per workdir: `base.locks.lock`.
"""

from __future__ import annotations

import os
from pathlib import Path

import ml_collections

from beyondpar.base import checks, files, settings

CONFIG_FILE = "config.json"  # the run's config, rewritten atomically on allowed changes
HISTORY_FILE = "config_history.jsonl"  # every allowed change, with the step it came at
CHECKPOINT_DIR = "checkpoints"  # orbax steps and their checksums
METRICS_FILE = "metrics.jsonl"  # one JSON line per logged step

# Fields a resumed run may change: they extend or observe it, never alter its numbers.
MUTABLE = (
    "optim.num_epochs",
    "eval_every_steps",
    "log_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "progress_bar",
    "evaluation.",
    "distributed.",
)


def is_mutable(field: str) -> bool:
    return any(field == m or (m.endswith(".") and field.startswith(m)) for m in MUTABLE)


def read_config(path: str | os.PathLike) -> dict:
    """A run's config.json; a garbled one is a ValueError naming the file."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise checks.path_error(file, f"a run folder must hold {CONFIG_FILE}, got none in {path}")
    return files.read_json(file)


def check(path: str | os.PathLike, config: ml_collections.ConfigDict) -> None:
    """Refuse a resume that would change the experiment, writing nothing: a run calls it
    before it builds the model, so that a refusal costs no initialisation."""
    path = Path(path)
    if (path / CONFIG_FILE).exists():
        settings.refuse_changes(read_config(path), _wanted(config), *_refusal(path), is_mutable)


def prepare(path: str | os.PathLike, config: ml_collections.ConfigDict, step: int) -> None:
    """Write config.json for a new run, or check and record a resumed run's changes."""
    path = Path(path)
    saved = read_config(path) if (path / CONFIG_FILE).exists() else None
    settings.guard(
        path / CONFIG_FILE,
        _wanted(config),
        *_refusal(path),
        free=is_mutable,
        saved=saved,
        history=path / HISTORY_FILE,
        step=step,
    )


def _wanted(config: ml_collections.ConfigDict) -> dict:
    return settings.json_form(config.to_dict())  # as config.json would hold it


def _refusal(path: Path) -> tuple[str, str]:
    """(holder, advice) of a refused resume's message."""
    return (
        f"workdir {path} holds another experiment; resuming it with this config would change",
        "use a new workdir, or the old values",
    )
