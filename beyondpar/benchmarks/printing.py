"""How every suite ends: its summary for a reader, then the whole result as one JSON line,
the last line of the output, for a script or a docs table to read."""

from __future__ import annotations

import json
from collections.abc import Iterable


def print_result(lines: Iterable[str], result: dict) -> None:
    """Print `lines`, then `result` as one JSON line."""
    for line in lines:
        print(line)
    print(json.dumps(result))
