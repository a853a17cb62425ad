"""A corpus through a pretrained model: answers with their uncertainty.

Every window of T tokens goes through the model in batches, layer by layer (memory: one
layer of one batch), and its per-layer numbers are appended as one line to
`windows.jsonl`. A rerun with the same settings skips the windows already there; other
settings are refused, naming every differing field. Each line names the window's
document and its position there. The summary gives, per layer, the mean over windows and
a 95% bootstrap confidence interval that resamples documents (blocks of consecutive
windows when there is one; `statistics`) of every metric of every head and mix, the share
of windows where each mix beats its best head and the gain's mean and interval, beside
uniform causal attention of the same length. With `pruning`, the
model's loss and next-token accuracy as heads are removed in each order, with areas.
With `spec.coalitions`, every layer's heads as a game on fidelity (every window) and on
the loss (the first `coalition_windows` windows), with intervals over windows.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import tqdm

from beyondpar import measure, pretrained
from beyondpar.analysis import (
    coalition_summary,
    loss_pruning,
    optimum,
    statistics,
    text,
    views,
    windowing,
)
from beyondpar.base import checks, files, locks, settings
from beyondpar.measure import record

WINDOWS_FILE = "windows.jsonl"
SETTINGS_FILE = "settings.json"
SUMMARY_FILE = "corpus.json"


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """How the corpus is cut and batched. `batch_size` windows go through together (a
    multiple of the device count shards them over every local device)."""

    tokens: int
    max_windows: int | None = None
    batch_size: int = 8
    pruning: bool = False
    pruning_windows: int = 8
    pruning_points: int = 11
    search_windows: int = 8
    seed: int = 0
    coalition_windows: int = 8

    def __post_init__(self):
        for name in ("batch_size", "pruning_windows", "pruning_points", "search_windows"):
            checks.positive_int(f"--{name}", getattr(self, name))
        checks.non_negative_int("--coalition_windows", self.coalition_windows)


def run(model, corpus_path, cspec: CorpusSpec, spec, out_dir, dtype=None, progress=True, mesh=None):
    """Analyse every window not yet recorded, then summarise: (summary, windows). The
    model's weights go on `mesh` (default one device), each batch along its `data` axis."""
    out_dir = Path(out_dir)
    docs = windowing.read_documents(corpus_path)
    module, params, tokenizer = pretrained.load(model, dtype, mesh, progress)
    windows = windowing.make_windows(
        docs, tokenizer, cspec.tokens, cspec.max_windows, module.config.max_len
    )
    spec.check_length(cspec.tokens)
    wanted = _settings(model, corpus_path, cspec, spec, dtype)
    with locks.lock(out_dir):
        _check_settings(out_dir, wanted)
        found = None
        if spec.optimal_weights:
            found = optimum.corpus_optimum(module, params, windows, spec, cspec, out_dir, progress)
        records = _windows_done(module, params, windows, cspec, spec, found, out_dir, progress)
        summary = statistics.summarize(records, cspec.seed)
        summary.update(
            description(model, corpus_path, windows, cspec, spec),
            baseline=measure.baselines(cspec.tokens, spec),
        )
        if found is not None:
            summary["optimal"] = optimum.summary(found)
        if cspec.pruning:
            summary["pruning"] = loss_pruning.corpus_curves(
                module, params, windows, cspec, spec, progress
            )
        if spec.coalitions:
            summary["coalitions"] = coalitions(
                module, params, windows, records, cspec, spec, progress
            )
            summary["coalition_intervals"] = coalition_intervals(records, cspec)
        files.write_json(out_dir / SUMMARY_FILE, summary)
        shown = views.corpus_views(module, params, tokenizer, windows, spec, found)
        files.write_json(out_dir / views.FILE, {views.KEY: shown})
    return summary, windows


def coalition_intervals(records: list[dict], cspec) -> dict:
    """How the coalition intervals resample: {"fidelity": ..., "loss": ...} over the
    windows each game was played on (`statistics.Resampling.as_dict`)."""
    played = min(cspec.coalition_windows, len(records))
    out = {"fidelity": coalition_summary.resampling(records, len(records))}
    if played:
        out["loss"] = coalition_summary.resampling(records, played)
    return out


