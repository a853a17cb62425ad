"""A run's checkpoints: orbax save, restore and list, each step verified by its recorded
checksum. (The paper's released weights are read by `released`; `import_reference`
is kept here, where users look for it.)"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import logging
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from beyondpar.base import checks, files
from beyondpar.released import import_reference  # noqa: F401 - public here too

CHECKSUMS = "checksums.json"
DAMAGED_DIR = "damaged_checkpoints"


def manager(
    directory: str | os.PathLike, save_every: int | None = None, keep: int | None = None
) -> ocp.CheckpointManager:
    """A CheckpointManager on `directory` (created when missing); synchronous saves, so a
    checkpoint that is listed is complete."""
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=save_every or 1,
        max_to_keep=keep,
        enable_async_checkpointing=False,
        create=True,
    )
    return ocp.CheckpointManager(
        Path(directory).absolute(), options=options, item_handlers=ocp.StandardCheckpointHandler()
    )


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not match its checksum."""


def checksum(state) -> str:
    """SHA-256 of every leaf's path, shape, dtype and bytes (this process's copy of
    replicated arrays). Paths are compared by their names alone, sorted, so a state read
    back with dicts where it had tuples or named tuples hashes the same."""
    leaves = {
        "/".join(str(_key_name(k)) for k in path): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(state)
    }
    digest = hashlib.sha256()
    for name in sorted(leaves):
        leaf = leaves[name]
        array = np.asarray(leaf.addressable_data(0) if isinstance(leaf, jax.Array) else leaf)
        digest.update(f"{name}{array.shape}{array.dtype}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _key_name(key):
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return key


def _read_checksums(path: Path) -> dict[str, str] | None:
    """The recorded checksums by step ({} when there is no file); None when the file
    cannot be read as a JSON object."""
    if not path.exists():
        return {}
    try:
        return files.read_json(path)
    except ValueError:  # not JSON, not UTF-8, or not an object
        return None


def _checksums(directory: Path) -> dict[str, str]:
    """The recorded checksums by step; {} with a warning when the file is unreadable:
    the checkpoints themselves may be fine, they just cannot be verified."""
    path = directory / CHECKSUMS
    sums = _read_checksums(path)
    if sums is None:
        warnings.warn(
            f"{path} is unreadable: the checkpoints it covers are not verified", stacklevel=3
        )
        return {}
    return sums


DAMAGED_SUFFIX = ".damaged"


def _recorded_before_save(directory: Path) -> dict[str, str]:
    """The checksums a save adds to. An unreadable file is kept beside the new one for
    inspection (not overwritten), and said so: the steps it covered go unverified."""
    path = directory / CHECKSUMS
    sums = _read_checksums(path)
    if sums is not None:
        return sums
    aside = path.with_name(path.name + DAMAGED_SUFFIX)
    path.replace(aside)
    warnings.warn(
        f"{path} was unreadable and is kept as {aside.name}: the steps saved before this "
        "one are not verified",
        stacklevel=3,
    )
    return {}


@contextlib.contextmanager
def _interrupt_after():
    """Ctrl-C during the block lands when it ends: a save cut short by it left a
    half-written step folder and orbax's threads reporting on the closed event loop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hit = []
    previous = signal.signal(signal.SIGINT, lambda *_: hit.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if hit and callable(previous):
        previous(signal.SIGINT, None)  # Python's own handler raises KeyboardInterrupt


def save(mgr: ocp.CheckpointManager, step: int, state, force: bool = False) -> bool:
    """Save `state` at `step` (synchronously) and record its checksum beside it; Ctrl-C
    waits until both are whole."""
    with _interrupt_after():
        return _save(mgr, step, state, force)


def _save(mgr: ocp.CheckpointManager, step: int, state, force: bool) -> bool:
    saved = mgr.save(step, args=ocp.args.StandardSave(state), force=force)
    mgr.wait_until_finished()
    if saved and jax.process_index() == 0:
        directory = Path(mgr.directory)
        kept = {str(s) for s in mgr.all_steps()}
        sums = {k: v for k, v in _recorded_before_save(directory).items() if k in kept}
        sums[str(step)] = checksum(state)
        files.write_json(directory / CHECKSUMS, sums)
    return saved


def _verify(directory: Path, step: int, state) -> None:
    expected = _checksums(directory).get(str(step))
    if expected is not None and checksum(state) != expected:
        raise CheckpointError(f"step {step} does not match its checksum (damaged on disk)")


_SETTLE_S = 1.0  # a failed read's abandoned reads report within this much, then
_QUIET_S = 0.5  # until none has reported for this long,
_MAX_WAIT_S = 10.0  # but never longer than this


@contextlib.contextmanager
def _quiet_orbax():
    """Orbax logs a failed read at length, and its abandoned reads report "Event loop is
    closed" from tensorstore's threads as they finish, long after the exception (later on
    a busy machine); the caller reports one line instead. After a failure the reports are
    swallowed until they stop, so none reaches the program's own hooks."""
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio", "orbax")]
    levels = [lg.level for lg in loggers]
    hooks = sys.unraisablehook, threading.excepthook, sys.stderr
    reported = [time.monotonic()]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    sys.unraisablehook = threading.excepthook = lambda *_: reported.append(time.monotonic())
    sys.stderr = io.StringIO()
    failed = True
    try:
        yield
        failed = False
    finally:
        if failed:
            # A full collection finalises the abandoned reads while their reports are still
            # swallowed. A good read leaves none and skips the collection, which costs a
            # second or more in a process holding many compiled programs.
            _wait_until_quiet(reported)
            gc.collect()
        sys.unraisablehook, threading.excepthook, sys.stderr = hooks
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _wait_until_quiet(reported: list[float]) -> None:
    start = time.monotonic()
    while True:
        time.sleep(0.05)
        now = time.monotonic()
        settled = now - start >= _SETTLE_S and now - reported[-1] >= _QUIET_S
        if settled or now - start >= _MAX_WAIT_S:
            return


