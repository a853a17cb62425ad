"""The language study's report: held-out loss and bits per byte against heads at equal
parameters, the attention graphs' measures against heads and against training step, and
the two answers the study asks for, in words from the numbers (`lm_stats`):

- does the held-out loss fall with more heads at equal parameters? (bits per byte,
  differences to 1 head paired by seed, 95% intervals)
- does the held-out optimal mix beat the best head more often as training goes on?
  (each multi-head run's share of windows won, last evaluation minus first)

Fractions become percent here; layers are averaged (the runs' TensorBoard logs keep
every layer, numbered from 1).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from beyondpar.base import files
from beyondpar.reports import html, tables
from beyondpar.study import lm_report_page, lm_stats
from beyondpar.study.lm_stats import BPB_KEY, GRAPHS, LOSS_KEY, LOSSES, OPTIMAL_WINS

PERCENT = set(GRAPHS)
LOSS_QUESTION = "Does the held-out loss fall with more heads at equal parameters?"
WINS_QUESTION = "Does the held-out optimal mix beat the best head more often as training goes on?"


def cell(stat: dict | None, percent: bool = False, digits: int | None = None) -> str:
    """`mean [low, high]`, in percent when `percent` (1 decimal unless `digits`, else 4);
    "-" for no value."""
    if stat is None or math.isnan(stat["mean"]):
        return "-"
    scale = 100.0 if percent else 1.0
    digits = digits if digits is not None else (1 if percent else 4)
    text = f"{scale * stat['mean']:.{digits}f}"
    if not math.isnan(stat["low"]):
        text += f" [{scale * stat['low']:.{digits}f}, {scale * stat['high']:.{digits}f}]"
    return text


def loss_answer(summary: dict) -> str:
    """The answer to `LOSS_QUESTION` from the paired bits-per-byte differences: a head
    count is below (above) 1 head when its whole 95% interval is below (above) zero."""
    paired = summary["paired"].get(BPB_KEY, {})
    if not paired:
        return f"{LOSS_QUESTION} Not measured: the study needs 1 head and another head count."
    lower = [h for h, s in paired.items() if s["high"] < 0]
    higher = [h for h, s in paired.items() if s["low"] > 0]
    unclear = [h for h in paired if h not in lower + higher]
    cells = summary["cells"][BPB_KEY]
    best = min(cells, key=lambda h: cells[h]["mean"])
    tail = f" The lowest mean is at 1 head: {cells[1]['mean']:.4f} bits/byte."
    if best != 1:
        tail = (
            f" The lowest mean is at {best} heads: {cells[best]['mean']:.4f} bits/byte against "
            f"{cells[1]['mean']:.4f} for 1 head."
        )
    if all(s["n"] < 2 for s in paired.values()):
        diffs = ", ".join(f"{s['mean']:+.4f} at H = {h}" for h, s in paired.items())
        return (
            f"{LOSS_QUESTION} Not tested: one seed per head count gives no interval; bits "
            f"per byte minus 1 head's: {diffs}.{tail}"
        )
    if lower and not higher and not unclear:
        verdict = "Yes: every head count above 1 has a lower held-out loss than 1 head"
    elif higher and not lower and not unclear:
        verdict = "No: every head count above 1 has a higher held-out loss than 1 head"
    elif not lower and not higher:
        verdict = "Not clearly: no head count differs from 1 head beyond its interval"
    else:
        parts = [("lower", lower), ("higher", higher), ("not clearly different", unclear)]
        listed = "; ".join(f"{word} at H = {_heads(hs)}" for word, hs in parts if hs)
        verdict = f"{'Partly' if lower else 'No'}: against 1 head the loss is {listed}"
    return f"{LOSS_QUESTION} {verdict} (bits per byte, paired by seed, 95% intervals).{tail}"


def wins_answer(change: dict) -> str:
    """The answer to `WINS_QUESTION` from the change of the optimal mix's wins between
    each multi-head run's first and last evaluation (its 95% interval against zero)."""
    if not change["runs"]:
        return f"{WINS_QUESTION} Not measured: no multi-head run evaluated more than once."
    c = change["change"]
    if c["n"] < 2:
        return (
            f"{WINS_QUESTION} Not tested: one multi-head run gives no interval; it beats the "
            f"best head on {100 * change['first']:.1f}% of windows at the first evaluation "
            f"and {100 * change['last']:.1f}% at the last."
        )
    numbers = (
        f"it beats the best head on {100 * change['first']:.1f}% of windows at the first "
        f"evaluation and {100 * change['last']:.1f}% at the last (change per run "
        f"{cell(c, percent=True)} percentage points over {change['runs']} runs)"
    )
    if not math.isnan(c["low"]) and c["low"] > 0:
        verdict = "Yes"
    elif not math.isnan(c["high"]) and c["high"] < 0:
        verdict = "No, less often"
    else:
        verdict = "Not clearly"
    return f"{WINS_QUESTION} {verdict}: {numbers}."


