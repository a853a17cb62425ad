"""The launchers run as a user runs them: a fresh interpreter, output captured."""

import subprocess
import sys

from helpers.paths import ROOT


def analyze_cli(*flags):
    """`launch/analyze.py` with `flags`, run as a user would, output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "launch" / "analyze.py"), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
