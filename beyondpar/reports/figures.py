"""The figures both workflows draw: pairwise synergy heatmaps, one per layer, and pruning
curves, a line per order. Each takes plain arrays and returns a matplotlib figure; layers
are titled and heads ticked by their report numbers (`numbering`: both from 1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from beyondpar.reports import numbering

COLUMNS = 4  # heatmaps per row
MAX_HEAD_LABELS = 10  # per axis of a 3-inch heatmap: more run into each other


def head_ticks(num_heads: int) -> range:
    """0-based indices of the heads to label: every head up to `MAX_HEAD_LABELS` heads,
    else every k-th from the first, so that the labels of 16 or 32 heads do not run into
    each other."""
    return range(0, num_heads, max(1, -(-num_heads // MAX_HEAD_LABELS)))


def label_heads(axis, num_heads: int) -> None:
    """Tick a matplotlib axis (`ax.xaxis`, `ax.yaxis`) whose positions are 0-based head
    indices with the heads' report numbers (`numbering.head_number`: from 1)."""
    ticks = head_ticks(num_heads)
    axis.set_ticks(list(ticks), [str(numbering.head_number(h)) for h in ticks])


def pairwise(mats_pp: Mapping, plt, title: str | None = None):
    """{0-based layer index: H x H matrix} of each 50/50 pair's fidelity minus its better
    head's (percentage points), on one colour scale symmetric about zero; heads numbered
    from 1."""
    layers = list(mats_pp)
    mats = [np.asarray(mats_pp[k], np.float64) for k in layers]
    cols = min(COLUMNS, len(layers))
    rows = -(-len(layers) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    bound = max(max(float(np.abs(m).max()) for m in mats), 1e-9)
    for i, (ax, layer, mat) in enumerate(zip(axes.flat, layers, mats, strict=False)):
        image = ax.imshow(mat, cmap="RdBu", vmin=-bound, vmax=bound)
        label_heads(ax.xaxis, len(mat))
        label_heads(ax.yaxis, len(mat))
        ylabel = "head" if i % cols == 0 else ""
        ax.set(title=f"layer {numbering.number(layer)}", xlabel="head", ylabel=ylabel)
    for ax in list(axes.flat)[len(layers) :]:
        ax.axis("off")
    fig.colorbar(image, ax=axes.ravel().tolist(), label="pair - better head (pp)", shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig


def pruning(panels: Sequence[tuple[str, Mapping]], plt, title: str):
    """One panel per (y label, {line label: (heads pruned, values)}), a line per pruning
    order; the legend on the first panel."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (ylabel, lines) in zip(axes[0], panels, strict=True):
        for name, (pruned, values) in lines.items():
            ax.plot(pruned, values, marker="o", ms=3, label=name)
        ax.set(xlabel="heads pruned", ylabel=ylabel)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def interaction(mats: Mapping, plt, label: str, title: str | None = None):
    """{0-based layer index: H x H matrix} of each pair's Shapley interaction (in the
    report's unit, `label` on the colour bar), on one colour scale symmetric about zero;
    heads numbered from 1. NaN entries (the diagonal, say) are left blank."""
    layers = list(mats)
    grid = [np.asarray(mats[k], np.float64) for k in layers]
    cols = min(COLUMNS, len(layers))
    rows = -(-len(layers) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    bound = max(max(float(np.nanmax(np.abs(m), initial=0.0)) for m in grid), 1e-9)
    for i, (ax, layer, mat) in enumerate(zip(axes.flat, layers, grid, strict=False)):
        image = ax.imshow(mat, cmap="RdBu", vmin=-bound, vmax=bound)
        label_heads(ax.xaxis, len(mat))
        label_heads(ax.yaxis, len(mat))
        ylabel = "head" if i % cols == 0 else ""
        ax.set(title=f"layer {numbering.number(layer)}", xlabel="head", ylabel=ylabel)
    for ax in list(axes.flat)[len(layers) :]:
        ax.axis("off")
    fig.colorbar(image, ax=axes.ravel().tolist(), label=label, shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig
