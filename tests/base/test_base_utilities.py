"""Argument checks, atomic files, folder locks, settings comparison, timers and the
one-flag rule of the command lines: small utilities every study script relies on."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from beyondpar.base import checks, cli, files, locks, settings, timing

# ------------------------------------------------------------------ argument checks


def test_positive_int_rejects_zero_and_names_the_argument():
    """>= 1 means zero is refused, with the argument's name and the value in the message;
    one and numpy integers are accepted and come back as plain ints."""
    with pytest.raises(ValueError, match=r"^num_heads must be an integer >= 1, got 0$"):
        checks.positive_int("num_heads", 0)
    with pytest.raises(ValueError, match=r"got -3"):
        checks.positive_int("num_heads", -3)
    assert checks.positive_int("num_heads", 1) == 1
    out = checks.positive_int("num_heads", np.int32(7))
    assert out == 7 and type(out) is int


def test_non_negative_int_accepts_zero_but_not_bool():
    """Zero is a valid count; True/False are ints to Python but not counts, so they are
    refused like any other non-integer."""
    assert checks.non_negative_int("seed", 0) == 0
    assert checks.non_negative_int("seed", np.int64(5)) == 5
    for bad in (True, False, -1, 2.0, "3"):
        with pytest.raises(ValueError, match=r"^seed must be an integer >= 0, got "):
            checks.non_negative_int("seed", bad)
    with pytest.raises(ValueError, match=r"got True$"):
        checks.positive_int("steps", True)


# ------------------------------------------------------------------ command lines


def test_exactly_one_flag_must_be_given():
    """Neither flag given is as wrong as both: the message names every choice and what
    was given."""
    assert cli.exactly_one(config="a.py", workdir="") == "config"
    with pytest.raises(ValueError, match=r"^give exactly one of --config or --workdir, got none$"):
        cli.exactly_one(config="", workdir=None)
    with pytest.raises(ValueError, match=r"got --config, --workdir$"):
        cli.exactly_one(config="a.py", workdir="w")


# ------------------------------------------------------------------ files


def test_atomic_path_failure_leaves_target_and_folder_untouched(tmp_path):
    """A writer that fails mid-way leaves the old file as it was and no temporary file
    behind; the temporary file lives in the target's folder (so the rename is atomic)."""
    target = tmp_path / "out" / "result.json"
    files.write_text(target, "old\n")
    with pytest.raises(RuntimeError, match="disk full"), files.atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["result.json"]
    files.write_json(target, {"b": 1, "a": [2]})
    assert target.read_text() == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'
    assert sorted(p.name for p in target.parent.iterdir()) == ["result.json"]


# ------------------------------------------------------------------ locks


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


# ------------------------------------------------------------------ settings


def test_refuse_changes_allows_only_free_fields():
    """A rerun may change the fields `free` allows (returned, old -> new); changing any
    other field is refused, naming exactly those fields and not the free ones."""
    old = {"model": {"heads": 4, "layers": 2}, "train": {"steps": 100}}
    new = {"model": {"heads": 4, "layers": 2}, "train": {"steps": 300}}
    free = lambda field: field == "train.steps"
    assert settings.refuse_changes(old, new, "w", "advice", free) == {"train.steps": (100, 300)}
    changed = {"model": {"heads": 8, "layers": 2}, "train": {"steps": 300}}
    with pytest.raises(ValueError) as err:
        settings.refuse_changes(old, changed, "workdir w was made with other settings", "x", free)
    assert str(err.value) == "workdir w was made with other settings (model.heads: 4 -> 8); x"


# ------------------------------------------------------------------ timing


def test_timer_sums_a_part_over_calls():
    """A part entered several times reports the total of its calls, not the last one."""
    timer = timing.Timer()
    for _ in range(3):
        with timer.part("sleep"):
            time.sleep(0.02)
    with timer.part("other"):
        pass
    assert set(timer.seconds) == {"sleep", "other"}
    assert timer.seconds["sleep"] >= 0.06
    assert 0.0 <= timer.seconds["other"] < timer.seconds["sleep"]
