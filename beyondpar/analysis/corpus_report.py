"""A corpus summary -> report.md (means with 95% bootstrap intervals over windows, a
uniform causal baseline row, wins of each mix over its best head, pruning curves) and
plots. Layers are numbered from 0, as in the checkpoint's tensor names."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from beyondpar.base import files


def _ci(stat: dict, scale: float = 100, digits: int = 3) -> str:
    return (
        f"{scale * stat['mean']:.{digits}f} "
        f"[{scale * stat['low']:.{digits}f}, {scale * stat['high']:.{digits}f}]"
    )


def _at(stat: dict, i: int) -> dict:
    return {k: v[i] for k, v in stat.items()}


def markdown(summary: dict) -> str:
    spec = summary["spec"]
    k = spec.get("sink_tokens", 0)
    lines = [
        f"# Corpus analysis: {summary['source']}",
        "",
        f"Corpus {summary['corpus']}: {summary['num_documents']} documents; "
        f"{summary['num_windows']} windows of {summary['tokens_per_window']} tokens "
        f"(of {summary['total_windows']} in the corpus, taken in document order, "
        f"consecutive within a document) from {summary['documents_used']} documents. "
        f"Dropped: {summary['dropped_tail_tokens']} tail tokens shorter than a window, "
        f"{summary['short_documents']} documents shorter than one window.",
        "",
        "Values: mean over windows [95% percentile-bootstrap interval]. Fidelity in %, "
        f"hitting time in steps (horizon {spec['horizon']}, step cap {spec['max_steps']}). "
        "'wins': share of windows where the mix keeps more of its worst token than its "
        "best head. The baseline is uniform causal attention of the same length. Layers "
        "numbered from 0."
        + (
            f" Every metric is also given without the first {k} token(s), rows "
            "renormalised over the remaining keys."
            if k
            else ""
        ),
        "",
        "Rollout: network fidelity "
        f"{_ci(summary['rollout']['network_fidelity'], digits=4)}%, first token's share at "
        f"the last position {_ci(summary['rollout']['first_token_share'], digits=1)}%.",
        "",
        "## Layers",
        "",
        *_layer_table(summary, lambda d: d, summary["baseline"]["baseline"]),
    ]
    if k:
        lines += ["", f"## Layers without the first {k} token(s)", ""]
        lines += _layer_table(
            summary, lambda d: d["without_sink"], summary["baseline"]["baseline_without_sink"]
        )
    for layer, d in summary["layers"].items():
        lines += ["", f"### Layer {layer}", "", *_head_table(d, summary["baseline"]["baseline"])]
    if "pruning" in summary:
        lines += ["", *_pruning_table(summary["pruning"])]
    return "\n".join(lines) + "\n"


def _layer_table(summary: dict, pick, base: dict) -> list[str]:
    mixes = list(pick(next(iter(summary["layers"].values())))["mixes"])
    header = "| layer | best head | best head (%) | " + " | ".join(
        f"{m} (%) | gain {m} (pp) | wins {m}" for m in mixes
    )
    lines = [
        header + " | sink mass |",
        "|---:|---:|---:|" + "---:|---:|---:|" * len(mixes) + "---:|",
    ]
    for layer, full in summary["layers"].items():
        d = pick(full)
        cells = [
            f"{_ci(d['mixes'][m]['fidelity'])} | {_ci(d['mixes'][m]['gain'])} "
            f"| {100 * d['mixes'][m]['wins_share']:.0f}%"
            for m in mixes
        ]
        sink = np.mean(full["sink_mass"]["mean"])
        lines.append(
            f"| {layer} | {d['best_head']} | {_ci(d['best_head_fidelity'])} | "
            + " | ".join(cells)
            + f" | {sink:.3f} |"
        )
    lines.append(
        f"| baseline: uniform causal | - | - | {100 * base['fidelity']:.3f} | - | - |"
        + " - | - | - |" * (len(mixes) - 1)
        + " - |"
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
    layers = [int(k) for k in summary["layers"]]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    first = next(iter(summary["layers"].values()))
    series = {f"mix: {m}": lambda d, m=m: d["mixes"][m]["fidelity"] for m in first["mixes"]}
    series["best head"] = lambda d: d["best_head_fidelity"]
    for name, get in series.items():
        stats = [get(summary["layers"][str(k)]) for k in layers]
        mean = 100 * np.array([s["mean"] for s in stats])
        err = 100 * np.array([[s["mean"] - s["low"], s["high"] - s["mean"]] for s in stats]).T
        ax.errorbar(layers, mean, yerr=err, marker="o", capsize=3, label=name)
    base = 100 * summary["baseline"]["baseline"]["fidelity"]
    ax.axhline(base, color="gray", linestyle="--", label="uniform causal")
    ax.set(xlabel="layer", ylabel="minimax fidelity (%)", yscale="symlog")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


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
    """report.md and the PNG plots; returns their paths."""
    out_dir = Path(out_dir)
    written = [files.write_text(out_dir / "report.md", markdown(summary))]
    plots = {"fidelity_layers.png": plot_layers}
    if "pruning" in summary:
        plots["pruning.png"] = plot_pruning
    plt = files.pyplot()
    figures = {name: lambda plot=plot: plot(summary, plt) for name, plot in plots.items()}
    return written + files.write_figures(out_dir, figures)
