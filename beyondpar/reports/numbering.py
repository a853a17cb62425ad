"""Layer numbers in every human-facing report and plot: from 1, as in the paper. Records
and JSON outputs keep the checkpoint's 0-based layer index, so a report says how the two
map."""

from __future__ import annotations

FIRST = 1  # the number of the first layer in a report


def number(index) -> int:
    """The report's number of the layer at 0-based `index` (an int or its JSON string)."""
    return int(index) + FIRST


def note(*outputs: str) -> str:
    """The line at a report's top that says how its layer numbers map to the 0-based keys
    of `outputs` (file names, flags)."""
    where = " and ".join(outputs)
    return (
        f"Layers are numbered from {FIRST}, as in the paper: layer k in this report is key "
        f"k-1 in {where}."
    )
