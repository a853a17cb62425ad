"""Argument checks, atomic files, folder locks, settings comparison, timers and the
one-flag rule of the command lines: small utilities every study script relies on."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar.base import checks, cli, files, locks, settings, timing

# ------------------------------------------------------------------ argument checks


def test_lists_of_python_floats_are_not_float64_arrays_in_float32_mode(monkeypatch):
    """Python numbers take JAX's default dtype: in float32 mode a list is float32 and says
    nothing, while a float64 array is named once, before it is rounded."""
    monkeypatch.setattr(checks, "_warned_float64", False)
    with jax.enable_x64(False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert checks.as_float_array("weights", [0.25, 0.75]).dtype == np.float32
            assert checks.as_float_array("weights", ([1, 2], [3, 4])).dtype == np.float32
        with pytest.warns(UserWarning, match="weights is float64 but JAX runs in float32 mode"):
            assert checks.as_float_array("weights", np.array([0.25])).dtype == np.float32


def test_lists_and_tuples_of_float_arrays_keep_their_dtype_in_float64_mode():
    with jax.enable_x64(True):
        for stack in (list, tuple):
            rows = stack([np.ones(2, np.float32), np.zeros(2, np.float32)])
            assert checks.as_float_array("weights", rows).dtype == np.float32
            halves = stack([np.ones(2, np.float16), np.zeros(2, np.float16)])
            assert checks.as_float_array("weights", halves).dtype == np.float16
            assert checks.as_float_array("weights", stack([1, 2])).dtype == np.float64


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


@pytest.mark.parametrize(
    "bad",
    [
        0,
        0.0,
        -1e-9,
        float("nan"),
        float("inf"),
        -float("inf"),
        True,
        np.bool_(True),
        "0.1",
        None,
        [0.1],
        np.array([0.1]),
        10**400,
    ],
)
def test_positive_number_refuses_what_is_not_a_finite_number_above_zero(bad):
    """A rate must be a real number strictly above 0 and finite: zero, negatives, NaN,
    infinities, bools, strings, lists, 1-element arrays and an int too large for a float
    are each refused naming the argument."""
    with pytest.raises(ValueError, match=r"^learning_rate must be a finite number > 0, got "):
        checks.positive_number("learning_rate", bad)


@pytest.mark.parametrize(
    "good, want",
    [
        (3, 3.0),
        (1e-12, 1e-12),
        (np.int64(2), 2.0),
        (np.float32(0.5), 0.5),
        (jnp.float32(0.25), 0.25),
    ],
)
def test_positive_number_returns_a_plain_float(good, want):
    """Python, NumPy and 0-d JAX numbers above 0 come back as the same value, a float."""
    out = checks.positive_number("learning_rate", good)
    assert out == want and type(out) is float


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


def test_open_unit_interval_excludes_both_ends():
    """A probability strictly between 0 and 1: the ends themselves are refused, naming the
    argument, while values just inside them pass through as floats."""
    for bad in (0.0, 0, 1.0, 1, -0.5, 1.5):
        with pytest.raises(ValueError, match=r"^dropout must be in the open interval \(0, 1\)"):
            checks.open_unit_interval("dropout", bad)
    assert checks.open_unit_interval("dropout", 1e-9) == 1e-9
    assert checks.open_unit_interval("dropout", np.float32(0.25)) == 0.25


def test_unit_interval_includes_both_ends():
    """A share in the closed interval [0, 1]: both ends pass through as floats, while
    values outside it, NaN, bools and strings are refused naming the argument."""
    for good, value in (
        (0, 0.0),
        (1, 1.0),
        (1.0, 1.0),
        (np.float32(0.25), 0.25),
        (np.int64(1), 1.0),
    ):
        assert checks.unit_interval("--residual", good) == value
        assert type(checks.unit_interval("--residual", good)) is float
    for bad in (-0.01, 1.01, float("nan"), True, False, "0.5"):
        with pytest.raises(ValueError) as err:
            checks.unit_interval("--residual", bad)
        assert str(err.value) == f"--residual must be a number in [0, 1], got {bad!r}"


# ------------------------------------------------------------------ command lines


def test_exactly_one_flag_must_be_given():
    """Neither flag given is as wrong as both: the message names every choice and what
    was given."""
    assert cli.exactly_one(config="a.py", workdir="") == "config"
    with pytest.raises(ValueError, match=r"^give exactly one of --config or --workdir, got none$"):
        cli.exactly_one(config="", workdir=None)
    with pytest.raises(ValueError, match=r"got --config, --workdir$"):
        cli.exactly_one(config="a.py", workdir="w")


def test_one_line_keeps_first_and_last_line_of_a_traceback():
    """A traceback inside a message is cut to the line before it and the error itself;
    other lines are joined with '; ' and blank ones dropped."""
    message = (
        'bad config\nTraceback (most recent call last):\n  File "c.py", line 3\nNameError: x\n'
    )
    assert cli.one_line(message) == "bad config NameError: x"
    assert cli.one_line("first\n\n  second \n") == "first; second"


class _Flag:
    name = "config"

    def __init__(self, value):
        self._value = value

    @property
    def value(self):
        if isinstance(self._value, Exception):
            raise self._value
        return self._value


def test_config_flag_that_fails_to_load_is_a_value_error_naming_the_flag():
    """An override of a missing field (KeyError) or an unreadable file (OSError) surfaces
    as a ValueError naming the flag; a config that loads is returned as it is."""
    assert cli.config(_Flag({"steps": 3})) == {"steps": 3}
    with pytest.raises(ValueError, match=r"^--config: 'model\.heads'$"):
        cli.config(_Flag(KeyError("model.heads")))
    with pytest.raises(ValueError, match=r"^--config: no such file$"):
        cli.config(_Flag(FileNotFoundError("no such file")))


_RAISES = """
import sys
from beyondpar.base import cli, locks
errors = {"value": ValueError, "missing": FileNotFoundError, "busy": locks.FolderBusy}
def main(argv):
    raise errors[argv[1]](f"{argv[1]}\\nsecond line")
