"""Test helper: launcher command lines parsed with each launcher's own flags, as the
launcher would parse them, in one fresh interpreter (a process per launcher would pay
JAX's import for each)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Parses as the launcher does (`cli.parse_flags`), applies its flag rules (analyze.py)
# or loads its config (train.py, ablate.py); prints, per command line, "ok" or the
# error, and the words left that are not flags.
_PROBE = """
import contextlib, io, json, runpy, sys
from absl import flags
from beyondpar.base import cli
for argv in json.loads(sys.argv[1]):
    before = set(flags.FLAGS)
    sys.argv = argv  # ml_collections defines a config's --config.x overrides from sys.argv
    mod = runpy.run_path(argv[0], run_name="launcher_flags")
    rest, said = [], io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            rest = cli.parse_flags(argv)[1:]
        if "check_flag_rules" in mod:
            mod["check_flag_rules"]()
        if "CONFIG" in mod:
            cli.config(mod["CONFIG"])
        print(json.dumps(["ok", rest]))
    except SystemExit:  # the launcher's one-line error
        print(json.dumps([said.getvalue().strip(), rest]))
    except ValueError as err:
        print(json.dumps([str(err), rest]))
    flags.FLAGS.unparse_flags()
    for name in set(flags.FLAGS) - before:
        delattr(flags.FLAGS, name)
"""


def parse(command_lines: list[list[str]]) -> list[tuple[str, list[str]]]:
    """(\"ok\" or the error, the words that are not flags) for each `[launch/x.py, *args]`,
    run from the repository root."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(command_lines)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [tuple(json.loads(line)) for line in done.stdout.splitlines()]
