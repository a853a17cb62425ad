"""An analysis record -> report.md, analysis.json and plots. The report and its plots
number layers from 1, as the paper does; the record (analysis.json) keeps the
checkpoint's 0-based layer keys, as the `--layers` flag does. Field names and units are
the record's own (`beyondpar.measure.record`)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from beyondpar.analysis import pages, views
from beyondpar.base import files, locks
from beyondpar.measure import record as schema
from beyondpar.reports import coalitions, figures, html, numbering, tables

FIDELITY, MEDIAN, P10 = schema.FIDELITY, schema.MEDIAN, schema.P10
BEST_HEAD_FIDELITY, DIVERSITY = schema.BEST_HEAD_FIDELITY, schema.DIVERSITY
CROSS_HEAD_SHARE = schema.CROSS_HEAD_SHARE
GAIN, SINK_MASS = schema.GAIN.name, schema.SINK_MASS.name
HEAD_FIELDS = (
    FIDELITY,
    MEDIAN,
    P10,
    "hitting_time_reference",
    schema.HITTING_NORMALIZED,
    "tv_mixing_time_normalized",
    "spectral_mixing_time_normalized",
)
# The head table: operator fields of the record, their column labels and digits;
# fractions are shown in percent (the reference walk's saturated TV and spectral times
# and the spectral radii stay in the JSON record).
HEAD_COLUMNS = tuple(
    zip(
        (schema.FIELDS[name] for name in HEAD_FIELDS),
        (
            "fidelity",
            "median",
            "p10",
            "hitting ref",
            "hitting norm",
            "TV mixing",
            "spectral mixing",
        ),
        (3, 3, 3, 2, 2, 1, 2),
        strict=True,
    )
)


def to_json(value):
    """Arrays to lists, integer keys to strings: a record JSON can hold."""
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return value


def _m(x) -> float:
    return float(np.mean(x))


def _sink_note(k: int) -> str:
    if not k:
        return "Sink mass: mean attention on the first token."
    return (
        f"Every metric is also computed without the first {k} token(s) (attention sinks), "
        "each row renormalised over the remaining keys: the tables marked 'without sink'."
    )


def markdown(record: dict) -> str:
    spec = record["spec"]
    k = spec.get("sink_tokens", 0)
    sink_note = _sink_note(k)
    lines = [
        f"# Attention analysis: {record['source']}",
        "",
        numbering.note("analysis.json", "the `--layers` flag"),
        "",
        f"{record['num_sequences']} sequence(s) of {record['seq_len']} tokens; "
        f"{record['num_layers']} layers x {record['num_heads']} query heads. Horizon "
        f"{spec['horizon']}, step cap {spec['max_steps']}, eps {spec['eps']}, rollout "
        f"residual {spec['residual']}. Fidelity in %; hitting time in steps on both walks; "
        "TV and spectral mixing on the normalised walk (the reference walk saturates on "
        "causal attention). Values: mean over sequences. "
        "Fidelity median / p10: the median and 10th percentile over tokens of node fidelity "
        "(the minimax fidelity is their minimum). The baseline row is uniform causal "
        f"attention of the same length through the same metrics. {sink_note}",
        "",
        "## Whole network (attention rollout)",
        "",
        "Network fidelity min_j R[tau, j]: "
        f"{100 * _m(record['rollout']['network_fidelity']):.4f}%. "
        f"Largest shares: {_top_shares(record)}.",
        "",
        "![sink share per token](sink_share.png)",
        "",
        "## Layers",
        "",
    ]
    lines += _layer_table(record, "layers", lambda d: d, record.get("baseline"))
    if k:
        lines += ["", f"## Layers without sink (first {k} token(s) dropped)", ""]
        lines += _layer_table(
            record, "layers", lambda d: d[schema.WITHOUT_SINK], record.get("baseline_without_sink")
        )
    for layer, d in record["layers"].items():
        number = numbering.number(layer)
        lines += ["", f"### Layer {number}", ""]
        lines += _head_table(d)
        if k:
            inner = d[schema.WITHOUT_SINK]
            lines += ["", f"Layer {number} without sink:", "", *_head_table(inner)]
        if schema.OPTIMAL in d:
            lines += ["", optimal_line(d)]
            if k:
                lines += ["", "Without sink: " + optimal_line(d[schema.WITHOUT_SINK])]
    if any("pairwise_synergy" in d for d in record["layers"].values()):
        lines += ["", "![pairwise synergy](pairwise_synergy.png)"]
    lines += ["", "![per-head fidelity](fidelity_heads.png)"]
    lines += coalition_lines(record)
    timings = record.get("timings_s", {})
    if timings:
        lines += ["", "## Time (s)", "", "| part | seconds |", "|---|---:|"]
        lines += [f"| {name} | {sec:.2f} |" for name, sec in timings.items()]
    return "\n".join(lines) + "\n"


def optimal_line(d: dict) -> str:
    """The optimum of a layer: held out (each sequence measured with weights searched on
    the other folds) beside its in-sample value, or in sample only and said so."""
    o = d[schema.OPTIMAL]
    measured = 100 * _m(d["mixes"][schema.OPTIMAL][FIDELITY])
    searched = 100 * _m(o["in_sample"])
    weights = "; ".join(
        "(" + ", ".join(f"{w:.3f}" for w in fold) + ")" for fold in np.asarray(o["fold_weights"])
    )
    if not o["held_out"]:
        return (
            f"Optimal weights {weights}: fidelity {measured:.3f}%, in sample (one sequence: "
            "nothing to hold out)."
        )
    return (
        f"Optimal weights per fold {weights}: fidelity {measured:.3f}% held out (each "
        f"sequence measured with the weights searched on the other folds), {searched:.3f}% "
        "in sample (each search on its own sequences)."
    )


def _top_shares(record: dict, count: int = 5) -> str:
    share = np.mean(record["rollout"]["sink_share"], axis=0)
    labels = record.get("token_labels") or [str(i) for i in range(len(share))]
    top = np.argsort(-share)[:count]
    return ", ".join(f"{i} {labels[i]!r} {100 * share[i]:.2f}%" for i in top)


def _layer_table(record: dict, key: str, pick, base: dict | None) -> list[str]:
    columns = [
        "best head",
        "best head (%)",
        "learned mix (%)",
        "uniform mix (%)",
        "gain learned (pp)",
        "uniform median (%)",
        "uniform p10 (%)",
        "sink mass",
        "diversity",
        "cross-head share",
    ]
    rows = [(layer, _layer_cells(pick(full), full)) for layer, full in record[key].items()]
    closing = []
    if base is not None:
        percent = {f: f"{100 * base[f]:.3f}" for f in (FIDELITY, MEDIAN, P10)}
        closing.append(
            ["baseline: uniform causal", "-", "-", "-", percent[FIDELITY], "-"]
            + [percent[MEDIAN], percent[P10], "-", "-", "-"]
        )
    return tables.layer_table(columns, rows, closing)


def _layer_cells(d: dict, full: dict) -> list[str]:
    """A layer's row: its most frequent best head, then means over sequences; the sink
    mass is the full graph's."""
    mixes = d["mixes"]
    learned = mixes.get(schema.LEARNED, mixes[schema.UNIFORM])
    uniform = mixes[schema.UNIFORM]
    return [
        str(numbering.head_number(np.bincount(np.asarray(d["best_head"])).argmax())),
        f"{100 * _m(d[BEST_HEAD_FIDELITY]):.3f}",
        f"{100 * _m(learned[FIDELITY]):.3f}",
        f"{100 * _m(uniform[FIDELITY]):.3f}",
        f"{100 * _m(learned[GAIN]):+.3f}",
        f"{100 * _m(uniform[MEDIAN]):.3f}",
        f"{100 * _m(uniform[P10]):.3f}",
        f"{_m(full[SINK_MASS]):.3f}",
        f"{_m(d[DIVERSITY]):.3f}",
        f"{_m(d[CROSS_HEAD_SHARE]):.3f}",
    ]