cli.run(main, positional=True)
"""


@pytest.mark.parametrize("error", ["value", "missing", "busy"])
def test_run_turns_a_user_error_into_one_line_and_status_2(error):
    done = subprocess.run(
        [sys.executable, "-c", _RAISES, error], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (2, f"error: {error}; second line\n")
    assert done.stdout == ""


_INTERRUPTED = """
import os, signal
from pathlib import Path
from beyondpar.base import cli, files
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, not a background job
def main(argv):
    files.write_text(Path(os.environ["OUT"]) / "done.txt", "whole")
    os.kill(os.getpid(), signal.SIGINT)
cli.run(main)
"""


def test_ctrl_c_is_one_line_and_status_130_with_what_was_written_kept(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OUT": str(tmp_path)},
    )
    assert (done.returncode, done.stderr) == (130, "-c: interrupted\n")
    assert (tmp_path / "done.txt").read_text() == "whole"


def test_ctrl_c_names_the_launcher_without_its_folder(capsys):
    """A launcher started by its path is named by its file name alone."""
    with pytest.raises(SystemExit) as exit_info:
        cli.interrupted("/opt/venv/bin/beyondpar-train")
    assert exit_info.value.code == 130
    assert capsys.readouterr() == ("", "beyondpar-train: interrupted\n")


_PRINTS_ARGV = """
import sys
from beyondpar.base import cli
cli.run(lambda argv: print("ran", argv), positional=sys.argv.pop(1) == "positional")
"""


def _run_printing_argv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _PRINTS_ARGV, *args], capture_output=True, text=True, timeout=60
    )


def test_run_refuses_words_that_are_not_flags_unless_main_takes_them():
    """`--text hello there` would run on 'hello' alone: extra words are one line and exit
    status 2 before `main` runs; a `main` that reads them gets them."""
    done = _run_printing_argv("flags", "there", "friend")
    assert done.stderr == "error: -c takes only flags, got extra arguments ['there', 'friend']\n"
    assert (done.returncode, done.stdout) == (2, "")
    assert _run_printing_argv("flags").stdout == "ran ['-c']\n"
    done = _run_printing_argv("positional", "x")
    assert (done.returncode, done.stdout) == (0, "ran ['-c', 'x']\n")


def test_run_refuses_a_single_word_that_is_not_a_flag():
    """`--text hello there` unquoted leaves one word over: it too is refused."""
    done = _run_printing_argv("flags", "there")
    assert done.stderr == "error: -c takes only flags, got extra arguments ['there']\n"
    assert (done.returncode, done.stdout) == (2, "")


_WRITES_UNDER_OUT = """
from pathlib import Path
from absl import flags
from beyondpar.base import cli, files
OUT = flags.DEFINE_string("out", None, "Folder.")
cli.run(lambda argv: files.write_text(Path(OUT.value) / "a" / "x.txt", "x"))
"""


@pytest.mark.parametrize(
    "out, message",
    [
        ("file", "--out must be a folder, got '{out}', which is a file"),
        ("file/sub", "--out must be a folder, got '{out}', inside the file '{file}'"),
    ],
    ids=["file", "inside_a_file"],
)
def test_run_names_the_flag_whose_folder_is_a_file(tmp_path, out, message):
    """A folder to write into that is a file, or lies inside one, is one line naming the
    flag and the file, exit status 2, and the file is left as it was."""
    file = tmp_path / "file"
    file.write_text("keep")
    out = tmp_path / out
    done = subprocess.run(
        [sys.executable, "-c", _WRITES_UNDER_OUT, f"--out={out}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stderr == f"error: {message.format(out=out, file=file)}\n"
    assert (done.returncode, file.read_text()) == (2, "keep")


_LOADS_CONFIG = """
from ml_collections import config_flags
from beyondpar.base import cli
CONFIG = config_flags.DEFINE_config_file("config")
cli.run(lambda argv: print(cli.config(CONFIG)))
"""


@pytest.mark.parametrize(
    "source, problem",
    [
        ("def get_config():\n    return 1 / 0\n", "raised ZeroDivisionError: division by zero"),
        ("def get_config(:\n", "has a syntax error: invalid syntax (c.py, line 1)"),
        ("x = 1\n", "defines no get_config()"),
        (
            "def get_config():\n    return None.steps\n",
            "raised AttributeError: 'NoneType' object has no attribute 'steps'",
        ),
    ],
    ids=["raises", "syntax_error", "no_get_config", "raises_attribute_error"],
)
def test_config_file_that_does_not_load_is_one_line_naming_it(tmp_path, source, problem):
    (tmp_path / "c.py").write_text(source)
    done = subprocess.run(
        [sys.executable, "-c", _LOADS_CONFIG, f"--config={tmp_path / 'c.py'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stderr == f"error: --config: config file '{tmp_path / 'c.py'}' {problem}\n"
    assert (done.returncode, done.stdout) == (2, "")


def _load_config(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _LOADS_CONFIG, *flags], capture_output=True, text=True, timeout=60
    )


def test_config_file_given_an_argument_is_named_without_the_argument(tmp_path):
    """`--config=c.py:arg` names the file c.py, not 'c.py:arg'."""
    (tmp_path / "c.py").write_text("def get_config(arg):\n    raise RuntimeError(arg)\n")
    done = _load_config(f"--config={tmp_path / 'c.py'}:small")
    problem = "raised RuntimeError: small"
    assert done.stderr == f"error: --config: config file '{tmp_path / 'c.py'}' {problem}\n"
    assert (done.returncode, done.stdout) == (2, "")


def test_override_through_a_missing_field_is_one_line_naming_the_field(tmp_path):
    """An override whose path goes through a field the config lacks (ml_collections raises
    a KeyError, not an AttributeError) is one line and exit status 2, not a traceback."""
    source = "import ml_collections\ndef get_config():\n"
    source += "    return ml_collections.ConfigDict({'optim': {'learning_rate': 0.1}})\n"
    (tmp_path / "c.py").write_text(source)
    done = _load_config(f"--config={tmp_path / 'c.py'}", "--config.optim.lr.x=1")
    assert done.stderr == (
        "error: --config.optim.lr.x must name fields of the config, got no field 'lr'\n"
    )
    assert (done.returncode, done.stdout) == (2, "")


# ------------------------------------------------------------------ files


def test_a_damaged_json_file_is_a_value_error_naming_it(tmp_path):
    path = tmp_path / "settings.json"
    files.write_json(path, {"spec": {"layers": [0]}})
    assert files.read_json(path) == {"spec": {"layers": [0]}}
    path.write_text('{"spec": {"lay')
    with pytest.raises(ValueError) as err:
        files.read_json(path)
    assert str(err.value).startswith(f"{path} is not valid JSON (damaged or cut short?): ")
    path.write_text("[1, 2]")
    with pytest.raises(ValueError) as err:
        files.read_json(path)
    assert str(err.value) == f"{path} must hold a JSON object, got list"


def test_a_cut_short_npz_is_a_value_error_naming_it(tmp_path):
    """An .npz cut anywhere (before its index, or inside an array) is one ValueError that
    names the file, never a zipfile or EOF error."""
    good = tmp_path / "good.npz"
    np.savez(good, attention=np.ones((2, 8, 8)))
    whole = good.read_bytes()
    assert files.read_npz(good)["attention"].shape == (2, 8, 8)
    cut = tmp_path / "cut.npz"
    for size in (len(whole) // 2, 40):
        cut.write_bytes(whole[:size])
        with pytest.raises(ValueError) as err:
            files.read_npz(cut)
        assert str(err.value).startswith(f"{cut} is not a whole .npz archive (damaged or cut")


def test_an_empty_npz_is_a_value_error_naming_it(tmp_path):
    """A file with no bytes at all (a write that never started) is the same one error."""
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    with pytest.raises(ValueError) as err:
        files.read_npz(empty)
    assert str(err.value).startswith(f"{empty} is not a whole .npz archive (damaged or cut")


def test_a_json_file_that_is_not_utf8_is_a_value_error_naming_it(tmp_path):
    path = tmp_path / "settings.json"
    path.write_bytes(b'{"model": "\xff\xfe"}')
    with pytest.raises(ValueError) as err:
        files.read_json(path)
    assert str(err.value).startswith(f"{path} is not valid JSON (damaged or cut short?): ")


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


def test_atomic_path_interrupted_by_ctrl_c_leaves_nothing_behind(tmp_path):
    """Ctrl-C (KeyboardInterrupt, not an Exception) inside the block still removes the
    temporary file, and a target that did not exist is not created."""
    target = tmp_path / "metrics.npz"
    with pytest.raises(KeyboardInterrupt), files.atomic_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_read_json_lines_ignores_a_torn_last_line_but_names_a_bad_middle_one(tmp_path):
    """A half-written last line is what a killed writer leaves: it is dropped quietly. A
    broken line with records after it is damage, reported with its line number; a JSON
    value that lacks a key is reported as not a record."""
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1}\n{"ste\n[3]\n{"step": 4, "x": 2}\n{"step": 5, "x"')
    problems = []
    records = files.read_json_lines(path, ["step"], problems)
    assert records == [{"step": 1}, {"step": 4, "x": 2}]
    assert problems == [
        f"{path}:2: not valid JSON; skipped",
        f"{path}:3: not a record (no step); skipped",
    ]
    assert files.read_json_lines(tmp_path / "absent.jsonl", ["step"], problems) == []


def test_read_json_lines_reports_json_values_that_are_not_objects(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('7\n"step"\n{"step": 2}\n')
    problems = []
    assert files.read_json_lines(path, ["step"], problems) == [{"step": 2}]
    assert problems == [
        f"{path}:1: not a record (no step); skipped",
        f"{path}:2: not a record (no step); skipped",
    ]


def test_atomic_files_get_the_mode_of_an_ordinary_new_file(tmp_path, monkeypatch):
    """Under the usual umask 022 a new file is 0644, where a temporary file is 0600."""
    monkeypatch.setattr(files, "_UMASK", 0o022)  # read once, when the module is imported
    previous = os.umask(0o022)
    try:
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
        written = files.write_text(tmp_path / "out" / "atomic.txt", "x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    assert stat.S_IMODE(plain.stat().st_mode) == 0o644


_KILLED_WRITER = """
import os, signal, sys
from beyondpar.base import files
path = sys.argv[1]
files.append_json_line(path, {"step": 1, "loss": 0.5})
with open(path, "a") as f:
    f.write('{"step": 2, "lo')
    f.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_append_after_a_killed_writer_starts_on_a_new_line(tmp_path):
    """A writer killed mid-record leaves a torn line; the next append must start on a
    fresh line, so its record is read back whole and only the torn one is lost."""
    path = tmp_path / "metrics.jsonl"
    killed = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], check=False)
    assert killed.returncode == -9
    files.append_json_line(path, {"step": 3, "loss": 0.25})
    problems = []
    records = files.read_json_lines(path, ["step", "loss"], problems)
    assert records == [{"step": 1, "loss": 0.5}, {"step": 3, "loss": 0.25}]
    assert problems == [f"{path}:2: not valid JSON; skipped"]
    assert path.read_text().splitlines()[2] == json.dumps({"step": 3, "loss": 0.25})


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


