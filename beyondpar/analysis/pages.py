"""A text analysis record or a corpus summary -> the dict `reports.html` draws as
index.html: per layer a row per mix and per head with the record's own numbers (means,
and intervals where the summary has them), the views of a few texts or windows
(`analysis.views`), and each layer's coalition values where the analysis played the heads'
games (the record's or summary's `coalitions`: {layer: {"fidelity": ...}})."""

from __future__ import annotations

import numpy as np

from beyondpar.measure import record as schema
from beyondpar.reports import html, numbering

# The layer table's columns: record fields, their labels and how the page shows them.
COLUMNS = (
    (schema.FIDELITY, "minimax fidelity"),
    (schema.MEDIAN, "median fidelity"),
    (schema.P10, "p10 fidelity"),
    (schema.HITTING_NORMALIZED, "hitting time, normalised"),
    ("hitting_time_reference", "hitting time, reference"),
    (schema.GAIN.name, "gain over best head"),
    ("wins_share", "wins over best head"),
    (schema.SINK_MASS.name, "sink mass"),
)
SHOWN_UNITS = {"fraction": (100, "%"), "steps": (1, "steps"), "tv": (1, "TV")}
# The page's names of the fidelity game's values, as the record names the fields.
SHAPLEY = schema.coalition_field("shapley", schema.FIDELITY)
INTERACTION = schema.coalition_field("interaction", schema.FIDELITY)
MIX_ORDER = (schema.LEARNED, schema.UNIFORM, schema.OPTIMAL)  # JSON sorts them by name
HELD_OUT = {schema.OPTIMAL: "optimal, held out"}  # a corpus optimum is always cross-fitted
_K = {name for name, _ in COLUMNS}


def fields(layer_rows: list[list[dict]]) -> list[dict]:
    """The columns some row of some layer has a value for, with their units."""
    present = {name for rows in layer_rows for row in rows for name in row["values"]}
    out = []
    for name, label in COLUMNS:
        if name not in present:
            continue
        unit = "fraction" if name == "wins_share" else schema.unit_of(name)
        scale, shown = SHOWN_UNITS[unit]
        if name == schema.GAIN.name:
            shown = "pp"
        if name == schema.SINK_MASS.name:  # a share of attention, as report.md gives it
            scale, shown = 1, "fraction"
        out.append(
            {"name": name, "label": label, "unit": unit, "scale": scale, "display_unit": shown}
        )
    return out


def ordered(mixes) -> list[str]:
    """Learned, uniform, optimal, then any other mix by name."""
    rank = lambda m: (MIX_ORDER.index(m) if m in MIX_ORDER else len(MIX_ORDER), m)
    return sorted(mixes, key=rank)


def interval(s: dict) -> dict:
    return html.stat(s["mean"], s["low"], s["high"])


def corpus_rows(d: dict) -> list[dict]:
    """A corpus summary layer's rows: its stats are {mean, low, high} (per head, lists)."""
    rows = []
    for name in ordered(d["mixes"]):
        mix = d["mixes"][name]
        values = {f: interval(s) for f, s in mix.items() if f in _K and isinstance(s, dict)}
        if "wins_share" in mix:
            values["wins_share"] = html.stat(mix["wins_share"])
        label = HELD_OUT.get(name, name)
        rows.append({"name": f"mix: {label}", "kind": "mix", "values": values})
    per_head = {f: s for f, s in d["heads"].items() if f in _K}
    if schema.SINK_MASS.name in d:
        per_head[schema.SINK_MASS.name] = d[schema.SINK_MASS.name]
    for h in range(len(d["heads"][schema.FIDELITY]["mean"])):
        values = {
            f: html.stat(s["mean"][h], s["low"][h], s["high"][h]) for f, s in per_head.items()
        }
        rows.append({"name": numbering.head_name(h), "kind": "head", "head": h, "values": values})
    return rows


def text_rows(d: dict) -> list[dict]:
    """A text record layer's rows: means over its sequences ((B,) per mix, (B, H) per
    head), as report.md shows them."""
    rows = []
    for name in ordered(d["mixes"]):
        mix = d["mixes"][name]
        values = {f: html.stat(np.mean(v)) for f, v in mix.items() if f in _K}
        rows.append({"name": f"mix: {name}", "kind": "mix", "values": values})
    per_head = {f: np.asarray(v) for f, v in d["heads"].items() if f in _K}
    if schema.SINK_MASS.name in d:
        per_head[schema.SINK_MASS.name] = np.asarray(d[schema.SINK_MASS.name])
    for h in range(per_head[schema.FIDELITY].shape[-1]):
        values = {f: html.stat(np.mean(v[..., h])) for f, v in per_head.items()}
        rows.append({"name": numbering.head_name(h), "kind": "head", "head": h, "values": values})
    return rows


def coalitions(games: dict) -> dict | None:
    """A layer's Shapley values (H,) and pair interactions (H, H) of minimax fidelity from
    its entry of the `coalitions` summary (`analysis.coalition_summary.summarize`): the
    means over sequences or windows, as report.md shows them; None when the layer has
    no fidelity game. Sampled games have no interaction."""
    game = (games or {}).get(schema.FIDELITY)
    if game is None:
        return None
    out = {SHAPLEY: [float(v) for v in game["shapley"]["mean"]]}
    if "interaction" in game:
        out[INTERACTION] = np.asarray(game["interaction"], np.float64).tolist()
    return out


def layers(by_layer: dict, rows_of, games: dict | None = None) -> list[dict]:
    """The page's layers, each with its coalition values where `games` (the `coalitions`
    summary, {layer key: ...}) has the layer."""
    games = games or {}
    out = []
    # A summary read back from JSON has its layer keys sorted as text ("10" before "2").
    for key, d in sorted(by_layer.items(), key=lambda item: int(item[0])):
        entry = {"key": str(key), "number": numbering.number(key), "rows": rows_of(d)}
        found = coalitions(games.get(str(key)))
        if found is not None:
            entry[schema.COALITIONS] = found
        out.append(entry)
    return out


def assemble(title: str, notes: list[str], layer_list: list[dict], views: list) -> dict:
    return {
        "title": title,
        "notes": notes,
        "fields": fields([entry["rows"] for entry in layer_list]),
        "layers": layer_list,
        "views": views,
    }


def text_page(record: dict, views: list | None = None) -> dict:
    """The page of a text analysis (or of attention from a file: no views)."""
    notes = [
        numbering.note("analysis.json"),
        f"{record['num_sequences']} sequence(s) of {record['seq_len']} tokens; "
        f"{record['num_layers']} layers x {record['num_heads']} heads. Values: mean over "
        "sequences; fidelity in %, hitting time in steps (see report.md).",
    ]
    layer_list = layers(record["layers"], text_rows, record.get(schema.COALITIONS))
    return assemble(f"Attention analysis: {record['source']}", notes, layer_list, views or [])


def corpus_page(summary: dict, views: list | None = None) -> dict:
    """The page of a corpus analysis: means over windows with 95% bootstrap intervals."""
    notes = [
        numbering.note("corpus.json", "windows.jsonl"),
        f"Corpus {summary['corpus']}: {summary['num_windows']} windows of "
        f"{summary['tokens_per_window']} tokens. Values: mean over windows [95% bootstrap "
        "interval]; fidelity in %, hitting time in steps (see report.md).",
    ]
    layer_list = layers(summary["layers"], corpus_rows, summary.get(schema.COALITIONS))
    return assemble(f"Corpus analysis: {summary['source']}", notes, layer_list, views or [])
