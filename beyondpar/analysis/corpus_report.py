"""A corpus summary -> report.md (means over windows with 95% bootstrap intervals that
resample their documents, saying how and over how many, a uniform causal baseline row,
wins of each mix over its best head, pruning curves) and plots. The report and its plots
number layers from 1, as the paper does; corpus.json and windows.jsonl keep the
checkpoint's 0-based layer keys. Field names and units are the record's own
(`beyondpar.measure.record`)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from beyondpar.analysis import pages, views
from beyondpar.base import files, locks
from beyondpar.measure import record as schema
from beyondpar.reports import coalitions, figures, html, numbering, tables

FIDELITY, MEDIAN, P10 = schema.FIDELITY, schema.MEDIAN, schema.P10
HITTING = schema.HITTING_NORMALIZED
BEST_HEAD_FIDELITY = schema.BEST_HEAD_FIDELITY
GAIN, SINK_MASS = schema.GAIN.name, schema.SINK_MASS.name


def _ci(stat: dict, scale: float = 100, digits: int = 3) -> str:
    return (
        f"{scale * stat['mean']:.{digits}f} "
        f"[{scale * stat['low']:.{digits}f}, {scale * stat['high']:.{digits}f}]"
    )


def _at(stat: dict, i: int) -> dict:
    return {k: v[i] for k, v in stat.items()}


MIX_LABELS = {schema.OPTIMAL: "optimal, held out"}
MIX_ORDER = (
    schema.LEARNED,
    schema.UNIFORM,
    schema.OPTIMAL,
)  # a summary read back from JSON is sorted


LAYER_NOTE = numbering.note("corpus.json", "windows.jsonl")


def ordered_mixes(mixes) -> list[str]:
    return sorted(mixes, key=lambda m: (MIX_ORDER.index(m) if m in MIX_ORDER else 99, m))


def markdown(summary: dict) -> str:
    spec = summary["spec"]
    k = spec.get("sink_tokens", 0)
    lines = [f"# Corpus analysis: {summary['source']}", "", LAYER_NOTE, ""]
    lines += [_corpus_line(summary), ""]
    lines += [_values_line(spec, k), "", intervals_line(summary), ""]
    if schema.OPTIMAL in summary:
        lines += [_optimal_line(summary[schema.OPTIMAL], k), ""]
    lines += [
        "Rollout: network fidelity "
        f"{_ci(summary['rollout']['network_fidelity'], digits=4)}%, first token's share at "
        f"the last position {_ci(summary['rollout']['first_token_share'], digits=1)}%.",
        "",
        "![minimax fidelity per layer](fidelity_layers.png)",
        "",
        "## Layers",
        "",
        *_layer_table(summary, "", summary["baseline"]["baseline"]),
    ]
    if k:
        lines += ["", f"## Layers without the first {k} token(s)", ""]
        lines += _layer_table(
            summary, "_without_sink", summary["baseline"]["baseline_without_sink"]
        )
    base = summary["baseline"]["baseline"]
    for layer, d in summary["layers"].items():
        lines += ["", f"### Layer {numbering.number(layer)}", "", *_head_table(d, base)]
    if "pruning" in summary:
        lines += ["", *_pruning_table(summary["pruning"])]
    if "coalitions" in summary:
        lines += _coalition_lines(summary)
    return "\n".join(lines) + "\n"


def _corpus_line(summary: dict) -> str:
    return (
        f"Corpus {summary['corpus']}: {summary['num_documents']} documents; "
        f"{summary['num_windows']} windows of {summary['tokens_per_window']} tokens "
        f"(of {summary['total_windows']} in the corpus, taken in document order, "
        f"consecutive within a document) from {summary['documents_used']} documents. "
        f"Dropped: {summary['dropped_tail_tokens']} tail tokens shorter than a window, "
        f"{summary['short_documents']} documents shorter than one window."
    )


def _values_line(spec: dict, k: int) -> str:
    line = (
        "Values: mean over windows [95% percentile-bootstrap interval]. Fidelity in %, "
        f"hitting time in steps (horizon {spec['horizon']}, step cap {spec['max_steps']}). "
        "'wins': share of windows where the mix keeps more of its worst token than its "
        "best head. The baseline is uniform causal attention of the same length."
    )
    if k:
        line += (
            f" Every metric is also given without the first {k} token(s), rows "
            "renormalised over the remaining keys."
        )
    return line


# What a summary written before its intervals resampled documents had.
_WINDOWS_ALONE = (
    "bootstrap over windows treated as independent (this summary was written before "
    "intervals resampled documents), so they may be too narrow."
)


def intervals_line(summary: dict) -> str:
    """How the intervals were found: the resampling, over how many units, and its scope."""
    text = summary.get("intervals", {}).get("text", _WINDOWS_ALONE)
    return f"95% intervals: {text}"


def _optimal_line(optimal: dict, sink_tokens: int) -> str:
    folds = ", ".join(
        f"fold {f} (windows {a}-{b - 1}) searched on windows {_windows(s)}"
        for f, ((a, b), s) in enumerate(
            zip(optimal["folds"], optimal["search_windows"], strict=True)
        )
    )
    if not optimal["held_out"]:
        return (
            "Optimal: one mix per layer searched on the only window, so its value is in "
            f"sample ({folds}); nothing was held out."
        )
    return (
        "Optimal, held out: one mix per layer and fold, searched (exact minimax fidelity) on "
        "windows outside the fold, and every window measured with the mix whose search did "
        f"not see it: {folds}. 'optimal in sample' is each search's own value on the windows "
        "it was searched on, averaged over folds: what an optimum scored where it was found "
        "claims, for comparison."
        + (" The graph without the sink tokens has its own search." if sink_tokens else "")
    )


def _windows(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices)


def _layer_table(summary: dict, suffix: str, base: dict) -> list[str]:
    pick = (lambda d: d[schema.WITHOUT_SINK]) if suffix else (lambda d: d)
    mixes = ordered_mixes(pick(next(iter(summary["layers"].values())))["mixes"])
    in_sample = summary.get(schema.OPTIMAL, {}).get(f"in_sample{suffix}")
    label = lambda m: MIX_LABELS.get(m, m)
    columns = ["best head", "best head (%)"]
    for m in mixes:
        columns += [f"{label(m)} (%)", f"gain {label(m)} (pp)", f"wins {label(m)}"]
    columns += ["optimal in sample (%)"] * (in_sample is not None) + ["sink mass"]
    rows = []
    for layer, full in summary["layers"].items():
        d = pick(full)
        cells = [str(numbering.head_number(d["best_head"])), _ci(d[BEST_HEAD_FIDELITY])]
        for m in mixes:
            mix = d["mixes"][m]
            cells += [_ci(mix[FIDELITY]), _ci(mix[GAIN]), f"{100 * mix['wins_share']:.0f}%"]
        if in_sample is not None:
            cells.append(f"{100 * in_sample[layer]:.3f}")
        cells.append(f"{np.mean(full[SINK_MASS]['mean']):.3f}")
        rows.append((layer, cells))
    closing = ["baseline: uniform causal", "-", "-", f"{100 * base[FIDELITY]:.3f}"]
    closing += ["-"] * (len(columns) + 1 - len(closing))
    return tables.layer_table(columns, rows, [closing])


def _head_table(d: dict, base: dict) -> list[str]:
    lines = [
        "| operator | fidelity (%) | median (%) | p10 (%) "
        f"| hitting norm ({schema.unit_of(HITTING)}) | sink mass |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def row(name, stat, sink="-"):
        cells = [_ci(stat[f]) for f in (FIDELITY, MEDIAN, P10)]
        return tables.row([name, *cells, _ci(stat[HITTING], 1, 2), sink])

    for name, stat in d["mixes"].items():
        lines.append(row(f"mix: {name}", stat))
    heads = d["heads"]
    for h in range(len(heads[FIDELITY]["mean"])):
        stat = {f: _at(v, h) for f, v in heads.items()}
        lines.append(row(numbering.head_name(h), stat, f"{d[SINK_MASS]['mean'][h]:.3f}"))
    percent = [f"{100 * base[f]:.3f}" for f in (FIDELITY, MEDIAN, P10)]
    lines.append(tables.row(["baseline: uniform causal", *percent, f"{base[HITTING]:.2f}", "-"]))
    return lines


def _pruning_table(pruning: dict) -> list[str]:
    lines = [
        "## Pruning heads: loss on the corpus",
        "",
        f"On the first {pruning['windows']} windows; heads removed from all to one per layer "
        "in each order. Loss AUC: lower means the order removes what the model needs last; "
        "accuracy AUC: higher is better.",
        "",
        "| order | loss, all heads | loss, last point | perplexity, last point "
        "| loss AUC | accuracy AUC |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, c in pruning.items():
        if name == "windows":
            continue
        lines.append(
            f"| {name} | {c['loss'][0]:.3f} | {c['loss'][-1]:.3f} | {c['perplexity'][-1]:.1f} "
            f"| {c['loss_auc']:.3f} | {c['accuracy_auc']:.3f} |"
        )
    return lines + ["", "![pruning curves](pruning.png)"]


def plot_layers(summary: dict, plt):
    """Minimax fidelity per layer of every mix and the best head, with their intervals, on
    a log scale (values span orders of magnitude below the uniform baseline) with plain
    tick labels; series side by side within a layer so that intervals do not hide each
    other. One panel per graph (with and without the sink tokens)."""
    panels = [("", "all tokens")]
    if summary["spec"].get("sink_tokens", 0):
        k = summary["spec"]["sink_tokens"]
        panels.append(("_without_sink", f"without the first {k} token(s)"))
    width = max(7, 0.28 * len(summary["layers"]) + 3)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 3.9 * len(panels)), squeeze=False)
    for ax, (suffix, title) in zip(axes[:, 0], panels, strict=True):
        _layer_panel(ax, summary, suffix, title)
    fig.tight_layout()
    return fig


def _layer_panel(ax, summary: dict, suffix: str, title: str) -> None:
    import matplotlib.ticker

    layers = [int(k) for k in summary["layers"]]
    numbers = np.asarray([numbering.number(k) for k in layers])
    pick = (lambda d: d[schema.WITHOUT_SINK]) if suffix else (lambda d: d)
    first = pick(next(iter(summary["layers"].values())))
    series = {
        MIX_LABELS.get(m, m): (lambda d, m=m: d["mixes"][m][FIDELITY])
        for m in ordered_mixes(first["mixes"])
    }
    series["best head"] = lambda d: d[BEST_HEAD_FIDELITY]
    stats = {
        name: [get(pick(summary["layers"][str(k)])) for k in layers] for name, get in series.items()
    }
    positive = [
        100 * v for st in stats.values() for s in st for v in (s["low"], s["mean"]) if v > 0
    ]
    floor = min(positive) / 2 if positive else 1e-6
    width = 0.8 / len(stats)
    for i, (name, st) in enumerate(stats.items()):
        x = numbers + (i - (len(stats) - 1) / 2) * width
        mean = np.maximum(100 * np.array([s["mean"] for s in st]), floor)
        low = np.maximum(100 * np.array([s["low"] for s in st]), floor)
        high = np.maximum(100 * np.array([s["high"] for s in st]), floor)
        ax.errorbar(x, mean, yerr=[mean - low, high - mean], fmt="o", ms=3, capsize=2, label=name)
    base = summary["baseline"][f"baseline{suffix}"][FIDELITY]
    ax.axhline(100 * base, color="gray", linestyle="--", label="uniform causal attention")
    ax.set_yscale("log")
    # Ticks at 1, 2 and 5 of every decade, written as plain numbers (0.02, not 2 x 10^-2).
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(numbers)
    ax.set(
        xlabel="layer",
        ylabel="minimax fidelity (%, log)",
        title=f"minimax fidelity per layer, {title}",
    )
    ax.grid(alpha=0.3, which="major")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)


def pruning_panels(summary: dict) -> list:
    """Next-token loss on the corpus as heads are pruned, a line per order, for
    `reports.figures.pruning`."""
    curves = {
        name: (c["heads_pruned"], c["loss"])
        for name, c in summary["pruning"].items()
        if name != "windows"
    }
    return [("next-token loss", curves)]


def _coalition_lines(summary: dict) -> list[str]:
    """The coalitions section, with the windows each game was played on."""
    games = summary["coalitions"]
    played = min(summary["corpus_spec"]["coalition_windows"], summary["num_windows"])
    loss = f"loss games on the first {played}" if played else "no loss games"
    found = summary.get("coalition_intervals", {})
    text = lambda game: found.get(game, {}).get("text", _WINDOWS_ALONE)
    lines = [
        "",
        *coalitions.section(games, coalitions.figure_files(games)),
        "",
        f"Fidelity games on all {summary['num_windows']} windows, {loss}. 95% intervals "
        f"of the fidelity games: {text('fidelity')}",
    ]
    if played:
        lines[-1] += f" Of the loss games: {text('loss')}"
    return lines


def write(summary: dict, out_dir: str | os.PathLike) -> list[Path]:
    """report.md, index.html and the PNG plots; returns their paths. The page shows the
    windows' attention that the analysis left in views.json, when it did. The folder is
    locked while they are written: another process writing there is FolderBusy."""
    out_dir = Path(out_dir)
    plots = {"fidelity_layers.png": plot_layers}
    if "pruning" in summary:
        title = "pruning heads on the corpus"
        plots["pruning.png"] = lambda s, plt: figures.pruning(pruning_panels(s), plt, title)
    plt = files.pyplot()
    drawn = {name: lambda plot=plot: plot(summary, plt) for name, plot in plots.items()}
    drawn.update(coalitions.draw(summary.get("coalitions", {}), plt))
    with locks.lock(out_dir):
        shown = out_dir / views.FILE
        page = pages.corpus_page(
            summary, files.read_json(shown)[views.KEY] if shown.exists() else None
        )
        written = [
            files.write_text(out_dir / "report.md", markdown(summary)),
            html.write(out_dir, page),
        ]
        return written + files.write_figures(out_dir, drawn)
