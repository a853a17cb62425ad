"""The language study's numbers, read from its runs: each run's config.json and the
metrics.jsonl lines its evaluations write (`text_training`: `eval/loss`,
`eval/bits_per_byte` and `layer{l}/<measure>` for every layer), summarised over seeds.

Cells are means over seeds with 95% Student-t intervals (cut to [0, 1] for the graph
measures, which are shares and fidelities). Differences to 1 head are paired
by seed: the runs of one seed share their batch order and initial key, so the seed's own
share of the spread cancels. Graph measures are means over layers of each evaluation's
per-layer means over the measured windows.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

import jax
import numpy as np

from beyondpar import model as model_lib
from beyondpar.base import files
from beyondpar.measure import record
from beyondpar.study import workdir as workdir_lib

LOSS_KEY, BPB_KEY = "eval/loss", "eval/bits_per_byte"
LOSSES = {LOSS_KEY: "held-out loss (nats/token)", BPB_KEY: "held-out bits per byte"}
OPTIMAL_WINS = "wins_optimal"
GRAPHS = {
    record.BEST_HEAD_FIDELITY: "best head fidelity",
    "fidelity_learned": "learned mix fidelity",
    "fidelity_uniform": "uniform mix fidelity",
    "fidelity_optimal": "held-out optimal mix fidelity",
    OPTIMAL_WINS: "held-out optimal mix beats the best head",
}
METRICS = {**LOSSES, **GRAPHS}


def interval(values, within: tuple[float, float] | None = None) -> dict:
    """Mean and 95% Student-t interval of `values` (float64), its ends cut to the range
    `within` the quantity can take (a share of 3 seeds near 1 would reach past 100%);
    one value has no interval."""
    v = np.asarray(values, np.float64)
    n, mean = v.size, float(v.mean()) if v.size else math.nan
    if n < 2:
        return {"mean": mean, "low": math.nan, "high": math.nan, "n": n}
    from scipy import stats  # 0.8 s to import: only for an interval (2 values or more)

    half = float(stats.t.ppf(0.975, n - 1) * v.std(ddof=1) / math.sqrt(n))
    low, high = mean - half, mean + half
    if within is not None:
        low, high = max(low, within[0]), min(high, within[1])
    return {"mean": mean, "low": low, "high": high, "n": n}


def metric_range(metric: str) -> tuple[float, float] | None:
    """The values `metric` can take: the graph measures are shares and fidelities, in
    [0, 1]; losses have no upper end (None: no cut)."""
    return (0.0, 1.0) if metric in GRAPHS else None


def evaluation_values(line: dict) -> dict[str, float]:
    """The losses of one evaluation line and each graph measure's mean over layers."""
    out = {k: float(line[k]) for k in LOSSES}
    for name in GRAPHS:
        layers = [v for k, v in line.items() if k.startswith("layer") and k.endswith(f"/{name}")]
        if layers:
            out[name] = float(np.mean(layers))
    return out


def parameter_count(config: dict) -> int:
    """Parameters of the run's model, from its shapes (nothing is initialised)."""
    module = model_lib.Transformer(model_lib.ModelConfig(**config["model"]))
    shapes = jax.eval_shape(
        lambda: model_lib.init_params(module, jax.random.PRNGKey(0), config["seq_len"])
    )
    return model_lib.count_params(shapes)


def read_run(run_dir: Path, name: str) -> dict:
    """One run: its head count, seed, sizes and {step: evaluation values}."""
    config = workdir_lib.read_config(run_dir)
    lines = files.read_json_lines(run_dir / workdir_lib.METRICS_FILE, ("step", *LOSSES))
    cfg = model_lib.ModelConfig(**config["model"])
    return {
        "run": name,
        "heads": cfg.num_heads,
        "seed": int(config["seed"]),
        "embed_dim": cfg.embed_dim,
        "head_dim": cfg.head_dim,
        "params": parameter_count(config),
        "tokens": int(config["optim"]["steps"] * config["optim"]["batch_size"] * config["seq_len"]),
        "corpus": config["data"]["path"] or "the default corpus",
        "evals": {int(line["step"]): evaluation_values(line) for line in lines},
    }


def read_runs(root: str | os.PathLike, names=None) -> list[dict]:
    """Every language-model run under `root` (a folder with config.json naming a corpus)
    that has evaluated at least once; only those in `names` when given."""
    root = Path(root)
    found = []
    for path in sorted(root.rglob(workdir_lib.CONFIG_FILE)):
        name = str(path.parent.relative_to(root)) if path.parent != root else root.name
        if names is not None and name not in names:
            continue
        if "data" not in workdir_lib.read_config(path.parent):
            continue
        run = read_run(path.parent, name)
        if run["evals"]:
            found.append(run)
    return found


def last_values(run: dict) -> dict[str, float]:
    return run["evals"][max(run["evals"])]


def by_heads(runs: list[dict]) -> dict[int, dict[int, dict]]:
    """{heads: {seed: run}}."""
    out = defaultdict(dict)
    for run in runs:
        out[run["heads"]][run["seed"]] = run
    return dict(sorted(out.items()))


def summarize(runs: list[dict]) -> dict:
    """At each run's last evaluation: every metric per head count (mean and interval over
    seeds) and, for the losses, the paired differences to 1 head (seeds that both hold)."""
    groups = by_heads(runs)
    cells, paired = defaultdict(dict), defaultdict(dict)
    for metric in METRICS:
        for heads, seeds in groups.items():
            values = [last_values(r)[metric] for r in seeds.values() if metric in last_values(r)]
            if values:
                cells[metric][heads] = interval(values, metric_range(metric))
    one = groups.get(1, {})
    for metric in LOSSES:
        for heads, seeds in groups.items():
            common = sorted(set(seeds) & set(one))
            if heads != 1 and common:
                diffs = [
                    last_values(seeds[s])[metric] - last_values(one[s])[metric] for s in common
                ]
                paired[metric][heads] = interval(diffs)
    return {"heads": list(groups), "cells": dict(cells), "paired": dict(paired)}


def over_steps(runs: list[dict], metric: str) -> dict[int, dict[int, dict]]:
    """{heads: {step: mean and interval over the seeds evaluated at that step}}."""
    values = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for step, evaluation in run["evals"].items():
            if metric in evaluation:
                values[run["heads"]][step].append(evaluation[metric])
    return {
        h: {s: interval(v, metric_range(metric)) for s, v in sorted(steps.items())}
        for h, steps in sorted(values.items())
    }


def wins_change(runs: list[dict]) -> dict:
    """How the held-out optimal mix's wins over the best head change from each multi-head
    run's first evaluation to its last: per run (last - first), their mean and interval,
    and the mean wins at the first and last evaluations."""
    first, last = [], []
    for run in runs:
        steps = [s for s in sorted(run["evals"]) if OPTIMAL_WINS in run["evals"][s]]
        if run["heads"] > 1 and len(steps) > 1:
            first.append(run["evals"][steps[0]][OPTIMAL_WINS])
            last.append(run["evals"][steps[-1]][OPTIMAL_WINS])
    change = interval(np.subtract(last, first)) if first else interval([])
    return {
        "runs": len(first),
        "first": float(np.mean(first)) if first else math.nan,
        "last": float(np.mean(last)) if last else math.nan,
        "change": change,
    }


def parameters(runs: list[dict]) -> dict[int, dict]:
    """{heads: {head_dim, embed_dim, params}} (the first run of each head count)."""
    return {
        h: {k: next(iter(seeds.values()))[k] for k in ("head_dim", "embed_dim", "params")}
        for h, seeds in by_heads(runs).items()
    }
