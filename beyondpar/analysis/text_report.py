"""An analysis record -> report.md, analysis.json and plots. Layers are numbered from 0,
as in the checkpoint's tensor names and the `--layers` flag."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from beyondpar.base import files, locks


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


def markdown(record: dict) -> str:
    spec = record["spec"]
    k = spec.get("sink_tokens", 0)
    sink_note = (
        f"Every metric is also computed without the first {k} token(s) (attention sinks), "
        "each row renormalised over the remaining keys: the tables marked 'without sink'."
        if k
        else "Sink mass: mean attention on the first token."
    )
    lines = [
        f"# Attention analysis: {record['source']}",
        "",
        f"{record['num_sequences']} sequence(s) of {record['seq_len']} tokens; "
        f"{record['num_layers']} layers x {record['num_heads']} query heads. Horizon "
        f"{spec['horizon']}, step cap {spec['max_steps']}, eps {spec['eps']}, rollout "
        f"residual {spec['residual']}. Fidelity in %; hitting time in steps on both walks; "
        "TV and spectral mixing on the normalised walk (the reference walk saturates on "
        "causal attention). Layers numbered from 0. Values: mean over sequences. "
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
            record, "layers", lambda d: d["without_sink"], record.get("baseline_without_sink")
        )
    for layer, d in record["layers"].items():
        lines += ["", f"### Layer {layer}", ""]
        lines += _head_table(d)
        if k:
            lines += ["", f"Layer {layer} without sink:", "", *_head_table(d["without_sink"])]
        if "optimal" in d:
            lines += ["", optimal_line(d)]
            if k:
                lines += ["", "Without sink: " + optimal_line(d["without_sink"])]
    if any("pairwise_synergy" in d for d in record["layers"].values()):
        lines += ["", "![pairwise synergy](pairwise_synergy.png)"]
    lines += ["", "![per-head fidelity](fidelity_heads.png)"]
    timings = record.get("timings_s", {})
    if timings:
        lines += ["", "## Time (s)", "", "| part | seconds |", "|---|---:|"]
        lines += [f"| {name} | {sec:.2f} |" for name, sec in timings.items()]
    return "\n".join(lines) + "\n"


def optimal_line(d: dict) -> str:
    """The optimum of a layer: held out (each sequence measured with weights searched on
    the other folds) beside its in-sample value, or in sample only and said so."""
    o = d["optimal"]
    measured = 100 * _m(d["mixes"]["optimal"]["fidelity"])
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
    lines = [
        "| layer | best head | best head (%) | learned mix (%) | uniform mix (%) "
        "| gain learned (pp) | uniform median (%) | uniform p10 (%) | sink mass | diversity "
        "| cross-head share |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for layer, full in record[key].items():
        d = pick(full)
        mixes = d["mixes"]
        learned = mixes.get("learned", mixes["uniform"])
        uniform = mixes["uniform"]
        lines.append(
            f"| {layer} | {int(np.bincount(np.asarray(d['best_head'])).argmax())} "
            f"| {100 * _m(d['best_head_fidelity']):.3f} | {100 * _m(learned['fidelity']):.3f} "
            f"| {100 * _m(uniform['fidelity']):.3f} | {100 * _m(learned['gain']):+.3f} "
            f"| {100 * _m(uniform['fidelity_median']):.3f} "
            f"| {100 * _m(uniform['fidelity_p10']):.3f} | {_m(full['sink_mass']):.3f} "
            f"| {_m(d['head_diversity']):.3f} | {_m(d['cross_head_share_mean']):.3f} |"
        )
    if base is not None:
        lines.append(
            f"| baseline: uniform causal | - | - | - | {100 * base['fidelity']:.3f} | - "
            f"| {100 * base['fidelity_median']:.3f} | {100 * base['fidelity_p10']:.3f} "
            "| - | - | - |"
        )
    return lines


def _head_table(d: dict) -> list[str]:
    lines = [
        "| operator | fidelity (%) | median (%) | p10 (%) | hitting ref | hitting norm "
        "| TV mixing | spectral mixing | sink mass |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def row(name, f, sink="-"):
        return (
            f"| {name} | {100 * _m(f['fidelity']):.3f} | {100 * _m(f['fidelity_median']):.3f} "
            f"| {100 * _m(f['fidelity_p10']):.3f} | {_m(f['hitting_time_reference']):.2f} "
            f"| {_m(f['hitting_time_normalized']):.2f} | {_m(f['tv_mixing_time_normalized']):.1f} "
            f"| {_m(f['spectral_mixing_time_normalized']):.2f} | {sink} |"
        )

    for name, f in d["mixes"].items():
        lines.append(row(f"mix: {name}", f))
    heads = d["heads"]
    sink = d.get("sink_mass")
    for h in range(np.asarray(heads["fidelity"]).shape[-1]):
        mass = "-" if sink is None else f"{_m(np.asarray(sink)[:, h]):.3f}"
        lines.append(row(f"head {h}", {k: np.asarray(v)[:, h] for k, v in heads.items()}, mass))
    return lines


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
    grid = np.stack([100 * np.mean(record["layers"][k]["heads"]["fidelity"], 0) for k in layers])
    fig, ax = plt.subplots(figsize=(0.5 * grid.shape[1] + 3, 0.4 * len(layers) + 2))
    image = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(layers)), [str(k) for k in layers])
    ax.set(xlabel="head", ylabel="layer", title="minimax fidelity per head (%)")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    return fig


def plot_pairwise(record: dict, plt):
    layers = [k for k, d in record["layers"].items() if "pairwise_synergy" in d]
    cols = min(4, len(layers))
    rows = -(-len(layers) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    mats = [100 * np.mean(record["layers"][k]["pairwise_synergy"], 0) for k in layers]
    bound = max(max(float(np.abs(m).max()) for m in mats), 1e-9)
    for ax, layer, mat in zip(axes.flat, layers, mats, strict=False):
        image = ax.imshow(mat, cmap="RdBu", vmin=-bound, vmax=bound)
        ax.set(title=f"layer {layer}", xlabel="head")
    for ax in list(axes.flat)[len(layers) :]:
        ax.axis("off")
    fig.colorbar(image, ax=axes.ravel().tolist(), label="pair - better head (pp)", shrink=0.8)
    return fig


def write(record: dict, out_dir: str | os.PathLike) -> list[Path]:
    """report.md, analysis.json and the PNG plots; returns their paths. The folder is
    locked while they are written: another process writing there is FolderBusy. A plot
    this record has no data for (pairwise synergy, when not asked for) is removed if an
    earlier analysis left one, so the folder holds one analysis only."""
    out_dir = Path(out_dir)
    plots = {"sink_share.png": plot_sink_share, "fidelity_heads.png": plot_head_fidelity}
    pairwise = any("pairwise_synergy" in d for d in record["layers"].values())
    if pairwise:
        plots["pairwise_synergy.png"] = plot_pairwise
    plt = files.pyplot()
    figures = {name: lambda plot=plot: plot(record, plt) for name, plot in plots.items()}
    with locks.lock(out_dir):
        written = [
            files.write_text(out_dir / "report.md", markdown(record)),
            files.write_json(out_dir / "analysis.json", to_json(record)),
        ]
        if not pairwise:
            (out_dir / "pairwise_synergy.png").unlink(missing_ok=True)
        return written + files.write_figures(out_dir, figures)
