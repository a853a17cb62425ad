"""Evaluation records -> the paper's tables (Markdown, CSV, JSON) and plots (PNG).

Fractions become percent here and only here. Cells aggregate the latest step of every
run with the same task and head count: mean over seeds of the per-run means, ± the
standard deviation over seeds (over sequences when a cell holds one seed).
"""

from __future__ import annotations

import csv
import io
import os
from collections import defaultdict
from pathlib import Path

import matplotlib.ticker
import numpy as np

from beyondpar.base import files
from beyondpar.reports import coalitions, html, numbering, tables
from beyondpar.reports import figures as report_figures
from beyondpar.study import report_page, synergy_report

# Per-layer metrics of a record and their units; records written before a metric existed
# (or with an analysis switched off) simply lack it.
UNITS = {
    "hitting_time": "steps",
    "hitting_time_uniform": "steps",
    "hitting_time_best_head": "steps",
    "hitting_time_optimal": "steps",
    "hitting_time_optimal_in_sample": "steps",
    "tv_mixing_time": "steps",
    "spectral_mixing_time": "steps",
    "tv_mixing_time_normalized": "steps",
    "spectral_mixing_time_normalized": "steps",
    "fidelity": "fraction",
    "fidelity_uniform": "fraction",
    "fidelity_optimal": "fraction",
    "fidelity_optimal_in_sample": "fraction",
    "best_individual": "fraction",
    "gain": "fraction",
    "combined_wins": "fraction",
    "head_diversity": "tv",
    "cross_head_share_minimax": "fraction",
    "cross_head_share_mean": "fraction",
}
LAYER_METRICS = tuple(UNITS)
PERCENT = {"fidelity", "fidelity_uniform", "best_individual", "gain", "combined_wins"}


def latest(records: list[dict]) -> list[dict]:
    """The record of each run's latest evaluated step."""
    best: dict[str, dict] = {}
    step = lambda r: -1 if r["step"] is None else r["step"]  # released weights: no step
    for r in records:
        if r["run"] not in best or step(r) > step(best[r["run"]]):
            best[r["run"]] = r
    order = lambda r: (r["task"], r["heads"], -1 if r["seed"] is None else r["seed"], r["run"])
    return sorted(best.values(), key=order)


def aggregate(records: list[dict]) -> dict:
    """{(task, heads): {metric: (mean (L,), std (L,), seeds)}} over the latest records."""
    groups = defaultdict(list)
    for r in latest(records):
        groups[(r["task"], r["heads"])].append(r)
    out = {}
    for key, group in groups.items():
        cell = {}
        for name in (*LAYER_METRICS, "accuracy", "accuracy_predictable"):
            if not all(name in r["metrics"] for r in group):
                continue
            means = np.array([r["metrics"][name]["mean"] for r in group], np.float64)
            if len(group) > 1:
                std = means.std(0, ddof=1)
            else:
                std = np.asarray(group[0]["metrics"][name]["std"], np.float64)
            cell[name] = (means.mean(0), std, len(group))
        out[key] = cell
    return out


def _fmt(mean, std, percent: bool) -> str:
    scale = 100.0 if percent else 1.0
    return f"{scale * mean:.2f} ± {scale * std:.2f}"


def _layer_table(cells: dict, heads: list[int], name: str) -> list[str]:
    mean, std = ([cells[h][name][i] for h in heads] for i in (0, 1))
    rows = (
        (layer, [_fmt(m[layer], s[layer], name in PERCENT) for m, s in zip(mean, std, strict=True)])
        for layer in range(len(mean[0]))
    )
    return tables.layer_table([f"H={h}" for h in heads], rows)


