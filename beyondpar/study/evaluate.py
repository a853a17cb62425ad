"""Checkpoints -> records: per-layer mixing and fidelity, amplification and accuracy.

All metrics of one checkpoint come from one forward pass and one batched kernel call
over every (sequence, layer, operator), operators being the mix with learned head
importances, the uniform mix and every head alone.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import traceback
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm

from beyondpar import batches, checkpoints, measure, metrics, pruning, synergy, tasks, weighting
from beyondpar import model as model_lib
from beyondpar.base import checks, files, locks, parallel
from beyondpar.measure import record
from beyondpar.study import attention_view, coalition_record, config_lib, pruning_curves
from beyondpar.study import workdir as workdir_lib

RECORDS_FILE = "evaluation.jsonl"
RECORD_FORMAT = 2  # 2: the optimum held out, with its in-sample value beside it
WALKS = metrics.WALKS


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """What an evaluation measures (the `evaluation` block of a run's config).

    `optimal_weights` and `pruning` switch off the costlier analyses (the weight search and
    the masked forward passes); the rest is a few batched kernel calls. The optimal
    weights are held out: each sequence is scored with weights searched on the other of
    `folds` contiguous folds of the sequences, with the in-sample optimum beside them.
    """

    num_sequences: int = 50
    seed: int = 1234
    horizon: int = 100
    max_steps: int = 100
    eps: float = 0.25
    walk: str = "reference"
    optimal_weights: bool = True
    pruning: bool = True
    folds: int = 2
    coalitions: bool = False

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> EvalSpec:
        return cls(**config.evaluation.to_dict())


@functools.partial(jax.jit, static_argnums=0)
def forward(module, params, inputs):
    """Logits, float32 attention (N, L, H, T, T) and the learned head weights (L, H)."""
    logits, attn = model_lib.apply_with_attention(module, params, inputs)
    return logits, attn.astype(jnp.float32), model_lib.head_importances(module, params)


def optimal_mixes(attn, weights, spec: EvalSpec) -> dict:
    """Per optimum, its weights per sequence and layer (N, L, H): for each objective, held
    out (each sequence's searched on the other folds of the sequences; in sample when
    there is one sequence) and in sample (one vector per layer, searched on every
    sequence it is scored on), named as the measurement record names its mixes."""
    if not spec.optimal_weights:
        return {}
    # One problem per layer (L x N x H x T x T), from the host: the search splits its own
    # batch over devices, so sequences split over devices would be moved twice.
    per_layer = np.swapaxes(np.asarray(attn), 0, 1)
    n = per_layer.shape[1]
    settings = dict(walk=spec.walk, horizon=spec.horizon, max_steps=spec.max_steps)
    num_folds = len(weighting.folds(n, spec.folds))
    w = np.asarray(weights)
    fold_init = np.broadcast_to(w[:, None], (w.shape[0], num_folds, w.shape[1]))
    names = {
        "fidelity": (record.OPTIMAL, record.OPTIMAL_IN_SAMPLE),
        "hitting_time": (record.OPTIMAL_HITTING_TIME, record.OPTIMAL_HITTING_TIME_IN_SAMPLE),
    }
    out = {}
    for objective, (held_name, inside_name) in names.items():
        inside = synergy.optimal_weights(per_layer, objective, init=weights, **settings)[0]
        held = weighting.cross_fitted(
            per_layer, spec.folds, objective=objective, init=fold_init, **settings
        )
        out[held_name] = np.swapaxes(np.asarray(held["weights"]), 0, 1)
        out[inside_name] = np.broadcast_to(np.asarray(inside), (n, *w.shape))
    return out


def per_sequence(module, params, examples: tasks.Examples, spec: EvalSpec) -> dict:
    """Every metric per sequence: arrays (N, L), (N, L, H) or (N, L, H, H), accuracies (N,).

    Every layer of every sequence is measured by one `measure.measure_layer` call, with
    the learned, the uniform and (when switched on) the optimal mixes, held out and in
    sample per objective; the columns are the study's names for fields of its record
    (`columns`).
    """
    return _per_sequence(module, params, examples, spec)[0]


def placed(params, inputs_NxT):
    """(parameters on every local device, sequences split over them): the evaluation's
    placement, under which the forward pass and the metric kernels each work on their
    share without copies between devices."""
    replicated = parallel.replicated(parallel.data_mesh(jax.local_devices()))
    return jax.device_put(params, replicated), parallel.split_over_devices(inputs_NxT)


def _per_sequence(module, params, examples: tasks.Examples, spec: EvalSpec):
    """(per-sequence metrics, attention (N, L, H, T, T), learned weights (L, H), the
    fidelity game's COALITION fields (N, L, ...) when `spec.coalitions`)."""
    params, inputs = placed(params, examples.inputs)
    logits, attn, weights = forward(module, params, inputs)
    optimal = optimal_mixes(attn, weights, spec)
    mspec = measure.MeasureSpec(
        horizon=spec.horizon,
        max_steps=spec.max_steps,
        eps=spec.eps,
        coalitions=spec.coalitions,
        coalition_seed=spec.seed,
    )
    # Every (sequence, layer) is one set of heads: all layers measured in one call, each
    # with its own layer's weights.
    n, num_layers = attn.shape[:2]
    flat = lambda w: np.broadcast_to(np.asarray(w), (n, *weights.shape)).reshape(n * num_layers, -1)
    extra = {name: flat(w) for name, w in optimal.items()}
    sets = jnp.reshape(attn, (n * num_layers, *attn.shape[2:]))
    found = measure.measure_layer(sets, flat(weights), mspec, extra=extra)
    out = {k: v.reshape(n, num_layers, *v.shape[1:]) for k, v in columns(found, spec.walk).items()}
    out.update(_weights_columns(weights, optimal, n))
    out.update(_accuracies(logits, examples))
    games = {
        k: v.reshape(n, num_layers, *v.shape[1:])
        for k, v in found.get(record.COALITIONS, {}).items()
    }
    return out, attn, weights, games


def columns(layer: dict, walk: str) -> dict:
    """The study's columns (its CSV and report names) of one layer's measurement record:
    the learned mix's fields on `walk`, with both walks where the reference walk
    saturates, every head's, the optimum's when measured."""
    other = WALKS[1 - WALKS.index(walk)]
    learned, uniform = layer["mixes"][record.LEARNED], layer["mixes"][record.UNIFORM]
    heads = layer["heads"]
    gain = learned[record.GAIN.name]
    out = {
        "hitting_time": learned[f"hitting_time_{walk}"],
        "hitting_time_uniform": uniform[f"hitting_time_{walk}"],
        "hitting_time_per_head": heads[f"hitting_time_{walk}"],
        "hitting_time_best_head": heads[f"hitting_time_{walk}"].min(-1),
        "tv_mixing_time": learned[f"tv_mixing_time_{walk}"],
        "spectral_radius": learned[f"spectral_radius_{walk}"],
        "spectral_mixing_time": learned[f"spectral_mixing_time_{walk}"],
        "fidelity": learned["fidelity"],
        "fidelity_uniform": uniform["fidelity"],
        "fidelity_per_head": heads["fidelity"],
        "best_individual": layer["best_head_fidelity"],
        "gain": gain,
        "combined_wins": (gain > 0).astype(np.float32),
    }
    for name in ("hitting_time", "tv_mixing_time", "spectral_mixing_time"):
        out.update({f"{name}_{w}": learned[f"{name}_{w}"] for w in (walk, other)})
    for name in ("head_diversity", "pairwise_synergy", "cross_head_share_minimax"):
        out[name] = layer[name]
    out["cross_head_share_mean"] = layer["cross_head_share_mean"]
    return {**out, **_optimal_columns(layer["mixes"], walk)}


# The study's names of the optimal mixes: (column, mix, its field; `walk` filled in).
_HIT = "hitting_time_{walk}"
_OPTIMAL = (
    ("fidelity_optimal", record.OPTIMAL, "fidelity"),
    ("fidelity_optimal_in_sample", record.OPTIMAL_IN_SAMPLE, "fidelity"),
    ("hitting_time_optimal", record.OPTIMAL_HITTING_TIME, "hitting_time_{walk}"),
    (
        "hitting_time_optimal_in_sample",
        record.OPTIMAL_HITTING_TIME_IN_SAMPLE,
        "hitting_time_{walk}",
    ),
)
_OPTIMAL_WEIGHTS = {
    record.OPTIMAL: "optimal_weights_fidelity",
    record.OPTIMAL_IN_SAMPLE: "optimal_weights_fidelity_in_sample",
    record.OPTIMAL_HITTING_TIME: "optimal_weights_hitting_time",
    record.OPTIMAL_HITTING_TIME_IN_SAMPLE: "optimal_weights_hitting_time_in_sample",
}


def _optimal_columns(mixes: dict, walk: str) -> dict:
    return {
        column: mixes[mix][field.format(walk=walk)]
        for column, mix, field in _OPTIMAL
        if mix in mixes
    }


def _weights_columns(weights, optimal: dict, n: int) -> dict:
    """Per sequence: the learned head weights and each optimum's weights (N, L, H)."""
    out = {"head_weights": np.broadcast_to(np.asarray(weights), (n, *weights.shape))}
    out.update({_OPTIMAL_WEIGHTS[mix]: np.asarray(w) for mix, w in optimal.items()})
    return out


def _view_mixes(columns: dict) -> dict:
    """The mixes the page draws beside the attention, per sequence (N, L, H): the learned
    weights and the held-out optimum of fidelity when searched."""
    out = {record.LEARNED: columns["head_weights"]}
    held_out = _OPTIMAL_WEIGHTS[record.OPTIMAL]
    if held_out in columns:
        out[record.OPTIMAL] = columns[held_out]
    return out


def _accuracies(logits, examples: tasks.Examples) -> dict:
    """Per sequence, on the host (float64): accuracy at every position and on the
    predictable ones."""
    logits = np.asarray(logits)
    batch = batches.Batch(*(np.asarray(a) for a in examples))
    return {
        "accuracy": np.mean(logits.argmax(-1) == batch.targets, -1),
        "accuracy_predictable": batches.accuracy(logits, batch, axis=-1),
    }


def summarize(values: dict) -> dict:
    """Mean and standard deviation over sequences, as plain JSON numbers and lists."""
    out = {}
    for name, array in values.items():
        array = np.asarray(array, np.float64)
        out[name] = {"mean": array.mean(0).tolist(), "std": array.std(0).tolist()}
    return out


def eval_examples(config: ml_collections.ConfigDict, spec: EvalSpec) -> tasks.Examples:
    """Held-out sequences of the run's task, from a seed separate from training."""
    t = config.task
    key = jax.random.PRNGKey(spec.seed)
    return tasks.make_examples(
        t.name, key, spec.num_sequences, t.seq_len, config.model.vocab_size, t.lag
    )


def evaluate_params(module, params, examples, spec: EvalSpec, **info) -> dict:
    """One record: `info` (run, step, task, ...) plus the summarised metrics."""
    cfg = module.config
    record = {
        **info,
        "format": RECORD_FORMAT,
        "heads": cfg.num_heads,
        "layers": cfg.num_layers,
        "num_sequences": int(examples.inputs.shape[0]),
        "seq_len": int(examples.inputs.shape[1]),
        "walk": spec.walk,
        "evaluation": dataclasses.asdict(spec),
    }
    values, attn, weights, games = _per_sequence(module, params, examples, spec)
    record["metrics"] = summarize(values)
    record[attention_view.KEY] = attention_view.first_sequence(
        attn, examples.inputs, _view_mixes(values), spec.horizon
    )
    if games:
        record["coalitions"] = coalition_record.layer_games(
            module, params, examples, games, spec.seed
        )
    record["attention_necessity"] = pruning.attention_necessity(module, params, examples)
    if spec.pruning and cfg.num_heads > 1:
        record["pruning"] = pruning_curves.pruning_curves(
            module, params, examples, weights, attn, spec
        )
    return record


# ---------------------------------------------------------------- runs on disk


def read_config(run_dir: str | os.PathLike) -> ml_collections.ConfigDict:
    """A run's config; a garbled config.json is a ValueError naming the file."""
    return ml_collections.ConfigDict(workdir_lib.read_config(run_dir))


def evaluate_checkpoint(
    run_dir: str | os.PathLike, step: int | None = None, root=None, coalitions: bool = False
) -> dict:
    """Record of a run's checkpoint at `step` (latest by default); `coalitions` measures
    the heads' coalitions whatever the run's `evaluation.coalitions` says."""
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    step, state = checkpoints.load(run_dir / workdir_lib.CHECKPOINT_DIR, step)
    module = model_lib.Transformer(config_lib.model_config(config))
    spec = EvalSpec.from_config(config)
    if coalitions:
        spec = dataclasses.replace(spec, coalitions=True)
    name = run_name(run_dir, root)
    return evaluate_params(
        module,
        state["params"],
        eval_examples(config, spec),
        spec,
        run=name,
        step=int(step),
        task=config.task.name,
        seed=int(config.seed),
    )


def run_name(run_dir: Path, root=None) -> str:
    """A run's name in records: its path under `root` (its folder name when it is `root`)."""
    relative = Path(run_dir).relative_to(root) if root else Path(".")
    return Path(run_dir).name if str(relative) == "." else str(relative)


def find_runs(root: str | os.PathLike) -> list[Path]:
    """Run directories under `root`: folders with config.json and a checkpoints folder."""
    root = Path(root)
    found = {
        p.parent
        for p in root.rglob(workdir_lib.CONFIG_FILE)
        if (p.parent / workdir_lib.CHECKPOINT_DIR).is_dir()
    }
    return sorted(found)


RECORD_KEYS = ("run", "step", "task", "heads", "layers", "metrics")


def read_records(path: str | os.PathLike, problems: list[str] | None = None) -> list[dict]:
    """Records of a JSON-lines file. A torn last line (a killed writer) is ignored; any
    other line that is not a record is skipped and, with `problems`, named there. Records
    of the first format are read in today's names (`upgrade`); a newer format is refused."""
    return [upgrade(r, path) for r in files.read_json_lines(path, RECORD_KEYS, problems)]


# Format 1 scored the optimum on the sequences it was searched on, under the names that
# now hold the held-out optimum: read as what it was.
_IN_SAMPLE_BEFORE_FORMAT_2 = (
    "fidelity_optimal",
    "hitting_time_optimal",
    "optimal_weights_fidelity",
    "optimal_weights_hitting_time",
)


def upgrade(record: dict, path="records") -> dict:
    """A record in the current format: format 1 (no "format" key) has its in-sample
    optimum renamed `..._in_sample`, never read as held out."""
    found = record.get("format", 1)
    if found == RECORD_FORMAT:
        return record
    if found != 1:
        raise ValueError(
            f"{path}: record format must be 1 or {RECORD_FORMAT}, got {found!r} (written by a "
            "newer beyondpar: update it, or evaluate into another folder)"
        )
    metrics_ = dict(record.get("metrics", {}))
    for name in _IN_SAMPLE_BEFORE_FORMAT_2:
        if name in metrics_:
            metrics_[f"{name}_in_sample"] = metrics_.pop(name)
    return {**record, "format": RECORD_FORMAT, "metrics": metrics_}


def _pairs(runs: list[Path], steps: str) -> Iterator[tuple[Path, int | None]]:
    for run in runs:
        saved = checkpoints.list_steps(run / workdir_lib.CHECKPOINT_DIR)
        if not saved:
            yield run, None
        elif steps == "all":
            yield from ((run, s) for s in saved)
        else:
            yield run, saved[-1]


def check_steps(steps: str) -> None:
    """Which saved steps `evaluate_tree` evaluates: 'latest' or 'all'."""
    if steps not in ("latest", "all"):
        raise ValueError(f"steps must be 'latest' or 'all', got {steps!r}")


def evaluate_tree(
    root: str | os.PathLike, steps: str = "latest", progress: bool = True, coalitions=False
):
    """Evaluate every run under `root`; append records to root/evaluation.jsonl
    (`coalitions`: with the heads' coalitions, see `evaluate_checkpoint`).

    (run, step) pairs already recorded are skipped, so an interrupted evaluation resumes.
    Returns (new records, failures as (run/step, message)); a failed checkpoint does not
    stop the others.
    """
    check_steps(steps)
    root = Path(root)
    if not root.is_dir():
        raise checks.path_error(
            root, f"runs directory must be an existing folder, got {str(root)!r}"
        )
    runs = find_runs(root)
    if not runs:
        raise checks.MissingPathError(
            f"no runs under {root}: looked for folders holding {workdir_lib.CONFIG_FILE} and "
            f"{workdir_lib.CHECKPOINT_DIR}/"
        )
    with locks.lock(root):
        return _evaluate_runs(root, runs, steps, progress, coalitions)


def _evaluate_runs(root: Path, runs: list[Path], steps: str, progress: bool, coalitions: bool):
    out = root / RECORDS_FILE
    done = {(r["run"], r["step"]) for r in read_records(out)}
    todo = [
        (run, step) for run, step in _pairs(runs, steps) if (run_name(run, root), step) not in done
    ]
    records, failures = [], []
    for run, step in tqdm.tqdm(todo, desc="evaluating", unit="ckpt", disable=not progress):
        name = f"{run_name(run, root)}@{step if step is not None else '?'}"
        try:
            if step is None:
                raise FileNotFoundError("no checkpoint saved")
            record = evaluate_checkpoint(run, step, root, coalitions)
        except Exception as err:  # noqa: BLE001 - reported by name, the rest go on
            failures.append((name, f"{type(err).__name__}: {err}".splitlines()[0]))
            tqdm.tqdm.write(f"skipped {name}: {failures[-1][1]}")
            if os.environ.get("BEYONDPAR_DEBUG"):
                traceback.print_exc()
            continue
        files.append_json_line(out, record)
        records.append(record)
    return records, failures


# ---------------------------------------------------------------- the paper's checkpoints


def evaluate_reference(
    path: str | os.PathLike, spec: EvalSpec = EvalSpec(), seq_len: int | None = None
) -> dict:
    """Record of a checkpoint released with the paper, named <H>_heads_<task>.npz|.pt."""
    path = Path(path)
    heads, sep, task = path.stem.partition("_heads_")
    if not (sep and heads.isdigit()):
        raise ValueError(f"path must be named <H>_heads_<task>.npz or .pt, got {path.name!r}")
    if task not in tasks.TASKS:
        raise ValueError(
            f"path {path.name!r} must name a task of {tasks.TASKS} after '_heads_', got {task!r}"
        )
    module, params = checkpoints.import_reference(path, int(heads))
    cfg = module.config
    key = jax.random.PRNGKey(spec.seed)
    examples = tasks.make_examples(
        task, key, spec.num_sequences, seq_len or cfg.max_len, cfg.vocab_size
    )
    # Released weights have no training step or seed: recorded as None, shown as "-".
    return evaluate_params(
        module, params, examples, spec, run=path.name, step=None, task=task, seed=None
    )


def reference_files(folder: str | os.PathLike) -> list[Path]:
    """`<H>_heads_<task>.npz|.pt` in a folder (a .pt beside its .npz is the same weights)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise checks.path_error(
            folder, f"reference folder must be an existing folder, got {str(folder)!r}"
        )
    paths = sorted(
        p
        for p in folder.iterdir()
        if "_heads_" in p.name and p.suffix in (".npz", ".pt") and ".expected" not in p.name
    )
    paths = [p for p in paths if not (p.suffix == ".pt" and p.with_suffix(".npz") in paths)]
    if not paths:
        raise checks.MissingPathError(f"no <H>_heads_<task>.npz or .pt files in {folder}")
    return paths


def evaluate_reference_folder(folder, spec: EvalSpec = EvalSpec(), progress: bool = True):
    """(records, failures) of every released checkpoint in `folder`; a file that fails is
    named in failures with why (a bad name, or unreadable) and the others are evaluated.
    `progress`: a bar over the files (each takes seconds to minutes)."""
    records, failures = [], []
    paths = reference_files(folder)
    for path in tqdm.tqdm(paths, desc="evaluating", unit="file", disable=not progress):
        try:
            records.append(evaluate_reference(path, spec))
        except Exception as err:  # noqa: BLE001 - zip, pickle and shape errors alike
            failures.append((path.name, _reference_failure(err)))
    return records, failures


def _reference_failure(err: Exception) -> str:
    """One line on why a released checkpoint failed: its name, or reading it."""
    named = isinstance(err, ValueError) and str(err).startswith("path ")
    return (str(err) if named else f"unreadable: {type(err).__name__}: {err}").splitlines()[0]