def _head_table(d: dict) -> list[str]:
    labels = [label + (" (%)" if f.unit == "fraction" else "") for f, label, _ in HEAD_COLUMNS]
    lines = [
        tables.row(["operator", *labels, SINK_MASS.replace("_", " ")]),
        "|---|" + "---:|" * (len(HEAD_COLUMNS) + 1),
    ]

    def row(name, values, sink="-"):
        return tables.row([name, *(_cell(f, values[f.name], n) for f, _, n in HEAD_COLUMNS), sink])

    for name, f in d["mixes"].items():
        lines.append(row(f"mix: {name}", f))
    heads = d["heads"]
    sink = d.get(SINK_MASS)
    for h in range(np.asarray(heads[FIDELITY]).shape[-1]):
        mass = "-" if sink is None else f"{_m(np.asarray(sink)[:, h]):.3f}"
        per_head = {k: np.asarray(v)[:, h] for k, v in heads.items()}
        lines.append(row(numbering.head_name(h), per_head, mass))
    return lines


def _cell(field: schema.Field, values, digits: int) -> str:
    """The mean over sequences; a fraction in percent."""
    scale = 100 if field.unit == "fraction" else 1
    return f"{scale * _m(values):.{digits}f}"


def plot_sink_share(record: dict, plt, labelled: int = 8):
    """Each token's share on a log scale (a sink with ~100% no longer flattens the rest),
    the largest `labelled` shares named by their token."""
    share = 100 * np.mean(record["rollout"]["sink_share"], axis=0)
    labels = record.get("token_labels") or [str(i) for i in range(len(share))]
    fig, ax = plt.subplots(figsize=(min(0.18 * len(share) + 2, 24), 3.8))
    ax.bar(np.arange(len(share)), np.maximum(share, 1e-12), width=0.85)
    ax.set_yscale("log")
    for i in np.argsort(-share)[:labelled]:
        ax.annotate(repr(labels[i]), (i, share[i]), fontsize=7, rotation=45, ha="left")
    ax.set(
        xlabel="token position",
        ylabel="share at the last token (%, log)",
        title="rollout: each token's share in the sink",
    )
    ax.margins(x=0.005)
    fig.tight_layout()
    return fig


