"""A corpus summary -> report.md (means with 95% bootstrap intervals over windows, a
uniform causal baseline row, wins of each mix over its best head, pruning curves) and
plots. Layers are numbered from 0, as in the checkpoint's tensor names."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from beyondpar.base import files, locks


def _ci(stat: dict, scale: float = 100, digits: int = 3) -> str:
    return (
        f"{scale * stat['mean']:.{digits}f} "
        f"[{scale * stat['low']:.{digits}f}, {scale * stat['high']:.{digits}f}]"
    )


def _at(stat: dict, i: int) -> dict:
    return {k: v[i] for k, v in stat.items()}


MIX_LABELS = {"optimal": "optimal, held out"}
MIX_ORDER = ("learned", "uniform", "optimal")  # a summary read back from JSON is sorted


def ordered_mixes(mixes) -> list[str]:
    return sorted(mixes, key=lambda m: (MIX_ORDER.index(m) if m in MIX_ORDER else 99, m))


def markdown(summary: dict) -> str:
    spec = summary["spec"]
    k = spec.get("sink_tokens", 0)
    lines = [f"# Corpus analysis: {summary['source']}", "", _corpus_line(summary), ""]
    lines += [_values_line(spec, k), ""]
    if "optimal" in summary:
        lines += [_optimal_line(summary["optimal"], k), ""]
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
    for layer, d in summary["layers"].items():
        lines += ["", f"### Layer {layer}", "", *_head_table(d, summary["baseline"]["baseline"])]
    if "pruning" in summary:
        lines += ["", *_pruning_table(summary["pruning"])]
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
        "best head. The baseline is uniform causal attention of the same length. Layers "
        "numbered from 0."
    )
    if k:
        line += (
            f" Every metric is also given without the first {k} token(s), rows "
            "renormalised over the remaining keys."
        )
    return line


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
    pick = (lambda d: d["without_sink"]) if suffix else (lambda d: d)
    mixes = ordered_mixes(pick(next(iter(summary["layers"].values())))["mixes"])
    in_sample = summary.get("optimal", {}).get(f"in_sample{suffix}")
    label = lambda m: MIX_LABELS.get(m, m)
    header = "| layer | best head | best head (%) | " + " | ".join(
        f"{label(m)} (%) | gain {label(m)} (pp) | wins {label(m)}" for m in mixes
    )
    extra = " optimal in sample (%) |" if in_sample is not None else ""
    lines = [
        header + " |" + extra + " sink mass |",
        "|---:|---:|---:|" + "---:|---:|---:|" * len(mixes) + "---:|" * (1 + bool(extra)),
    ]
    for layer, full in summary["layers"].items():
        d = pick(full)
        cells = [
            f"{_ci(d['mixes'][m]['fidelity'])} | {_ci(d['mixes'][m]['gain'])} "
            f"| {100 * d['mixes'][m]['wins_share']:.0f}%"
            for m in mixes
        ]
        if in_sample is not None:
            cells.append(f"{100 * in_sample[layer]:.3f}")
        sink = np.mean(full["sink_mass"]["mean"])
        lines.append(
            f"| {layer} | {d['best_head']} | {_ci(d['best_head_fidelity'])} | "
            + " | ".join(cells)
            + f" | {sink:.3f} |"
        )
    lines.append(
        f"| baseline: uniform causal | - | - | {100 * base['fidelity']:.3f} | - | - |"
        + " - | - | - |" * (len(mixes) - 1)
        + " - |" * (1 + bool(extra))
    )
    return lines


def _head_table(d: dict, base: dict) -> list[str]:
    lines = [
        "| operator | fidelity (%) | median (%) | p10 (%) | hitting norm (steps) | sink mass |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def row(name, stat, sink="-"):
        return (
            f"| {name} | {_ci(stat['fidelity'])} | {_ci(stat['fidelity_median'])} "
            f"| {_ci(stat['fidelity_p10'])} | {_ci(stat['hitting_time_normalized'], 1, 2)} "
            f"| {sink} |"
        )

    for name, stat in d["mixes"].items():
        lines.append(row(f"mix: {name}", stat))
    heads = d["heads"]
    for h in range(len(heads["fidelity"]["mean"])):
        stat = {f: _at(v, h) for f, v in heads.items()}
        lines.append(row(f"head {h}", stat, f"{d['sink_mass']['mean'][h]:.3f}"))
    lines.append(
        f"| baseline: uniform causal | {100 * base['fidelity']:.3f} "
        f"| {100 * base['fidelity_median']:.3f} | {100 * base['fidelity_p10']:.3f} "
        f"| {base['hitting_time_normalized']:.2f} | - |"
    )
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
    pick = (lambda d: d["without_sink"]) if suffix else (lambda d: d)
    first = pick(next(iter(summary["layers"].values())))
    series = {
        MIX_LABELS.get(m, m): (lambda d, m=m: d["mixes"][m]["fidelity"])
        for m in ordered_mixes(first["mixes"])
    }
    series["best head"] = lambda d: d["best_head_fidelity"]
    stats = {
        name: [get(pick(summary["layers"][str(k)])) for k in layers] for name, get in series.items()
    }
    positive = [
        100 * v for st in stats.values() for s in st for v in (s["low"], s["mean"]) if v > 0
    ]
    floor = min(positive) / 2 if positive else 1e-6
    width = 0.8 / len(stats)
    for i, (name, st) in enumerate(stats.items()):
        x = np.asarray(layers) + (i - (len(stats) - 1) / 2) * width
        mean = np.maximum(100 * np.array([s["mean"] for s in st]), floor)
        low = np.maximum(100 * np.array([s["low"] for s in st]), floor)
        high = np.maximum(100 * np.array([s["high"] for s in st]), floor)
        ax.errorbar(x, mean, yerr=[mean - low, high - mean], fmt="o", ms=3, capsize=2, label=name)
    base = summary["baseline"][f"baseline{suffix}"]["fidelity"]
    ax.axhline(100 * base, color="gray", linestyle="--", label="uniform causal attention")
    ax.set_yscale("log")
    # Ticks at 1, 2 and 5 of every decade, written as plain numbers (0.02, not 2 x 10^-2).
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(layers)
    ax.set(
        xlabel="layer",
        ylabel="minimax fidelity (%, log)",
        title=f"minimax fidelity per layer, {title}",
    )
    ax.grid(alpha=0.3, which="major")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)


def plot_pruning(summary: dict, plt):
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, c in summary["pruning"].items():
        if name != "windows":
            ax.plot(c["heads_pruned"], c["loss"], marker="o", label=name)
    ax.set(xlabel="heads pruned", ylabel="next-token loss", title="pruning heads on the corpus")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write(summary: dict, out_dir: str | os.PathLike) -> list[Path]:
    """report.md and the PNG plots; returns their paths. The folder is locked while they
    are written: another process writing there is FolderBusy."""
    out_dir = Path(out_dir)
    plots = {"fidelity_layers.png": plot_layers}
    if "pruning" in summary:
        plots["pruning.png"] = plot_pruning
    plt = files.pyplot()
    figures = {name: lambda plot=plot: plot(summary, plt) for name, plot in plots.items()}
    with locks.lock(out_dir):
        written = [files.write_text(out_dir / "report.md", markdown(summary))]
        return written + files.write_figures(out_dir, figures)
