"""Evaluation records -> the dict `reports.html` draws as the study's index.html: a layer
entry per (run, layer) of each run's latest step, with its mixes and heads (the records'
means over sequences), the measures against head count (mean over seeds ± std, as in
report.md), each run's training loss against step from its metrics.jsonl, and, where the
record carries it (`attention_view`), the attention of its first evaluation sequence and
every token's flow to the sink, drawn as the analyses' pages draw theirs. It takes what
`study.report` has already aggregated, so that the report can call it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from beyondpar.base import files
from beyondpar.reports import html, numbering
from beyondpar.study import attention_view
from beyondpar.study.workdir import METRICS_FILE

LOSS = "train/loss"
HITTING = "hitting_time"
FIELDS = [
    {"name": html.FIDELITY, "label": "minimax fidelity", "unit": "fraction", "scale": 100,
     "display_unit": "%"},
    {"name": HITTING, "label": "hitting time", "unit": "steps", "scale": 1,
     "display_unit": "steps"},
]  # fmt: skip
# Mixes of a record: (row name, fidelity column, hitting-time column).
MIXES = (
    ("mix: learned", "fidelity", "hitting_time"),
    ("mix: uniform", "fidelity_uniform", "hitting_time_uniform"),
    ("mix: optimal, held out", "fidelity_optimal", "hitting_time_optimal"),
)


def mean_at(metrics: dict, name: str, layer: int, head: int | None = None):
    """The record's mean of `name` at a layer (and head), or None when it lacks it."""
    if name not in metrics:
        return None
    value = np.asarray(metrics[name]["mean"], np.float64)[layer]
    return float(value if head is None else value[head])


def values(metrics: dict, names: tuple, layer: int, head: int | None = None) -> dict:
    found = {
        f["name"]: mean_at(metrics, n, layer, head) for f, n in zip(FIELDS, names, strict=True)
    }
    return {k: html.stat(v) for k, v in found.items() if v is not None}


def layer_key(run: str, layer) -> str:
    """The page's key of a run's layer (0-based, an int or its JSON string)."""
    return f"{run}/{int(layer)}"


def run_layers(r: dict) -> list[dict]:
    """A run's latest record as one layer entry per layer."""
    m = r["metrics"]
    out = []
    for layer in range(r["layers"]):
        rows = [
            {"name": name, "kind": "mix", "values": values(m, (fid, hit), layer)}
            for name, fid, hit in MIXES
            if fid in m
        ]
        for h in range(r["heads"] if "fidelity_per_head" in m else 0):
            per_head = values(m, ("fidelity_per_head", "hitting_time_per_head"), layer, h)
            name = numbering.head_name(h)
            rows.append({"name": name, "kind": "head", "head": h, "values": per_head})
        label = f"{r['run']}, layer {numbering.number(layer)}"
        key = layer_key(r["run"], layer)
        out.append({"key": key, "number": numbering.number(layer), "label": label, "rows": rows})
    return out


def views(runs: list[dict]) -> list[dict]:
    """A view per run whose record carries its attention, its layers under the keys of the
    run's layer entries: choosing a run's layer on the page shows its view."""
    out = []
    for r in runs:
        view = r.get(attention_view.KEY)
        if view is None:  # a record written before evaluations kept attention
            continue
        layers = {layer_key(r["run"], k): v for k, v in view["layers"].items()}
        name = f"{attention_view.NAME} of {r['run']}"
        out.append({"name": name, "labels": view["labels"], "pool": view["pool"], "layers": layers})
    return out


def series(cells: dict) -> list[dict]:
    """Fidelity and hitting time against head count, a line per (task, layer), from
    `report.aggregate`'s cells."""
    out = []
    for task in sorted({t for t, _ in cells}):
        heads = sorted(h for t, h in cells if t == task)
        for name, unit in ((html.FIDELITY, "fraction"), (HITTING, "steps")):
            if not all(name in cells[(task, h)] for h in heads):
                continue
            for layer in range(len(cells[(task, heads[0])][name][0])):
                mean = [float(cells[(task, h)][name][0][layer]) for h in heads]
                std = [float(cells[(task, h)][name][1][layer]) for h in heads]
                label = f"{task}, layer {numbering.number(layer)}"
                out.append({"name": label, "unit": unit, "heads": heads, "mean": mean, "std": std})
    return out


def loss_curves(records: list[dict], runs_root: Path | None) -> list[dict]:
    """Each run's logged training loss against step, where its metrics.jsonl is found."""
    if runs_root is None:
        return []
    curves = []
    for run in sorted({r["run"] for r in records}):
        lines = files.read_json_lines(Path(runs_root) / run / METRICS_FILE, ("step",))
        logged = [line for line in lines if LOSS in line]
        if logged:
            steps = [line["step"] for line in logged]
            curves.append({"name": run, "step": steps, "loss": [line[LOSS] for line in logged]})
    return curves


def page(runs: list[dict], cells: dict, records: list[dict], runs_root=None) -> dict:
    """The page of each run's latest record (`runs`), the cells of `report.aggregate`,
    and the loss curves of every run of `records` found under `runs_root`."""
    study = {
        "head_counts": sorted({r["heads"] for r in runs}),
        "series": series(cells),
        "curves": loss_curves(records, runs_root),
    }
    shown = views(runs)
    note = (
        f"Layers are numbered from 1, as in report.md. {numbering.head_note()} Each "
        "run's latest evaluated step; values are means over the evaluation sequences "
        "(results.json has their std)."
    )
    if shown:
        note += (
            f" Attention and flow to the sink: {attention_view.NAME} of each run (token "
            "ids on the axes)."
        )
    return {
        "title": "Study: mixing time and minimax fidelity against head count",
        "notes": [note],
        "fields": FIELDS,
        "layers": [entry for r in runs for entry in run_layers(r)],
        "views": shown,
        "study": study,
    }