def _amplification_table(cells: dict, heads: list[int]) -> list[str]:
    lines = [
        "| heads | layer | best individual (%) | combined (%) | gain (pp) | combined wins |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    if not any(h > 1 for h in heads):
        return ["Single-head models only: nothing to mix."]
    wins = total = 0
    for h in (h for h in heads if h > 1):
        c = cells[h]
        for layer in range(len(c["fidelity"][0])):
            best, comb = 100 * c["best_individual"][0][layer], 100 * c["fidelity"][0][layer]
            gain, won = 100 * c["gain"][0][layer], 100 * c["combined_wins"][0][layer]
            wins += c["gain"][0][layer] > 0
            total += 1
            values = [f"{best:.2f}", f"{comb:.2f}", f"{gain:+.2f}", f"{won:.0f}%"]
            lines.append(tables.row([h, numbering.number(layer), *values]))
    if total:
        lines.append("")
        lines.append(
            f"Combined beats the best single head in {wins} of {total} (heads, layer) cells."
        )
    return lines


def markdown(records: list[dict]) -> str:
    """report.md: per task the paper's tables, then amplification and accuracy."""
    if not records:
        raise ValueError("records must not be empty, got none")
    runs = latest(records)
    cells = aggregate(records)
    lines = ["# beyondpar report", "", *_measured(runs)]
    needs = necessity_by_task(runs)
    if needs:
        lines += ["", *necessity_table(needs)]
    for task in sorted({t for t, _ in cells}):
        heads = sorted(h for t, h in cells if t == task)
        by_heads = {h: cells[(task, h)] for h in heads}
        lines += _task_section(task, heads, by_heads, needs.get(task), runs)
    lines += _synergy_sections(runs)
    lines += _coalition_sections(runs)
    lines += ["", *_accuracy_table(runs)]
    return "\n".join(lines) + "\n"


def _task_section(task: str, heads: list[int], by_heads: dict, needs, runs) -> list[str]:
    lines = ["", f"## Task: {task}", ""]
    if needs is not None and not needs["needs_attention"]:
        lines += [
            f"**{task} does not need attention**: the models keep "
            f"{100 * needs['accuracy_without_heads']:.1f}% accuracy with every head "
            "masked, so the tables below measure attention the model does not use.",
            "",
        ]
    lines += ["### Hitting time (steps)", ""]
    lines += _layer_table(by_heads, heads, "hitting_time")
    lines += ["", "### Minimax fidelity, learned head weights (%)", ""]
    lines += _layer_table(by_heads, heads, "fidelity")
    if all("tv_mixing_time_normalized" in c for c in by_heads.values()):
        lines += ["", "### TV mixing time, normalised walk (steps)", ""]
        lines += _layer_table(by_heads, heads, "tv_mixing_time_normalized")
    lines += ["", "### Amplification: best single head vs heads combined", ""]
    lines += _amplification_table(by_heads, heads)
    optimal = synergy_report.optimal_table(runs, task)
    if optimal:
        lines += ["", "### Optimal vs learned vs uniform vs best head", ""]
        lines += [
            "Fidelity in %, hitting time in steps; mean over seeds. Optimal, held out: "
            "each sequence scored with the weights searched on the other folds of the "
            "sequences (contiguous folds, `evaluation.folds`); in sample: one weight vector "
            "per layer, "
            "searched on the sequences it is scored on (an upper estimate); best head: the "
            "one head with the best mean over sequences.",
            "",
            *optimal,
        ]
    return lines


def _synergy_sections(runs: list[dict]) -> list[str]:
    lines = []
    diversity = synergy_report.diversity_summary(runs)
    if diversity:
        lines += ["", "## Head diversity and amplification", "", *diversity]
        lines += ["", "![diversity against gain](diversity.png)"]
    pruned = synergy_report.pruning_table(runs)
    if pruned:
        lines += ["", "## Pruning: area under the accuracy curve", ""]
        lines += [
            "Accuracy on predictable positions, heads pruned from all to one per layer;",
            "higher keeps accuracy longer.",
            "",
            *pruned,
        ]
    return lines


def _coalition_sections(runs: list[dict]) -> list[str]:
    """Per run evaluated with `evaluation.coalitions`: its heads' games, per layer, with
    95% normal intervals over the evaluation sequences."""
    lines = []
    for r in runs:
        if "coalitions" in r:
            games, stem = r["coalitions"], f"coalitions_{_safe(r['run'])}"
            heading = f"Coalitions of heads: {r['run']}"
            lines += ["", *coalitions.section(games, coalitions.figure_files(games, stem), heading)]
    return lines


def _safe(run: str) -> str:
    """A run's name as part of a file name."""
    return run.replace("/", "_")


def _accuracy_table(runs: list[dict]) -> list[str]:
    lines = ["## Accuracy", "", "| run | step | task | heads | seed | all (%) | predictable (%) |"]
    lines.append("|---|---:|---|---:|---:|---:|---:|")
    for r in runs:
        acc = 100 * r["metrics"]["accuracy"]["mean"]
        pred = 100 * r["metrics"]["accuracy_predictable"]["mean"]
        step, seed = ("-" if r[k] is None else r[k] for k in ("step", "seed"))
        lines.append(
            f"| {r['run']} | {step} | {r['task']} | {r['heads']} | {seed} "
            f"| {acc:.2f} | {pred:.2f} |"
        )
    return lines


def necessity_by_task(runs: list[dict]) -> dict:
    """Per task, over its runs: mean accuracy with heads, without, chance, and whether
    the task needs attention (the majority of its runs say so)."""
    out = {}
    for task in sorted({r["task"] for r in runs if "attention_necessity" in r}):
        found = [
            r["attention_necessity"]
            for r in runs
            if r["task"] == task and "attention_necessity" in r
        ]
        out[task] = {
            "accuracy": float(np.mean([n["accuracy"] for n in found])),
            "accuracy_without_heads": float(np.mean([n["accuracy_without_heads"] for n in found])),
            "chance": float(np.mean([n["chance"] for n in found])),
            "needs_attention": 2 * sum(n["needs_attention"] for n in found) > len(found),
            "runs": len(found),
        }
    return out


def necessity_table(needs: dict) -> list[str]:
    lines = [
        "## Does the task need attention?",
        "",
        "Accuracy on predictable positions (%), mean over runs, with every head and with",
        "every head masked (a true ablation through the head mask), against chance.",
        "",
        "| task | runs | with heads | without heads | chance | needs attention |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for task, n in needs.items():
        lines.append(
            f"| {task} | {n['runs']} | {100 * n['accuracy']:.1f} "
            f"| {100 * n['accuracy_without_heads']:.1f} | {100 * n['chance']:.2f} "
            f"| {'yes' if n['needs_attention'] else 'no'} |"
        )
    return lines


def _failed(failures) -> str:
    if not failures:
        return ""
    lines = ["", "## Failed", "", "Not in the tables above:", ""]
    lines += [f"- {name}: {message}" for name, message in failures]
    return "\n".join(lines) + "\n"


def _measured(runs: list[dict]) -> list[str]:
    """What the numbers are: sequences, length, seed, horizon, step cap, walk."""

    def values(key, default="?"):
        found = sorted({str(r.get("evaluation", {}).get(key, r.get(key, default))) for r in runs})
        return ", ".join(found)

    return [
        f"{len(runs)} runs, each at its latest step. Per record: {values('num_sequences')} "
        f"held-out sequences of length {values('seq_len')} (seed {values('seed')}); "
        f"fidelity horizon {values('horizon')}, step cap {values('max_steps')}, "
        f"walk {values('walk')}.",
        "Cells: mean ± std over seeds (over sequences when a cell has one seed). "
        "Layers are numbered from 1 here, in results.csv and in results.json.",
    ]


def column(name: str) -> str:
    """CSV/JSON column of a metric, with its unit: `fidelity_fraction`, `hitting_time_steps`."""
    return f"{name}_{UNITS.get(name, 'fraction')}"


def rows(records: list[dict]) -> list[dict]:
    """One flat row per (run, step, layer) with every per-layer metric's mean and std;
    metrics a record lacks are left empty."""
    out = []
    for r in sorted(records, key=lambda r: (r["run"], -1 if r["step"] is None else r["step"])):
        for layer in range(r["layers"]):
            row = {k: r[k] for k in ("run", "step", "task", "heads", "seed", "walk")}
            row["layer"] = numbering.number(layer)
            for name in LAYER_METRICS:
                stat = r["metrics"].get(name)
                row[f"{column(name)}_mean"] = None if stat is None else stat["mean"][layer]
                row[f"{column(name)}_std"] = None if stat is None else stat["std"][layer]
            for order, curve in r.get("pruning", {}).items():
                row[f"pruning_auc_{order}_fraction"] = curve["auc"]
            necessity = r.get("attention_necessity")
            if necessity is not None:
                row["accuracy_without_heads_fraction"] = necessity["accuracy_without_heads"]
                row["needs_attention"] = necessity["needs_attention"]
            row["accuracy_fraction"] = r["metrics"]["accuracy"]["mean"]
            row["accuracy_predictable_fraction"] = r["metrics"]["accuracy_predictable"]["mean"]
            out.append(row)
    return out


def csv_text(table: list[dict]) -> str:
    buf = io.StringIO()
    names = list(dict.fromkeys(k for row in table for k in row))  # rows may differ in columns
    writer = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    return buf.getvalue()


# ---------------------------------------------------------------- plots


def plot_vs_heads(records: list[dict]):
    """Fidelity and hitting time against head count, a line per layer, a column per task."""
    plt = files.pyplot()
    cells = aggregate(records)
    task_names = sorted({t for t, _ in cells})
    walk = ", ".join(sorted({r["walk"] for r in records}))
    fig, axes = plt.subplots(2, len(task_names), figsize=(5 * len(task_names), 7), squeeze=False)
    for col, task in enumerate(task_names):
        heads = sorted(h for t, h in cells if t == task)
        for row, (name, label) in enumerate(
            [
                ("fidelity", "minimax fidelity (%)"),
                ("hitting_time", f"hitting time, {walk} walk (steps)"),
            ]
        ):
            ax = axes[row, col]
            scale = 100 if name in PERCENT else 1
            layers = len(cells[(task, heads[0])][name][0])
            ends = []
            for layer in range(layers):
                mean = np.array([scale * cells[(task, h)][name][0][layer] for h in heads])
                std = np.array([scale * cells[(task, h)][name][1][layer] for h in heads])
                ax.errorbar(
                    heads,
                    mean,
                    yerr=std,
                    marker="o",
                    capsize=3,
                    label=f"layer {numbering.number(layer)}",
                )
                ends += [*(mean - std), *(mean + std)]
            ax.set_xscale("log", base=2)
            ax.set_xticks(heads, [str(h) for h in heads])
            _log_if_spread(ax, min(ends), max(ends))
            ax.set(xlabel="heads", ylabel=label, title=f"{task} (bars: ± 1 std)")
            ax.grid(alpha=0.3)
    axes[0, 0].legend()
    fig.tight_layout()
    return fig


def _log_if_spread(ax, low: float, high: float) -> None:
    """Values over more than a decade (a hitting time at the step cap next to a few steps,
    a layer whose fidelity is a hundredth of the others') flatten a linear axis: log
    scale, ticks as plain numbers."""
    if low > 0 and high / low > 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))


