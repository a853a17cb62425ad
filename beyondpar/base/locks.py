"""One process per output folder: an advisory lock the kernel releases when the process
ends (also on `kill -9`), so a second process on a busy folder stops at once, naming it.
Re-entrant within a process, so a job that holds its folder can call another that takes
the same lock (an ablation evaluating its own runs)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".lock"

_held: dict[Path, tuple[int, int]] = {}  # path -> (fd, depth)


class FolderBusy(RuntimeError):
    """Another process holds the folder."""


@contextlib.contextmanager
def lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold `path`'s lock for the block; a busy folder raises FolderBusy at once."""
    path = Path(path).absolute()
    if path in _held:
        yield from _reenter(path)
        return
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise FolderBusy(
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


def _reenter(path: Path) -> Iterator[None]:
    fd, depth = _held[path]
    _held[path] = (fd, depth + 1)
    try:
        yield
    finally:
        _held[path] = (fd, _held[path][1] - 1)
