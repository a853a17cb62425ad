"""A workdir belongs to one experiment and one process at a time.

- `lock(path)`: an advisory file lock (released by the kernel when the process dies);
  a second process on a busy workdir stops at once. Re-entrant within a process, so an
  ablation that holds its folder can evaluate it.
- `prepare(path, config, step)`: a run resumed with a config that changes the model, the
  data, the optimiser or the seed is refused before anything is written, naming every
  differing field; changes that only extend or observe a run are allowed, appended with
  the step to `config_history.jsonl`, and config.json is rewritten atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

import ml_collections

from beyondpar import files
from beyondpar.config_lib import flatten
from beyondpar.run_layout import CONFIG_FILE, HISTORY_FILE, LOCK_FILE

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

_held: dict[Path, tuple[int, int]] = {}  # path -> (fd, depth)


class WorkdirBusy(RuntimeError):
    """Another process holds the workdir."""


@contextlib.contextmanager
def lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold `path`'s lock for the block; a busy workdir raises WorkdirBusy at once."""
    path = Path(path).absolute()
    if path in _held:
        fd, depth = _held[path]
        _held[path] = (fd, depth + 1)
        try:
            yield
        finally:
            _held[path] = (fd, _held[path][1] - 1)
        return
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise WorkdirBusy(
            f"workdir {path} is in use by another process (pid {holder}); wait for it to "
            "finish or use another workdir"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[path] = (fd, 1)
    try:
        yield
    finally:
        del _held[path]
        os.close(fd)  # closing releases the lock


def is_mutable(field: str) -> bool:
    return any(field == m or (m.endswith(".") and field.startswith(m)) for m in MUTABLE)


def changes(old: dict, new: dict) -> dict[str, tuple]:
    """{field: (old, new)} for every leaf that differs (missing on one side: None)."""
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def read_config(path: str | os.PathLike) -> dict:
    """A run's config.json; a garbled one is a ValueError naming the file."""
    file = Path(path) / CONFIG_FILE
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} is not valid JSON ({err}); the run cannot be read") from err
    if not isinstance(data, dict):
        raise ValueError(f"{file} must hold a JSON object, got {type(data).__name__}")
    return data


def prepare(path: str | os.PathLike, config: ml_collections.ConfigDict, step: int) -> None:
    """Write config.json for a new run, or check and record a resumed run's changes."""
    path = Path(path)
    new = json.loads(json.dumps(config.to_dict()))  # as config.json would hold it
    if not (path / CONFIG_FILE).exists():
        files.write_json(path / CONFIG_FILE, new)
        return
    diff = changes(read_config(path), new)
    fixed = {k: v for k, v in diff.items() if not is_mutable(k)}
    if fixed:
        listed = "; ".join(f"{k}: {old!r} -> {value!r}" for k, (old, value) in fixed.items())
        raise ValueError(
            f"workdir {path} holds another experiment; resuming it with this config would "
            f"change {listed}. Use a new workdir, or the old values"
        )
    if diff:
        entry = {"step": step, "changes": {k: [old, value] for k, (old, value) in diff.items()}}
        with (path / HISTORY_FILE).open("a") as f:
            f.write(json.dumps(entry) + "\n")
        files.write_json(path / CONFIG_FILE, new)
