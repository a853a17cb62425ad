"""The coalitions section of every report: per layer the heads' Shapley values on each
game (fidelity in percentage points, loss in nats), the strongest positive and negative
pair and triple Harsanyi dividends and the share of negative ones, each with its
interval; heads and layers numbered from 1. It reads the per-layer summary the
measurement's `coalition_game.summarize` writes ({layer key: {objective: summary}})."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from beyondpar.reports import figures as report_figures
from beyondpar.reports import numbering, tables

# objective: (title, scale, unit) as the report prints its values.
OBJECTIVES = {
    "fidelity": ("minimax fidelity of the coalition's mix", 100.0, "pp"),
    "loss": ("loss the coalition restores with the layer's other heads masked", 1.0, "nats"),
}
STRONGEST = (
    ("strongest_positive_pair", "largest pair"),
    ("strongest_negative_pair", "smallest pair"),
    ("strongest_positive_triple", "largest triple"),
    ("strongest_negative_triple", "smallest triple"),
)
SHARES = (
    ("negative_pair_share", "negative pairs (%)"),
    ("negative_triple_share", "negative triples (%)"),
)
HEAD_NOTE = numbering.head_note()


def interval(stat: Mapping, scale: float = 1.0, digits: int = 3) -> str:
    """`mean [low, high]`, each times `scale`."""
    m, lo, hi = (scale * float(stat[k]) for k in ("mean", "low", "high"))
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def members(heads) -> str:
    """Heads of a coalition numbered from 1: `2+5+7`."""
    return "+".join(str(numbering.head_number(h)) for h in heads)


def shapley_cells(summary: Mapping, scale: float) -> list[str]:
    """Each head's Shapley value with its interval."""
    stat = summary["shapley"]
    return [interval({k: v[h] for k, v in stat.items()}, scale) for h in range(len(stat["mean"]))]


def dividend_cells(summary: Mapping, scale: float) -> list[str]:
    """The strongest dividends (`heads: value [interval]`) and the negative shares (%)."""
    cells = []
    for key, _ in STRONGEST:
        d = summary.get(key)
        cells.append("-" if d is None else f"{members(d['heads'])}: {interval(d, scale)}")
    cells += [interval(summary[k], 100.0, 1) if k in summary else "-" for k, _ in SHARES]
    return cells


def section(
    by_layer: Mapping, figures: Mapping[str, str] | None = None, heading="Coalitions of heads"
) -> list[str]:
    """The Markdown section: per game, a Shapley table and a dividend table (layers from
    1), then the interaction figures ({objective: file name})."""
    figures = figures or {}
    lines = [f"## {heading}", "", HEAD_NOTE]
    for objective, (title, scale, unit) in OBJECTIVES.items():
        rows = {k: d[objective] for k, d in by_layer.items() if objective in d}
        if not rows:
            continue
        num_heads = len(next(iter(rows.values()))["shapley"]["mean"])
        lines += ["", f"### Shapley values on the {title} ({unit})", ""]
        heads = [numbering.head_name(h) for h in range(num_heads)]
        lines += tables.layer_table(heads, [(k, shapley_cells(s, scale)) for k, s in rows.items()])
        if any("strongest_positive_pair" in s for s in rows.values()):
            lines += ["", f"### Harsanyi dividends on the {title} ({unit})", ""]
            columns = [label for _, label in (*STRONGEST, *SHARES)]
            body = [(k, dividend_cells(s, scale)) for k, s in rows.items()]
            lines += tables.layer_table(columns, body)
        if objective in figures:
            lines += ["", f"![pairwise interaction, {objective}]({figures[objective]})"]
    return lines


def interaction_by_layer(by_layer: Mapping, objective: str) -> dict:
    """{layer key: H x H mean pairwise interaction} of the layers that have it, in the
    report's units (`OBJECTIVES`), the diagonal (the Shapley values) NaN: a pair's
    interaction and a head's value are not on one scale."""
    scale = OBJECTIVES[objective][1]
    out = {}
    for k, d in by_layer.items():
        if objective in d and "interaction" in d[objective]:
            mat = scale * np.asarray(d[objective]["interaction"], np.float64)
            np.fill_diagonal(mat, np.nan)
            out[k] = mat
    return out


def figure_files(by_layer: Mapping, stem: str = "coalitions") -> dict[str, str]:
    """{objective: file name} of the interaction figures the summary supports."""
    return {
        objective: f"{stem}_interaction_{objective}.png"
        for objective in OBJECTIVES
        if interaction_by_layer(by_layer, objective)
    }


def draw(by_layer: Mapping, plt, stem: str = "coalitions", title: str = "") -> dict:
    """{file name: a function drawing its figure}, as `files.write_figures` takes them."""
    out = {}
    for objective, name in figure_files(by_layer, stem).items():
        mats = interaction_by_layer(by_layer, objective)
        label = f"pairwise interaction ({OBJECTIVES[objective][2]})"
        heading = f"{title} pairwise Shapley interaction, {objective}".strip()
        out[name] = lambda m=mats, lab=label, h=heading: report_figures.interaction(m, plt, lab, h)
    return out