def coalitions(module, params, windows, records, cspec, spec, progress=True) -> dict:
    """Per layer, the fidelity game over every window and the loss game on the first
    `cspec.coalition_windows` windows (0: none; it runs the model 2^H times per window
    and layer), with intervals over windows."""
    layers = [int(k) for k in records[0]["layers"]]
    rows = {layer: [r["layers"][str(layer)] for r in records] for layer in layers}
    fidelity = coalition_summary.fidelity_games(rows)
    tokens = np.asarray(windows.tokens[: cspec.coalition_windows])
    loss = {}
    if len(tokens):
        loss = coalition_summary.loss_games(module, params, tokens, layers, spec, progress)
    return coalition_summary.summarize(fidelity, loss, cspec.seed, records)


def _windows_done(module, params, windows, cspec, spec, found, out_dir, progress) -> list[dict]:
    """Every window's record: those in windows.jsonl, the rest analysed and appended."""
    done = {r["window"]: r for r in files.read_json_lines(out_dir / WINDOWS_FILE, ("window",))}
    todo = [i for i in range(len(windows.tokens)) if i not in done]

    def keep(index, line):
        files.append_json_line(out_dir / WINDOWS_FILE, line)
        done[index] = line

    extra, extra_without_sink = {}, {}
    if found is not None:
        sizes = (len(windows.tokens), module.config.num_layers)
        extra["optimal"] = optimum.per_window(found, "weights", *sizes)
        if spec.sink_tokens:
            extra_without_sink["optimal"] = optimum.per_window(
                found, "weights_without_sink", *sizes
            )
    # The optimum is searched above, once; pairwise synergy (H^2 / 2 more operators) is a
    # single-text view the corpus summary does not keep.
    inner = dataclasses.replace(spec, optimal_weights=False, pairwise=False)
    analyze_windows(
        module,
        params,
        windows,
        todo,
        inner,
        cspec.batch_size,
        keep,
        extra,
        extra_without_sink=extra_without_sink,
        progress=progress,
    )
    return [_placed(done[i], i, windows) for i in range(len(windows.tokens))]


def _placed(line: dict, index: int, windows) -> dict:
    """A window's line with its document and position: lines written before they were
    recorded take them from the windows, which the settings guard keeps the same."""
    if "document" in line and "position" in line:
        return line
    place = {"document": int(windows.document[index]), "position": int(windows.position[index])}
    return {**line, **place}


def analyze_windows(
    module,
    params,
    windows,
    todo,
    spec,
    batch_size,
    keep,
    extra=None,
    timer=None,
    progress=True,
    extra_without_sink=None,
):
    """Windows `todo` through the model, `batch_size` at a time (split along the `data`
    axis of the parameters' mesh, or over the local devices without one); `keep(index,
    line)` gets each window's record as soon as its batch is done (so an interrupted run
    loses at most one batch). `extra` and `extra_without_sink` {name: weights per window
    (W, L, H)} add mixes (e.g. the cross-fitted optimum)."""
    total = len(windows.tokens)
    position = windowing.positions(windows.document)
    bar = tqdm.tqdm(
        total=total, initial=total - len(todo), desc="windows", unit="window", disable=not progress
    )
    with bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            tokens = pretrained.place_tokens(params, windows.tokens[batch])
            pick = lambda mixes, batch=batch: {k: v[batch] for k, v in (mixes or {}).items()}
            # The summary's baselines are computed once, not once per batch.
            measured = text.analyze_tokens(
                module,
                params,
                tokens,
                spec,
                timer,
                pick(extra),
                pick(extra_without_sink),
                with_baselines=False,
            )
            for b, index in enumerate(batch):
                line = {
                    "window": index,
                    "document": int(windows.document[index]),
                    "position": int(position[index]),
                }
                line.update(window_record(measured, b))
                keep(index, line)
            bar.update(len(batch))