def _heads(heads) -> str:
    return ", ".join(str(h) for h in heads)


def parameter_lines(runs: list[dict]) -> list[str]:
    """The parameter table and whether the counts are matched."""
    sizes = lm_stats.parameters(runs)
    counts = {s["params"] for s in sizes.values()}
    out = ["| heads | head dimension | d_model | parameters |", "|---:|---:|---:|---:|"]
    out += [
        tables.row([h, s["head_dim"], s["embed_dim"], f"{s['params']:,}"]) for h, s in sizes.items()
    ]
    if len(counts) == 1:
        said = (
            f"Parameters are matched: every head count has {counts.pop():,} parameters; the "
            "head dimension is d_model / heads, so it shrinks as heads grow."
        )
    else:
        said = f"Parameters are NOT matched: {sorted(counts)} differ across head counts."
    return [said, "", *out]


def loss_lines(summary: dict) -> list[str]:
    """Loss and bits per byte per head count, and the paired differences to 1 head."""
    out = [
        "| heads | seeds | held-out loss (nats/token) | bits per byte | "
        "bits/byte - 1 head (paired) | loss - 1 head (paired) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    c, p = summary["cells"], summary["paired"]
    for h in summary["heads"]:
        out.append(
            tables.row(
                [
                    h,
                    c[LOSS_KEY][h]["n"],
                    cell(c[LOSS_KEY][h]),
                    cell(c[BPB_KEY][h]),
                    cell(p.get(BPB_KEY, {}).get(h)),
                    cell(p.get(LOSS_KEY, {}).get(h)),
                ]
            )
        )
    return out


def graph_lines(summary: dict) -> list[str]:
    """The graph measures per head count at the last evaluation (percent)."""
    names = [n for n in GRAPHS if n in summary["cells"]]
    out = [
        "| heads | " + " | ".join(f"{GRAPHS[n]} (%)" for n in names) + " |",
        "|---:|" + "---:|" * len(names),
    ]
    for h in summary["heads"]:
        cells = [
            cell(summary["cells"][n].get(h), True, 1 if n == OPTIMAL_WINS else 3) for n in names
        ]
        out.append(tables.row([h, *cells]))
    return out


def step_lines(runs: list[dict]) -> list[str]:
    """The optimal mix's wins (%) at each evaluation step, a column per head count."""
    wins = {h: s for h, s in lm_stats.over_steps(runs, OPTIMAL_WINS).items() if h > 1}
    if not wins:
        return ["No multi-head run measured the held-out optimal mix."]
    steps = sorted({s for by_step in wins.values() for s in by_step})
    out = ["| step | " + " | ".join(f"H={h}" for h in wins) + " |"]
    out.append("|---:|" + "---:|" * len(wins))
    for step in steps:
        out.append(tables.row([step, *(cell(wins[h].get(step), True) for h in wins)]))
    return out


def markdown(runs: list[dict], failures=()) -> str:
    """The whole report.md."""
    summary = lm_stats.summarize(runs)
    change = lm_stats.wins_change(runs)
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        "# Language study: heads at equal parameters",
        "",
        f"{len(runs)} runs: heads {_heads(summary['heads'])} x seeds {_heads(seeds)}, each "
        f"{runs[0]['tokens']:,} training tokens on {runs[0]['corpus']}. Cells: mean "
        "[95% Student-t interval] over seeds at each run's last evaluation; differences to "
        "1 head are paired by seed. Graph measures are means over layers and held-out windows "
        "(shares and fidelities: their intervals are cut at 0 and 100%).",
        "",
        f"- {loss_answer(summary)}",
        f"- {wins_answer(change)}",
        "",
        "## Parameters",
        "",
        *parameter_lines(runs),
        "",
        "## Held-out loss against heads",
        "",
        *loss_lines(summary),
        "",
        "## Attention graphs against heads (last evaluation)",
        "",
        *graph_lines(summary),
        "",
        "## Held-out optimal mix beats the best head (% of windows), against step",
        "",
        *step_lines(runs),
        "",
    ]
    lines += [f"FAILED {name}: {message}" for name, message in failures]
    return "\n".join(lines) + "\n"


def results(runs: list[dict]) -> dict:
    """results.json: the summary, the per-step cells and the wins change (heads as keys)."""
    summary = lm_stats.summarize(runs)
    steps = {m: lm_stats.over_steps(runs, m) for m in (BPB_KEY, OPTIMAL_WINS)}
    return {
        "parameters": lm_stats.parameters(runs),
        "cells": summary["cells"],
        "paired_to_1_head": summary["paired"],
        "over_steps": steps,
        "wins_change": lm_stats.wins_change(runs),
        "runs": [{k: r[k] for k in ("run", "heads", "seed", "params", "tokens")} for r in runs],
    }