def restore(mgr: ocp.CheckpointManager, step: int, like):
    """The state saved at `step`, with the structure, dtypes and shardings of `like`;
    CheckpointError (one line) when it cannot be read or fails its checksum."""
    try:
        with _quiet_orbax():
            state = mgr.restore(step, args=ocp.args.StandardRestore(like))
    except Exception as err:  # noqa: BLE001 - orbax raises many kinds; the caller names the step
        raise CheckpointError(f"step {step} is unreadable: {_first_line(err)}") from err
    _verify(Path(mgr.directory), step, state)
    return state


def restore_newest_readable(mgr: ocp.CheckpointManager, like):
    """(step, state, skipped) from the newest checkpoint that reads and verifies; skipped
    lists (step, reason) of newer ones. (0, None, skipped) when none does."""
    skipped = []
    for step in sorted(mgr.all_steps(), reverse=True):
        try:
            return step, restore(mgr, step, like), skipped
        except CheckpointError as err:
            skipped.append((step, str(err)))
    return 0, None, skipped


def set_aside(mgr: ocp.CheckpointManager, step: int) -> Path:
    """Move a damaged step out of the manager's folder (orbax reads any name ending in a
    number as a step) into `damaged_checkpoints/` beside it, kept for inspection, so the
    run can save that step again."""
    directory = Path(mgr.directory)
    target = directory.parent / DAMAGED_DIR / f"step{step}"
    n = 1
    while target.exists():
        n += 1
        target = directory.parent / DAMAGED_DIR / f"step{step}-{n}"
    target.parent.mkdir(exist_ok=True)
    (directory / str(step)).rename(target)
    mgr.reload()
    return target


def _first_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().splitlines()[0]
    return text.split(". See full TensorStore details")[0][:300]


def load(directory: str | os.PathLike, step: int | None = None) -> tuple[int, dict]:
    """(step, state) of a run's checkpoint (latest by default) on this process's first
    device, whatever the number of devices or processes that saved it."""
    directory = Path(directory).absolute()
    if not list_steps(directory):
        raise checks.MissingPathError(
            f"directory must hold orbax checkpoints, got none in {directory}"
        )
    options = ocp.CheckpointManagerOptions(create=False)
    with ocp.CheckpointManager(
        directory, options=options, item_handlers=ocp.StandardCheckpointHandler()
    ) as mgr:
        step = mgr.latest_step() if step is None else step
        if step not in mgr.all_steps():
            raise ValueError(f"step must be one of {sorted(mgr.all_steps())}, got {step}")
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        try:
            with _quiet_orbax():
                metadata = mgr.item_metadata(step)
        except Exception as err:  # noqa: BLE001
            raise CheckpointError(f"step {step} is unreadable: {_first_line(err)}") from err
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata
        )
        return step, restore(mgr, step, target)


def list_steps(directory: str | os.PathLike) -> list[int]:
    """Saved steps under a run's checkpoint folder, oldest first ([] when none)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(ocp.utils.checkpoint_steps(directory))