def test_refuse_changes_compares_settings_as_saved_in_json():
    """Settings read back from JSON hold lists where the new run holds tuples; equal
    values are no change, and a real change is named in its JSON form."""
    saved = json.loads(json.dumps({"spec": {"layers": (0, 2), "residual": 0.5}}))
    assert (
        settings.refuse_changes(saved, {"spec": {"layers": (0, 2), "residual": 0.5}}, "w", "x")
        == {}
    )
    with pytest.raises(ValueError) as err:
        settings.refuse_changes(saved, {"spec": {"layers": (0,), "residual": 0.5}}, "w", "x")
    assert str(err.value) == "w (spec.layers: [0, 2] -> [0]); x"


def test_guard_writes_records_and_refuses_before_writing(tmp_path):
    """A first run writes its settings; a free change is appended to the history with its
    step and rewrites the file; a fixed change is refused and leaves both files as they were."""
    path, history = tmp_path / "settings.json", tmp_path / "history.jsonl"
    free = lambda field: field == "train.steps"
    first = {"model": {"heads": 4}, "train": {"steps": 100}}
    guard = lambda wanted, step: settings.guard(
        path, wanted, "w holds other settings", "x", free, history=history, step=step
    )
    assert guard(first, 0) is None and files.read_json(path) == first
    assert guard(first, 5) == first and not history.exists()
    longer = {"model": {"heads": 4}, "train": {"steps": 300}}
    assert guard(longer, 100) == first and files.read_json(path) == longer
    assert files.read_json_lines(history, ("step",)) == [
        {"step": 100, "changes": {"train.steps": [100, 300]}}
    ]
    before = (path.read_text(), history.read_text())
    with pytest.raises(ValueError) as err:
        guard({"model": {"heads": 8}, "train": {"steps": 900}}, 300)
    assert str(err.value) == "w holds other settings (model.heads: 4 -> 8); x"
    assert (path.read_text(), history.read_text()) == before