def plot_amplification(records: list[dict]):
    """Gain of the mixed operator over its best head (percentage points) per head count."""
    plt = files.pyplot()
    cells = aggregate(records)
    task_names = sorted({t for t, _ in cells})
    fig, axes = plt.subplots(1, len(task_names), figsize=(5 * len(task_names), 3.8), squeeze=False)
    for col, task in enumerate(task_names):
        heads = sorted(h for t, h in cells if t == task and h > 1)
        ax = axes[0, col]
        if heads:
            layers = len(cells[(task, heads[0])]["gain"][0])
            width = 0.8 / layers
            for layer in range(layers):
                gains = [100 * cells[(task, h)]["gain"][0][layer] for h in heads]
                x = np.arange(len(heads)) + (layer - (layers - 1) / 2) * width
                ax.bar(x, gains, width, label=f"layer {numbering.number(layer)}")
            ax.set_xticks(np.arange(len(heads)), [str(h) for h in heads])
        ax.axhline(0, color="k", lw=0.8)
        ax.set(xlabel="heads", ylabel="combined - best head (pp)", title=f"amplification: {task}")
        ax.grid(alpha=0.3, axis="y")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_vs_step(records: list[dict]):
    """Layer-mean fidelity and hitting time against training step: a column per task, a
    line per run, runs ordered by head count."""
    plt = files.pyplot()
    by_run = defaultdict(list)
    for r in records:
        by_run[r["run"]].append(r)
    task_names = sorted({r["task"] for r in records})
    fig, axes = plt.subplots(2, len(task_names), figsize=(5 * len(task_names), 7), squeeze=False)
    ordered = sorted(by_run.items(), key=lambda item: (item[1][0]["heads"], item[0]))
    for run, recs in ordered:
        col = task_names.index(recs[0]["task"])
        recs.sort(key=lambda r: r["step"])
        steps = [r["step"] for r in recs]
        label = f"H={recs[0]['heads']}: {run}"
        fid = [100 * np.mean(r["metrics"]["fidelity"]["mean"]) for r in recs]
        hit = [np.mean(r["metrics"]["hitting_time"]["mean"]) for r in recs]
        axes[0, col].plot(steps, fid, marker="o", ms=3, label=label)
        axes[1, col].plot(steps, hit, marker="o", ms=3, label=label)
    for col, task in enumerate(task_names):
        axes[0, col].set(title=task, ylabel="minimax fidelity, layer mean (%)")
        axes[1, col].set(xlabel="step", ylabel="hitting time, layer mean (steps)")
        hit = [np.mean(r["metrics"]["hitting_time"]["mean"]) for r in records if r["task"] == task]
        _log_if_spread(axes[1, col], min(hit), max(hit))
        axes[0, col].legend(fontsize=7)
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_report(
    records: list[dict],
    out_dir: str | os.PathLike,
    failures: list[tuple[str, str]] = (),
    runs_root: str | os.PathLike | None = None,
) -> list[Path]:
    """report.md, results.csv, results.json, index.html and the PNG plots; returns their
    paths. `failures` (name, message) are listed at the end of report.md; the page draws
    the training loss of each run found under `runs_root` (its metrics.jsonl)."""
    out_dir = Path(out_dir)
    table = rows(records)
    page = report_page.page(latest(records), aggregate(records), records, runs_root)
    written = [
        files.write_text(out_dir / "report.md", markdown(records) + _failed(failures)),
        files.write_text(out_dir / "results.csv", csv_text(table)),
        files.write_json(out_dir / "results.json", table),
        html.write(out_dir, page),
    ]
    return written + files.write_figures(out_dir, figures(records))


