"""The language study's runs -> the dict `reports.html` draws as its index.html, from the
same `lm_stats` numbers as report.md and results.json: a table of every measure per head
count at the last evaluation (mean and 95% interval over seeds), and charts of the losses
and graph measures against heads and of each measure against step, a line per head count.
It follows `study.report_page`: the table is one layer entry whose rows are head counts."""

from __future__ import annotations

import math

from beyondpar.reports import html
from beyondpar.study import lm_stats
from beyondpar.study.lm_stats import BPB_KEY, GRAPHS, LOSS_KEY, LOSSES, OPTIMAL_WINS

UNITS = {LOSS_KEY: "nats/token", BPB_KEY: "bits/byte"}
LABELS = {LOSS_KEY: "held-out loss", BPB_KEY: "held-out bits per byte"}
FIELDS = [
    {
        "name": name,
        "label": LABELS[name],
        "unit": UNITS[name],
        "scale": 1,
        "display_unit": UNITS[name],
    }
    for name in LOSSES
] + [
    {"name": name, "label": label, "unit": "fraction", "scale": 100, "display_unit": "%"}
    for name, label in GRAPHS.items()
]
TABLE_KEY = "last"


def stat(cell: dict) -> dict:
    """A cell's mean, with its interval only where the seeds give one."""
    if math.isnan(cell["low"]):
        return html.stat(cell["mean"])
    return html.stat(cell["mean"], cell["low"], cell["high"])


def table(summary: dict) -> dict:
    """The one layer entry: a row per head count, a column per measure."""
    rows = [
        {
            "name": f"H={h}",
            "kind": "heads",
            "heads": h,
            "values": {n: stat(c[h]) for n, c in summary["cells"].items() if h in c},
        }
        for h in summary["heads"]
    ]
    label = "last evaluation, mean over seeds [95% interval]"
    return {"key": TABLE_KEY, "number": 1, "label": label, "rows": rows}


def line(name: str, by_x: dict) -> dict:
    """A chart line: x, and the mean and interval (None where there is none) at each x."""
    cells = list(by_x.values())
    finite = [
        {k: None if math.isnan(c[k]) else c[k] for k in ("mean", "low", "high")} for c in cells
    ]
    return {
        "name": name,
        "x": list(by_x),
        "mean": [c["mean"] for c in finite],
        "low": [c["low"] for c in finite],
        "high": [c["high"] for c in finite],
    }


def chart(title: str, x: str, unit: str, lines: list[dict], scale: float = 1) -> dict:
    return {"title": title, "x": x, "y": unit, "scale": scale, "lines": lines}


def against_heads(summary: dict) -> list[dict]:
    """Losses, fidelities and the optimal mix's wins against heads (last evaluation)."""
    cells = summary["cells"]
    out = [chart(LOSSES[m], "heads", UNITS[m], [line(LOSSES[m], cells[m])]) for m in LOSSES]
    fidelities = [line(GRAPHS[n], cells[n]) for n in GRAPHS if n != OPTIMAL_WINS and n in cells]
    if fidelities:
        title = "Minimax fidelity against heads (last evaluation)"
        out.append(chart(title, "heads", "minimax fidelity, layer mean (%)", fidelities, 100))
    wins = {h: s for h, s in cells.get(OPTIMAL_WINS, {}).items() if h > 1}
    if wins:
        lines = [line(GRAPHS[OPTIMAL_WINS], wins)]
        out.append(chart(GRAPHS[OPTIMAL_WINS], "heads", "windows won (%)", lines, 100))
    return out


def against_step(runs: list[dict]) -> list[dict]:
    """Each measure against step, a line per head count (mean over seeds)."""
    out = []
    for metric, label in lm_stats.METRICS.items():
        by_heads = lm_stats.over_steps(runs, metric)
        if metric == OPTIMAL_WINS:
            by_heads = {h: s for h, s in by_heads.items() if h > 1}
        if not by_heads:
            continue
        unit, scale = (UNITS[metric], 1) if metric in LOSSES else ("%", 100)
        lines = [line(f"H={h}", steps) | {"heads": h} for h, steps in by_heads.items()]
        out.append(chart(f"{label} against step", "step", unit, lines, scale) | {"metric": metric})
    return out


def page(runs: list[dict]) -> dict:
    """The language study's page."""
    summary = lm_stats.summarize(runs)
    return {
        "title": "Language study: heads at equal parameters",
        "notes": [
            "Each run's last evaluation, mean over seeds with 95% Student-t intervals, as in "
            "report.md and results.json. Graph measures are means over layers and held-out "
            "windows (shares and fidelities: their intervals are cut at 0 and 100%).",
        ],
        "row_label": "heads",
        "fields": FIELDS,
        "layers": [table(summary)],
        "study": {
            "head_counts": summary["heads"],
            "series": [],
            "curves": [],
            "charts": against_heads(summary) + against_step(runs),
        },
    }
