"""Report sections for the synergy analyses: optimal weights, diversity against gain,
pairwise synergy and pruning (their figures drawn by `reports.figures`). Each takes the
latest record of every run."""

from __future__ import annotations

import numpy as np

from beyondpar.reports import numbering, tables

OPTIMAL_COLUMNS = (
    ("fidelity_optimal", "fidelity"),
    ("fidelity_optimal_in_sample", "fidelity"),
    ("fidelity", "fidelity"),
    ("fidelity_uniform", "fidelity"),
    ("fidelity_per_head", "best fidelity"),
    ("hitting_time_optimal", "hitting"),
    ("hitting_time_optimal_in_sample", "hitting"),
    ("hitting_time", "hitting"),
    ("hitting_time_uniform", "hitting"),
    ("hitting_time_per_head", "best hitting"),
)


def _mean(record: dict, name: str) -> np.ndarray:
    return np.asarray(record["metrics"][name]["mean"], np.float64)


def _column(record: dict, name: str, kind: str) -> np.ndarray:
    """Per layer; for the best head, the one head with the best mean over sequences, the
    same standard the optimal weights (one weight vector for every sequence) meet."""
    values = _mean(record, name)
    if kind == "best fidelity":
        return values.max(-1)
    if kind == "best hitting":
        return values.min(-1)
    return values


def optimal_table(runs: list[dict], task: str) -> list[str]:
    """Per head count and layer: fidelity (%) and hitting time (steps) under the optimal,
    learned and uniform weights and of the best single head (mean over seeds)."""
    needed = ("fidelity_optimal_in_sample", "hitting_time_per_head")
    rows = [r for r in runs if r["task"] == task and all(k in r["metrics"] for k in needed)]
    if not rows:
        return []
    lines = [
        "| heads | layer | fidelity optimal, held out | in sample | learned | uniform "
        "| best head | hitting time optimal, held out | in sample | learned | uniform "
        "| best head |",
        "|---:|---:|" + "---:|" * len(OPTIMAL_COLUMNS),
    ]
    for heads in sorted({r["heads"] for r in rows if r["heads"] > 1}):
        group = [r for r in rows if r["heads"] == heads]
        values = {
            name: np.mean([_column(r, name, kind) for r in group], 0)
            for name, kind in OPTIMAL_COLUMNS
            if all(name in r["metrics"] for r in group)  # format 1: no held-out optimum
        }
        for layer in range(group[0]["layers"]):
            cells = [_cell(values, name, kind, layer) for name, kind in OPTIMAL_COLUMNS]
            lines.append(tables.row([heads, numbering.number(layer), *cells]))
    return lines


def _cell(values: dict, name: str, kind: str, layer: int) -> str:
    if name not in values:
        return "-"
    value = values[name][layer]
    return f"{100 * value:.2f}" if kind.endswith("fidelity") else f"{value:.2f}"


def diversity_points(runs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(diversity, gain) for every (run, layer) of every multi-head run."""
    div, gain = [], []
    for r in runs:
        if r["heads"] > 1 and "head_diversity" in r["metrics"]:
            div.extend(_mean(r, "head_diversity"))
            gain.extend(_mean(r, "gain"))
    return np.asarray(div), np.asarray(gain)


def diversity_summary(runs: list[dict]) -> list[str]:
    """Spearman's rank correlation of head diversity with the amplification gain."""
    div, gain = diversity_points(runs)
    if len(div) < 3:
        return []
    rho, p = _spearman(div, gain)
    return [
        f"Over {len(div)} (run, layer) points, Spearman's rank correlation of head diversity "
        f"with the amplification gain is rho = {rho:+.3f} (p = {p:.3g}). A positive, "
        "significant rho would mean that layers whose heads attend more differently gain "
        "more from mixing them (the paper's head-diversity condition).",
    ]


def _spearman(x, y) -> tuple[float, float]:
    from scipy import stats  # 0.8 s to import: not at every launcher's start

    return stats.spearmanr(x, y)


def pruning_table(runs: list[dict]) -> list[str]:
    """Area under the accuracy curve per run and order: which order keeps accuracy longest."""
    rows = [r for r in runs if "pruning" in r]
    if not rows:
        return []
    orders = list(rows[0]["pruning"])
    lines = ["| run | heads | " + " | ".join(orders) + " |", "|---|---:|" + "---:|" * len(orders)]
    for r in rows:
        aucs = [f"{r['pruning'][o]['auc']:.3f}" for o in orders]
        lines.append(f"| {r['run']} | {r['heads']} | " + " | ".join(aucs) + " |")
    return lines


def plot_diversity(runs: list[dict], plt):
    div, gain = diversity_points(runs)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.scatter(div, 100 * gain, s=14)
    ax.axhline(0, color="k", lw=0.8)
    if len(div) >= 3:
        rho, p = _spearman(div, gain)
        ax.set_title(f"Spearman rho = {rho:+.2f} (p = {p:.2g})")
    ax.set(xlabel="head diversity (mean TV distance of rows)", ylabel="gain over best head (pp)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def pairwise_by_layer(record: dict) -> dict:
    """{layer index: H x H} of each 50/50 pair's fidelity minus its better head (pp)."""
    mats = 100 * np.asarray(record["metrics"]["pairwise_synergy"]["mean"], np.float64)
    return dict(enumerate(mats))


def pruning_panels(record: dict) -> list:
    """Accuracy and layer-mean fidelity as heads are pruned, a line per order, for
    `reports.figures.pruning`."""
    accuracy, fidelity = {}, {}
    for name, curve in record["pruning"].items():
        pruned = curve["heads_pruned"]
        label = f"{name} (AUC {curve['auc']:.3f})"
        accuracy[label] = (pruned, 100 * np.asarray(curve["accuracy"]))
        fidelity[name] = (pruned, 100 * np.mean(curve["fidelity"], axis=1))
    return [
        ("accuracy, predictable positions (%)", accuracy),
        ("minimax fidelity of remaining heads,\nlayer mean (%)", fidelity),
    ]
