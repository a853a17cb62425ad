"""Markdown tables, one row per layer: the header, the right-aligned rule, a row per
layer numbered from 1 (`numbering`), then any closing rows (a baseline)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from beyondpar.reports import numbering


def row(cells: Iterable) -> str:
    """One Markdown row: `| a | b |`."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def layer_table(
    columns: Sequence[str],
    rows: Iterable[tuple[int | str, Sequence[str]]],
    closing: Iterable[Sequence[str]] = (),
    first: str = "layer",
) -> list[str]:
    """A table whose first column is the layer: `rows` are (0-based index, cells), numbered
    here; `closing` rows are written as given, first cell included. Every column is right
    aligned."""
    lines = [row([first, *columns]), "|" + "---:|" * (1 + len(columns))]
    lines += [row([numbering.number(index), *cells]) for index, cells in rows]
    lines += [row(cells) for cells in closing]
    return lines