def test_guard_fills_old_files_and_leaves_files_it_does_not_own(tmp_path):
    """`defaults` stand for fields an older file lacks, and the file is rewritten with them;
    `write=False` compares without writing; `saved` replaces the file's content."""
    path = tmp_path / "settings.json"
    files.write_json(path, {"model": "m"})
    wanted = {"model": "m", "model_sha256": "ab"}
    assert settings.guard(path, wanted, "w", "x", defaults={"model_sha256": "ab"}) is not None
    assert files.read_json(path) == wanted
    with pytest.raises(ValueError, match=r"^w \(model_sha256: 'ab' -> 'cd'\); x$"):
        settings.guard(path, {**wanted, "model_sha256": "cd"}, "w", "x")
    assert settings.guard(tmp_path / "none.json", wanted, "w", "x", write=False) is None
    assert not (tmp_path / "none.json").exists()
    with pytest.raises(ValueError, match=r"^w \(model: 'n' -> 'm'\); x$"):
        settings.guard(path, wanted, "w", "x", saved={"model": "n", "model_sha256": "ab"})


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


def test_best_time_is_the_fastest_call_after_a_warm_up(monkeypatch):
    """The warm-up call is not timed; of the timed calls the fastest is reported."""
    clock = [0.0]
    durations = iter([5.0, 0.3, 0.1, 0.2])  # warm-up (compile), then three timed calls

    def fn():
        clock[0] += next(durations)
        return jnp.zeros(())

    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    assert timing.best_time(fn, 3) == pytest.approx(0.1)


