"""The one-line rule of the command lines: a user error is `error: ...` on one line and exit
status 2, Ctrl-C is one line and 130, and words that are not flags are refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from beyondpar.base import cli


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