def plot_head_fidelity(record: dict, plt):
    layers = list(record["layers"])
    grid = np.stack([100 * np.mean(record["layers"][k]["heads"][FIDELITY], 0) for k in layers])
    fig, ax = plt.subplots(figsize=(0.5 * grid.shape[1] + 3, 0.4 * len(layers) + 2))
    image = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(layers)), [str(numbering.number(k)) for k in layers])
    figures.label_heads(ax.xaxis, grid.shape[1])
    ax.set(xlabel="head", ylabel="layer", title="minimax fidelity per head (%)")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    return fig


def pairwise_by_layer(record: dict) -> dict:
    """{layer index: H x H} of each 50/50 pair's fidelity minus its better head (pp), mean
    over sequences, for the layers that have it."""
    return {
        k: 100 * np.mean(d["pairwise_synergy"], 0)
        for k, d in record["layers"].items()
        if "pairwise_synergy" in d
    }


def coalition_lines(record: dict) -> list[str]:
    """The coalitions section, when the record has the heads' games."""
    if "coalitions" not in record:
        return []
    games = record["coalitions"]
    return ["", *coalitions.section(games, coalitions.figure_files(games))]


def write(record: dict, out_dir: str | os.PathLike) -> list[Path]:
    """report.md, analysis.json, index.html and the PNG plots; returns their paths. The
    record's views (attention of the text) go to index.html only. The folder is
    locked while they are written: another process writing there is FolderBusy. A plot
    this record has no data for (pairwise synergy, when not asked for) is removed if an
    earlier analysis left one, so the folder holds one analysis only."""
    out_dir = Path(out_dir)
    plots = {"sink_share.png": plot_sink_share, "fidelity_heads.png": plot_head_fidelity}
    pairwise = any("pairwise_synergy" in d for d in record["layers"].values())
    if pairwise:
        plots["pairwise_synergy.png"] = lambda r, plt: figures.pairwise(pairwise_by_layer(r), plt)
    plt = files.pyplot()
    drawn = {name: lambda plot=plot: plot(record, plt) for name, plot in plots.items()}
    drawn.update(coalitions.draw(record.get("coalitions", {}), plt))
    kept = {k: v for k, v in record.items() if k != views.KEY}
    with locks.lock(out_dir):
        written = [
            files.write_text(out_dir / "report.md", markdown(record)),
            files.write_json(out_dir / "analysis.json", to_json(kept)),
            html.write(out_dir, pages.text_page(to_json(kept), record.get(views.KEY))),
        ]
        if not pairwise:
            (out_dir / "pairwise_synergy.png").unlink(missing_ok=True)
        return written + files.write_figures(out_dir, drawn)