def test_an_npz_damaged_inside_or_not_an_npz_at_all_is_named(tmp_path):
    """Flipped bytes in a compressed array or in an array's header, a text file and a
    single .npy array under an .npz name: each one ValueError naming the file."""
    attention = np.random.default_rng(0).random((2, 50, 50))
    compressed, plain = tmp_path / "c.npz", tmp_path / "u.npz"
    np.savez_compressed(compressed, attention=attention)
    np.savez(plain, attention=attention)
    data = bytearray(compressed.read_bytes())
    data[200] ^= 0xFF
    data[300] ^= 0xFF
    (tmp_path / "flipped.npz").write_bytes(bytes(data))
    data = bytearray(plain.read_bytes())
    at = data.find(b"{'descr'")
    data[at + 3 : at + 9] = b"(((((("
    (tmp_path / "header.npz").write_bytes(bytes(data))
    for name in ("flipped.npz", "header.npz"):
        with pytest.raises(ValueError, match="is not a whole .npz archive") as err:
            files.read_npz(tmp_path / name)
        assert str(err.value).startswith(f"{tmp_path / name} ")
    (tmp_path / "text.npz").write_text("hello, a text file\n")
    with pytest.raises(ValueError, match="text.npz is not an .npz archive .it does not start"):
        files.read_npz(tmp_path / "text.npz")
    with open(tmp_path / "single.npz", "wb") as f:
        np.save(f, attention)
    with pytest.raises(ValueError, match="single.npz must be an .npz archive, got a single"):
        files.read_npz(tmp_path / "single.npz")