def figures(records: list[dict]) -> dict:
    """{file name: a function drawing it} for every plot the records support."""
    plt = files.pyplot()
    out = {
        "metrics_vs_heads.png": lambda: plot_vs_heads(records),
        "amplification.png": lambda: plot_amplification(records),
    }
    if any(
        len({r["step"] for r in records if r["run"] == run}) > 1
        for run in {r["run"] for r in records}
    ):
        out["metrics_vs_step.png"] = lambda: plot_vs_step(records)
    runs = latest(records)
    if len(synergy_report.diversity_points(runs)[0]):
        out["diversity.png"] = lambda: synergy_report.plot_diversity(runs, plt)
    for r in runs:
        safe = _safe(r["run"])
        if "coalitions" in r:
            out.update(coalitions.draw(r["coalitions"], plt, f"coalitions_{safe}", r["run"]))
        if "pairwise_synergy" in r["metrics"] and r["heads"] > 1:
            out[f"synergy_{safe}.png"] = lambda r=r: report_figures.pairwise(
                synergy_report.pairwise_by_layer(r), plt, f"pairwise synergy: {r['run']}"
            )
        if "pruning" in r:
            out[f"pruning_{safe}.png"] = lambda r=r: report_figures.pruning(
                synergy_report.pruning_panels(r), plt, f"pruning: {r['run']}"
            )
    return out
