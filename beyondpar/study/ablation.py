"""Scripted ablations: a grid over config fields -> trained runs -> records -> report.
A grid of language models (`configs/lm_ablation.py`) is reported from the evaluations
its runs logged while training (`lm_report`: the language study's report).

Training is resumable run by run: a finished run (its final checkpoint saved) is never
trained again, an unfinished one resumes from its latest checkpoint, and evaluation
skips what evaluation.jsonl already holds.
"""

from __future__ import annotations

import copy
import itertools
import os
import shlex
from pathlib import Path

import ml_collections
import tqdm

from beyondpar import checkpoints
from beyondpar.base import locks
from beyondpar.study import config_lib, evaluate, lm_report, lm_stats, report, runs, text_config
from beyondpar.study import workdir as workdir_lib

REPORT_DIR = "report"


def grid(ablation: ml_collections.ConfigDict) -> list[dict]:
    """Every combination of the grid: [{label: value}], in the order of `axes`."""
    labels = list(ablation.axes)
    missing = [label for label in labels if label not in ablation.levels]
    if missing:
        raise ValueError(f"levels must list every axis, got none for {missing}")
    combos = itertools.product(*(ablation.levels[label] for label in labels))
    return [dict(zip(labels, combo, strict=True)) for combo in combos]


def run_name(point: dict) -> str:
    return "_".join(f"{label}-{value}" for label, value in point.items())


def _set_field(config: ml_collections.ConfigDict, path: list[str], value, where: str) -> None:
    """Set an existing field, cast to its type; a misspelt path is an error, never a new field."""
    *parents, leaf = path
    node = config
    for name in parents:
        node = node.get(name) if isinstance(node, ml_collections.ConfigDict) else None
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
        raise ValueError(f"{where} must name a config field, got {'.'.join(path)!r}")
    node[leaf] = type(node[leaf])(value)


def overrides(ablation: ml_collections.ConfigDict) -> dict:
    """The overrides that are set (placeholders for every other field of the base are None)."""
    return {k: v for k, v in ablation.overrides.items() if v is not None}


def run_config(
    ablation: ml_collections.ConfigDict, point: dict, base: ml_collections.ConfigDict | None = None
) -> ml_collections.ConfigDict:
    """The config of one grid point: a copy of `base` (default: the ablation's base config
    file, read now) with the point's axes and the overrides set."""
    config = _load_base(ablation) if base is None else copy.deepcopy(base)
    for label, value in point.items():
        _set_field(config, ablation.axes[label].split("."), value, f"axes.{label}")
    for field, value in overrides(ablation).items():
        _set_field(config, field.split("__"), value, f"overrides.{field}")
    return config


def check_point(config: ml_collections.ConfigDict) -> None:
    """Everything a run needs before it trains: config, model, task or corpus, evaluation
    settings."""
    runs.validate(config)


def _load_base(ablation: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The ablation's base config, read from its file."""
    return config_lib.load_config_file(ablation.base, ablation.base_arg or None)


def validated_configs(ablation: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
    """{run name: config} for every point of the grid; a ValueError lists every invalid
    point with its error before anything is trained. The base config is read once: a bad
    base is one error, not one per point; so is a bad `steps`."""
    evaluate.check_steps(ablation.steps)
    configs, errors = {}, []
    base = _load_base(ablation)
    points = grid(ablation)
    for point in points:
        name = run_name(point)
        try:
            configs[name] = run_config(ablation, point, base)
            check_point(configs[name])
        except (ValueError, TypeError) as err:
            errors.append(f"  {name}: {err}")
    if errors:
        raise ValueError(
            f"{len(errors)} of {len(points)} grid points "
            "are invalid; nothing was trained:\n" + "\n".join(errors)
        )
    return configs


def is_finished(run_dir: Path, config: ml_collections.ConfigDict) -> bool:
    steps = checkpoints.list_steps(run_dir / workdir_lib.CHECKPOINT_DIR)
    return bool(steps) and steps[-1] >= runs.total_steps(config)


def dry_run(ablation: ml_collections.ConfigDict, workdir: str | os.PathLike) -> list[str]:
    """One `launch/train.py` command per run, for a cluster scheduler."""
    validated_configs(ablation)
    commands = []
    for point in grid(ablation):
        base = ablation.base + (f":{ablation.base_arg}" if ablation.base_arg else "")
        flags = [f"--config={base}"]
        flags += [f"--config.{ablation.axes[k]}={v}" for k, v in point.items()]
        flags += [f"--config.{k.replace('__', '.')}={v}" for k, v in overrides(ablation).items()]
        flags.append(f"--workdir={Path(workdir) / run_name(point)}")
        commands.append(shlex.join(["python", "launch/train.py", *flags]))
    return commands


def run(ablation: ml_collections.ConfigDict, workdir: str | os.PathLike, progress: bool = True):
    """Train what is missing, evaluate, write the report. Returns (report files, failures):
    failures are (run or checkpoint, message); a failed run does not stop the others."""
    workdir = Path(workdir)
    configs = validated_configs(ablation)
    if text_config.is_text(next(iter(configs.values()))):
        return _run_text(configs, workdir, progress)
    with locks.lock(workdir):
        failed = _train_all(configs, workdir, progress)
        _, failures = evaluate.evaluate_tree(workdir, ablation.steps, progress)
        records = [
            r for r in evaluate.read_records(workdir / evaluate.RECORDS_FILE) if r["run"] in configs
        ]
        failures = failed + _not_trained_again(failures, failed)
        written = []
        if records:
            written = report.write_report(records, workdir / REPORT_DIR, failures, workdir)
    return written, failures


def _run_text(configs: dict, workdir: Path, progress: bool):
    """A language study: train what is missing, then the report from the runs' own
    evaluations. There is no batch evaluation: each run already measured its held-out
    loss and attention graphs at every evaluation step (metrics.jsonl), on fixed
    held-out windows of its corpus, which is what evaluating its checkpoints would redo."""
    with locks.lock(workdir):
        failed = _train_all(configs, workdir, progress)
        found = lm_stats.read_runs(workdir, names=set(configs))
        written = lm_report.write_report(found, workdir / REPORT_DIR, failed) if found else []
    return written, failed


def _not_trained_again(evaluation_failures: list, training_failures: list) -> list:
    """Evaluation's failures less a run whose training failed before saving anything
    (`<run>@?`): its training error already names it."""
    failed_runs = {f"{name}@?" for name, _ in training_failures}
    return [(name, message) for name, message in evaluation_failures if name not in failed_runs]


def _train_all(configs: dict, workdir: Path, progress: bool) -> list[tuple[str, str]]:
    failed = []
    for name, config in tqdm.tqdm(configs.items(), desc="runs", unit="run", disable=not progress):
        if is_finished(workdir / name, config):
            continue
        config.progress_bar = progress
        try:
            runs.train_and_evaluate(config, str(workdir / name))
        except Exception as err:  # noqa: BLE001 - NaN losses included: recorded, the grid goes on
            message = f"{type(err).__name__}: {err}".splitlines()[0]
            failed.append((name, message))
            tqdm.tqdm.write(f"FAILED {name}: {message}")
    return failed