def _settings(model, corpus_path, cspec, spec, dtype) -> dict:
    return {
        "model": str(model),
        "model_sha256": pretrained.fingerprint(model),
        "corpus": str(corpus_path),
        "corpus_sha256": windowing.fingerprint(corpus_path),
        "corpus_spec": dataclasses.asdict(cspec),
        "spec": dataclasses.asdict(spec),
        "dtype": dtype,
        "record_format": record.FORMAT,
    }


# Settings a rerun may change: they do not change a window's numbers.
_FREE = (
    "corpus_spec.batch_size",
    "corpus_spec.pruning",
    "corpus_spec.pruning_windows",
    "corpus_spec.pruning_points",
    "corpus_spec.max_windows",
    "corpus_spec.coalition_windows",
)


def _check_settings(out_dir: Path, wanted: dict) -> None:
    """A first run writes its settings; a rerun must match them but for `_FREE`, in the
    same record format. Settings written before the model's fingerprint was recorded take
    the model's as theirs."""
    path = out_dir / SETTINGS_FILE
    saved = None
    if path.exists():
        saved = _with_added_fields(files.read_json(path))
        _check_format(out_dir, saved.get("record_format", 1))
    settings.guard(
        path,
        wanted,
        f"{out_dir} holds a corpus analysis with other settings",
        "use another --out, or the old settings",
        free=lambda field: field in _FREE,
        saved=saved,
        defaults={"model_sha256": wanted["model_sha256"]},
    )


# Fields added to the settings after folders were written: such a folder was measured
# with their defaults (no coalitions).
_ADDED = {
    "spec": ("coalitions", "exact_coalition_heads", "permutations", "coalition_seed"),
    "corpus_spec": ("coalition_windows",),
}


def _with_added_fields(saved: dict) -> dict:
    """Saved settings with the defaults of the fields written before they existed."""
    out = dict(saved)
    for group, names in _ADDED.items():
        kind = measure.MeasureSpec if group == "spec" else CorpusSpec
        defaults = {f.name: f.default for f in dataclasses.fields(kind) if f.name in names}
        if isinstance(out.get(group), dict):
            out[group] = {**defaults, **out[group]}
    return out


def _check_format(out_dir: Path, found) -> None:
    """Windows recorded in another format of the per-layer record are refused, never read
    as this one (format 1 lacked fields every summary now reads)."""
    if found != record.FORMAT:
        raise ValueError(
            f"{out_dir} holds windows measured in record format {found}, this version "
            f"writes format {record.FORMAT}: use another --out (or remove {WINDOWS_FILE} "
            f"and {SETTINGS_FILE} there to measure them again)"
        )


def window_record(measured: dict, b: int) -> dict:
    """Window b's numbers out of a batch's record: per layer every per-window field, and
    the rollout's network fidelity and the first token's share."""
    layers = {str(k): _index(d, b) for k, d in measured["layers"].items()}
    share = measured["rollout"]["sink_share"][b]
    return {
        "layers": layers,
        "rollout": {"network_fidelity": float(share.min()), "first_token_share": float(share[0])},
    }


def _index(graph: dict, b: int) -> dict:
    """Window b's entries of a layer's record (and of its graph without the sink)."""
    out = {}
    for key, value in graph.items():
        if key in record.NOT_PER_SEQUENCE:
            continue
        out[key] = _index(value, b) if key == record.WITHOUT_SINK else _pick(value, b)
    return out


def _pick(tree, b):
    if isinstance(tree, dict):
        return {k: _pick(v, b) for k, v in tree.items()}
    return np.asarray(tree)[b].tolist()


def description(model, corpus_path, windows: windowing.Windows, cspec, spec) -> dict:
    return {
        "source": str(model),
        "corpus": str(corpus_path),
        "num_documents": windows.num_documents,
        "documents_used": windows.documents_used,
        "num_windows": int(len(windows.tokens)),
        "total_windows": windows.total_windows,
        "tokens_per_window": cspec.tokens,
        "dropped_tail_tokens": windows.dropped_tail_tokens,
        "short_documents": windows.short_documents,
        "corpus_spec": dataclasses.asdict(cspec),
        "spec": dataclasses.asdict(spec),
    }
