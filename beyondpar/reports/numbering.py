"""Layer and head numbers in every human-facing report, page and plot: both from 1, as in
the paper. Records, JSON outputs and command-line flags keep the 0-based indices, so a
report says how the two map."""

from __future__ import annotations

FIRST = 1  # the number of the first layer in a report
FIRST_HEAD = 1  # the number of the first head in a report, a page or a plot


def number(index) -> int:
    """The report's number of the layer at 0-based `index` (an int or its JSON string)."""
    return int(index) + FIRST


def head_number(index) -> int:
    """The report's number of the head at 0-based `index` (an int or a numpy integer)."""
    return int(index) + FIRST_HEAD


def head_name(index) -> str:
    """`head 3` for the head at 0-based index 2: a table row's or a page's name of it."""
    return f"head {head_number(index)}"


def head_note() -> str:
    """The sentence that says how a report's head numbers map to the JSON outputs."""
    return (
        f"Heads are numbered from {FIRST_HEAD}: head h is index h-1 of each per-head list "
        "in the JSON outputs."
    )


def note(*outputs: str, heads: bool = True) -> str:
    """The line at a report's top that says how its layer numbers map to the 0-based keys
    of `outputs` (file names, flags) and, unless `heads` is False (a report that shows
    no head), how its head numbers map to the JSON's per-head lists."""
    where = " and ".join(outputs)
    line = (
        f"Layers are numbered from {FIRST}, as in the paper: layer k in this report is key "
        f"k-1 in {where}."
    )
    return f"{line} {head_note()}" if heads else line