def write_report(
    runs: list[dict], out_dir: str | os.PathLike, failures: list[tuple[str, str]] = ()
) -> list[Path]:
    """report.md, results.json, index.html and the plots; returns their paths."""
    out_dir = Path(out_dir)
    written = [
        files.write_text(out_dir / "report.md", markdown(runs, failures)),
        files.write_json(out_dir / "results.json", _json_safe(results(runs))),
        html.write(out_dir, lm_report_page.page(runs)),
    ]
    return written + files.write_figures(out_dir, figures(runs))


def _json_safe(obj):
    """Keys as strings, NaN as None (JSON has neither int keys nor NaN)."""
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


def figures(runs: list[dict]) -> dict:
    """{file name: a function drawing it}."""
    return {
        "loss_vs_heads.png": lambda: plot_loss_vs_heads(runs),
        "graphs_vs_heads.png": lambda: plot_graphs_vs_heads(runs),
        "graphs_vs_step.png": lambda: plot_vs_step(runs),
    }


def _errorbar(ax, heads, stats: list[dict], scale: float = 1.0, **kwargs) -> None:
    mean = np.array([scale * s["mean"] for s in stats])
    low = np.array([scale * s["low"] for s in stats])
    high = np.array([scale * s["high"] for s in stats])
    yerr = np.nan_to_num(np.stack([mean - low, high - mean]))
    ax.errorbar(heads, mean, yerr=yerr, marker="o", capsize=3, **kwargs)


def _heads_axis(ax, heads) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(heads, [str(h) for h in heads])
    ax.grid(alpha=0.3)


def plot_loss_vs_heads(runs: list[dict]):
    """Bits per byte against heads, and its paired difference to 1 head (95% bars)."""
    plt = files.pyplot()
    summary = lm_stats.summarize(runs)
    heads = summary["heads"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    _errorbar(axes[0], heads, [summary["cells"][BPB_KEY][h] for h in heads])
    axes[0].set(xlabel="heads", ylabel=LOSSES[BPB_KEY], title="held-out loss (bars: 95%)")
    paired = summary["paired"].get(BPB_KEY, {})
    if paired:
        _errorbar(axes[1], list(paired), list(paired.values()), color="C1")
    axes[1].axhline(0, color="k", lw=0.8)
    axes[1].set(xlabel="heads", ylabel="bits/byte - 1 head", title="paired by seed (bars: 95%)")
    for ax in axes:
        _heads_axis(ax, heads)
    fig.tight_layout()
    return fig


def plot_graphs_vs_heads(runs: list[dict]):
    """Fidelity of the best head and of each mix, and the optimal mix's wins, per head
    count at the last evaluation (95% bars)."""
    plt = files.pyplot()
    summary = lm_stats.summarize(runs)
    heads = summary["heads"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name in (n for n in GRAPHS if n != OPTIMAL_WINS and n in summary["cells"]):
        cells = summary["cells"][name]
        _errorbar(axes[0], list(cells), list(cells.values()), 100.0, label=GRAPHS[name])
    wins = {h: s for h, s in summary["cells"].get(OPTIMAL_WINS, {}).items() if h > 1}
    if wins:
        _errorbar(axes[1], list(wins), list(wins.values()), 100.0, color="C3")
    axes[0].set(xlabel="heads", ylabel="minimax fidelity, layer mean (%)", title="fidelity")
    axes[0].legend(fontsize=8)
    axes[1].set(xlabel="heads", ylabel="windows won (%)", title=GRAPHS[OPTIMAL_WINS])
    for ax in axes:
        _heads_axis(ax, heads)
    fig.tight_layout()
    return fig


def plot_vs_step(runs: list[dict]):
    """Bits per byte and the optimal mix's wins against step, a line per head count
    (mean over seeds), each head count in one colour in both panels."""
    plt = files.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    panels = [(BPB_KEY, 1.0, LOSSES[BPB_KEY]), (OPTIMAL_WINS, 100.0, "optimal mix wins (%)")]
    colours = {h: f"C{i}" for i, h in enumerate(lm_stats.by_heads(runs))}
    for ax, (metric, scale, label) in zip(axes, panels, strict=True):
        for h, by_step in lm_stats.over_steps(runs, metric).items():
            if metric == OPTIMAL_WINS and h == 1:
                continue
            means = [scale * s["mean"] for s in by_step.values()]
            ax.plot(list(by_step), means, marker="o", ms=3, color=colours[h], label=f"H={h}")
        ax.set(xlabel="step", ylabel=label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
