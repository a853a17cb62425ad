"""Many command lines of the launchers from one interpreter, each still in a process of its
own: the libraries every launcher imports are loaded once, then each command line runs in
a forked child as `python launch/<script> <flags>` runs it (the launcher itself, and so
its absl flags, load fresh in every child). Starting an interpreter per command line
costs seconds of imports each; a fork costs milliseconds.

    python tests/helpers/launcher_batch.py CASES_JSON

CASES_JSON: a list of [script path, [flags]]; prints a JSON list of
{"returncode", "stdout", "stderr"}, one per case, in order."""

import ast
import json
import os
import runpy
import sys
import tempfile
import traceback
from pathlib import Path


def preload(scripts: list[str]) -> None:
    """Run the top-level imports of each launcher, so that its children find them done."""
    for script in sorted(set(scripts)):
        tree = ast.parse(Path(script).read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                exec(compile(ast.Module([node], []), script, "exec"), {})


def exit_code(err: SystemExit) -> int:
    """The process status `sys.exit(code)` gives: a message is printed and is status 1."""
    if err.code is None or isinstance(err.code, int):
        return err.code or 0
    print(err.code, file=sys.stderr)
    return 1


def child(script: str, flags: list[str], stdout: int, stderr: int) -> None:
    """Run `script` as __main__ with `flags`, output into the two files; never returns."""
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    sys.argv = [script, *flags]
    sys.path[0] = str(Path(script).parent)
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as err:
        code = exit_code(err)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(script: str, flags: list[str]) -> dict:
    """One command line in a forked child: its status and what it printed."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(script, flags, out.fileno(), err.fileno())
        _, status = os.waitpid(pid, 0)
        printed = []
        for file in (out, err):
            file.seek(0)
            printed.append(file.read().decode("utf-8", "replace"))
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "stdout": printed[0],
        "stderr": printed[1],
    }


def main(cases_json: str) -> None:
    cases = json.loads(cases_json)
    preload([script for script, _ in cases])
    print(json.dumps([run(script, flags) for script, flags in cases]))


if __name__ == "__main__":
    main(*sys.argv[1:])
