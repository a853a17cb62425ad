"""The launchers run as a user runs them: a process of their own, output captured."""

import json
import subprocess
import sys
from pathlib import Path

from helpers.paths import ROOT


def analyze_cli(*flags):
    """`launch/analyze.py` with `flags`, run as a user would, output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "launch" / "analyze.py"), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def launch_many(cases: list[tuple[str, list[str]]], cwd=ROOT) -> list[subprocess.CompletedProcess]:
    """Each (launch/ script name, flags) run as a user runs it, each in a process of its
    own, but all forked from one interpreter that loaded their libraries once
    (`launcher_batch.py`): a command line that fails in its flags costs milliseconds, not
    the seconds of an interpreter's imports."""
    batch = [[str(ROOT / "launch" / script), list(flags)] for script, flags in cases]
    done = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "launcher_batch.py"), json.dumps(batch)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [
        subprocess.CompletedProcess([script, *flags], r["returncode"], r["stdout"], r["stderr"])
        for (script, flags), r in zip(cases, json.loads(done.stdout.splitlines()[-1]), strict=True)
    ]
