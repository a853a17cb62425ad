"""Command lines that fail in one line: a bad flag, a broken flag rule or bad input prints
`error: ...` naming the flag, what it must be and what it got, and exits with status 2,
never a page of usage text."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from absl import app, flags
from ml_collections.config_flags.config_flags import ConfigFileFlagParser

from beyondpar.base.locks import FolderBusy

# What a user can get wrong: flags, files, values, a folder another process holds.
USER_ERRORS = (ValueError, FileNotFoundError, FolderBusy, flags.Error)


def fail(message: str) -> None:
    print(f"error: {one_line(message)}", file=sys.stderr)
    sys.exit(2)


def one_line(message: str) -> str:
    """A message on one line: a traceback inside it (config files raise while absl parses
    them) is cut to its first and last lines, other lines are joined with '; '."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        return f"{lines[0]} {lines[-1]}"
    return "; ".join(lines)


def config(holder):
    """The value of a config-file flag. ml_collections reports a config file it could not
    load, or an override of a field the config does not have, only when the value is
    read; both are a ValueError naming the flag."""
    try:
        value = holder.value
        value.keys()  # the first real access is where a lazy failure is raised
        return value
    except (OSError, AttributeError, KeyError) as err:
        raise ValueError(f"--{holder.name}: {one_line(err)}") from err


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with a bad flag, a missing required one or a config file that
    does not load in one line."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as err:
        fail(str(err))
    except Exception as err:
        problem = config_file_problem(err)
        if problem is not None:
            fail(problem)
        if not isinstance(err, (AttributeError, KeyError)):
            raise
        # ml_collections: an override of no field
        overrides = [a.split("=")[0] for a in argv if a.startswith("--config.")]
        fail(f"{', '.join(overrides)} must name fields of the config, got no field {_missing(err)}")


def _missing(err: Exception) -> str:
    """The message of ml_collections' error for a missing field, which may be wrapped in
    another error and repr'd by str(): "'name'; Did you mean ...?" on one line."""
    while err.args and isinstance(err.args[0], Exception):
        err = err.args[0]
    return one_line(err.args[0] if err.args and isinstance(err.args[0], str) else err)


def config_file_problem(err: Exception) -> str | None:
    """The config-file flag whose file raised `err` while it was loaded (run, or asked for
    its `get_config`), the file and what went wrong; None when no config file raised it."""
    tb = err.__traceback__
    while tb is not None and not isinstance(tb.tb_frame.f_locals.get("self"), ConfigFileFlagParser):
        tb = tb.tb_next
    if tb is None:
        return None
    name = tb.tb_frame.f_locals["self"].name
    file = str(tb.tb_frame.f_locals.get("path", "")).split(":", 1)[0]
    return f"--{name}: {load_problem(file, err)}"


def load_problem(file, err: Exception) -> str:
    """`err`, raised by config file `file` while it ran or was asked for `get_config`, in
    words naming the file."""
    if isinstance(err, AttributeError) and err.name == "get_config":
        problem = "defines no get_config()"
    elif isinstance(err, SyntaxError):
        problem = f"has a syntax error: {err}"
    else:
        problem = f"raised {type(err).__name__}: {one_line(err)}"
    return f"config file {str(file)!r} {problem}"


def run(main: Callable[[list[str]], int | None], positional: bool = False) -> None:
    """`app.run(main)` where every user error is one line and exit status 2; `main`'s
    return value is the exit status. Unless `positional`, words that are not flags are
    refused: a flag value with spaces, unquoted, must not be cut to its first word."""

    def guarded(argv):
        if not positional and len(argv) > 1:
            fail(f"{Path(argv[0]).name} takes only flags, got extra arguments {argv[1:]}")
        try:
            return main(argv)
        except (FileExistsError, NotADirectoryError) as err:  # a folder to make is a file
            fail(not_a_folder(err))
        except USER_ERRORS as err:
            fail(str(err))
        except KeyboardInterrupt:
            interrupted(argv[0])

    app.run(guarded, flags_parser=parse_flags)


def interrupted(program: str) -> None:
    """Ctrl-C: one line and the shell's status for it (130), not a traceback. Whatever
    was written before is whole (files are written atomically), and the launchers that
    resume (train, ablate, a corpus or series analysis) go on from it when rerun."""
    print(f"{Path(program).name}: interrupted", file=sys.stderr)
    sys.exit(130)


def not_a_folder(err: OSError) -> str:
    """What making a folder that is a file (or lies inside one) means on the command line:
    the path flag that names it, and the file in the way."""
    if err.filename is None:
        return str(err)
    path = Path(os.fsdecode(err.filename)).absolute()
    file = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
    for name, value in flags.FLAGS.flag_values_dict().items():
        if isinstance(value, str) and value:
            given = Path(value).absolute()
            if file == given:
                return f"--{name} must be a folder, got {value!r}, which is a file"
            if file in given.parents:
                return f"--{name} must be a folder, got {value!r}, inside the file {str(file)!r}"
    return f"{str(file)!r} is a file, not a folder"


def exactly_one(**given) -> str:
    """The name of the one flag given a value among `given`; else a ValueError naming all."""
    named = [name for name, value in given.items() if value]
    if len(named) != 1:
        flags_ = " or ".join(f"--{name}" for name in given)
        got = ", ".join(f"--{n}" for n in named) or "none"
        raise ValueError(f"give exactly one of {flags_}, got {got}")
    return named[0]
