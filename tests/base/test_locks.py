"""Folder locks: reentrant in one process, a second process finds the folder busy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from beyondpar.base import locks


def test_lock_is_reentrant_under_relative_and_absolute_names(tmp_path, monkeypatch):
    """The same folder named relatively and absolutely is one lock: re-entering it from
    the process that holds it must not report the folder busy, and after the outer block
    the folder is free again."""
    monkeypatch.chdir(tmp_path)
    with locks.lock("work"):
        with locks.lock(tmp_path / "work"):
            assert (tmp_path / "work" / locks.LOCK_FILE).read_text() == str(os.getpid())
        with locks.lock("work"):
            pass
    with locks.lock(tmp_path / "work"):
        pass


def test_lock_creates_missing_parent_folders(tmp_path):
    folder = tmp_path / "runs" / "grid" / "one"
    with locks.lock(folder):
        assert (folder / locks.LOCK_FILE).read_text() == str(os.getpid())


def test_lock_replaces_a_longer_pid_left_by_an_earlier_holder(tmp_path):
    (tmp_path / locks.LOCK_FILE).write_text("4194304999999")
    with locks.lock(tmp_path):
        assert (tmp_path / locks.LOCK_FILE).read_text() == str(os.getpid())


_HOLDER = """
import sys
from beyondpar.base import locks
with locks.lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_second_process_finds_the_folder_busy_until_the_first_ends(tmp_path):
    """While another process holds the folder, taking it here fails at once naming that
    process's pid; once the holder exits, the folder can be taken."""
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(locks.FolderBusy, match=rf"\(pid {holder.pid}\)"), locks.lock(folder):
            pass
        holder.communicate("", timeout=30)
    finally:
        if holder.poll() is None:  # a holder that never answered is not left running
            holder.kill()
            holder.wait()
    assert holder.returncode == 0
    with locks.lock(folder):
        assert (folder / locks.LOCK_FILE).read_text() == str(os.getpid())
