"""A corpus through a pretrained model: answers with their uncertainty.

Every window of T tokens goes through the model in batches, layer by layer (memory: one
layer of one batch), and its per-layer numbers are appended as one line to
`windows.jsonl`. A rerun with the same settings skips the windows already there; other
settings are refused, naming every differing field. The summary gives, per layer, the
mean and a 95% bootstrap confidence interval over windows of every metric of every head
and mix, the share of windows where each mix beats its best head and the gain's mean and
interval, beside uniform causal attention of the same length. With `pruning`, the
model's loss and next-token accuracy as heads are removed in each order, with areas.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from scipy import stats

from beyondpar import analysis, corpus, files, parallel, pretrained, synergy, workdir

WINDOWS_FILE = "windows.jsonl"
SETTINGS_FILE = "settings.json"
OPTIMAL_FILE = "optimal_weights.json"
SUMMARY_FILE = "corpus.json"
FIELDS = (
    "fidelity",
    "fidelity_median",
    "fidelity_p10",
    "hitting_time_reference",
    "hitting_time_normalized",
    "tv_mixing_time_normalized",
    "spectral_mixing_time_normalized",
)


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
    seed: int = 0

    def __post_init__(self):
        for name in ("batch_size", "pruning_windows", "pruning_points"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name} must be an integer >= 1, got {value!r}")


def run(model, corpus_path, cspec: CorpusSpec, spec, out_dir, dtype=None, progress=True):
    """Analyse every window not yet recorded, then summarise: (summary, windows)."""
    out_dir = Path(out_dir)
    docs = corpus.read_documents(corpus_path)
    module, params, tokenizer = pretrained.load(model, dtype)
    windows = corpus.make_windows(
        docs, tokenizer, cspec.tokens, cspec.max_windows, module.config.max_len
    )
    spec.check_length(cspec.tokens)
    wanted = _settings(model, corpus_path, cspec, spec, dtype)
    with workdir.lock(out_dir):
        _check_settings(out_dir, wanted)
        extra = _optimal(module, params, windows, spec, out_dir) if spec.optimal_weights else {}
        inner = dataclasses.replace(spec, optimal_weights=False)
        done = {r["window"]: r for r in files.read_json_lines(out_dir / WINDOWS_FILE, ("window",))}
        todo = [i for i in range(len(windows.tokens)) if i not in done]

        def keep(index, line):
            files.append_json_line(out_dir / WINDOWS_FILE, line)
            done[index] = line

        analyze_windows(
            module, params, windows, todo, inner, cspec.batch_size, keep, extra, progress=progress
        )
        records = [done[i] for i in range(len(windows.tokens))]
        summary = summarize(records, cspec.seed)
        summary.update(
            _description(model, corpus_path, windows, cspec, spec),
            baseline=analysis.baselines(cspec.tokens, spec),
        )
        if extra:
            summary["optimal_weights"] = {k: np.asarray(v).tolist() for k, v in extra.items()}
        if cspec.pruning:
            from beyondpar import pruning_lm

            summary["pruning"] = pruning_lm.corpus_curves(module, params, windows, cspec, spec)
        files.write_json(out_dir / SUMMARY_FILE, summary)
    return summary, windows


def analyze_windows(
    module, params, windows, todo, spec, batch_size, keep, extra=None, timer=None, progress=True
):
    """Windows `todo` through the model, `batch_size` at a time; `keep(index, line)` gets
    each window's record as soon as its batch is done (so an interrupted run loses at most
    one batch)."""
    total = len(windows.tokens)
    bar = tqdm.tqdm(
        total=total, initial=total - len(todo), desc="windows", unit="window", disable=not progress
    )
    with bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            tokens = _on_devices(windows.tokens[batch])
            record = analysis.analyze_tokens(module, params, tokens, spec, timer, extra=extra)
            for b, index in enumerate(batch):
                line = {"window": index, "document": int(windows.document[index])}
                line.update(window_record(record, b))
                keep(index, line)
            bar.update(len(batch))


def _settings(model, corpus_path, cspec, spec, dtype) -> dict:
    return {
        "model": str(model),
        "corpus": str(corpus_path),
        "corpus_sha256": corpus.fingerprint(corpus_path),
        "corpus_spec": dataclasses.asdict(cspec),
        "spec": dataclasses.asdict(spec),
        "dtype": dtype,
    }


def _check_settings(out_dir: Path, wanted: dict) -> None:
    """A first run writes its settings; a rerun must match them (batching and pruning
    may change: they do not change a window's numbers)."""
    path = out_dir / SETTINGS_FILE
    if not path.exists():
        files.write_json(path, wanted)
        return
    old = json.loads(path.read_text())
    free = (
        "corpus_spec.batch_size",
        "corpus_spec.pruning",
        "corpus_spec.pruning_windows",
        "corpus_spec.pruning_points",
        "corpus_spec.max_windows",
    )
    diff = {k: v for k, v in workdir.changes(old, wanted).items() if k not in free}
    if diff:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
        raise ValueError(
            f"{out_dir} holds a corpus analysis with other settings ({listed}); use another "
            "--out, or the old settings"
        )
    files.write_json(path, wanted)


def _on_devices(tokens_BxT):
    """Windows split over the local devices when the batch divides evenly."""
    mesh = parallel.data_mesh(jax.local_devices())
    if len(tokens_BxT) % mesh.size:
        return jnp.asarray(tokens_BxT)
    return jax.device_put(tokens_BxT, parallel.batch_sharded(mesh))


def _optimal(module, params, windows, spec, out_dir: Path) -> dict:
    """Optimal weights per layer (fidelity), searched once on the first batch of windows
    and kept in optimal_weights.json, so that every window is measured with the same mix."""
    path = out_dir / OPTIMAL_FILE
    if path.exists():
        return {"optimal": np.asarray(json.loads(path.read_text())["optimal"], np.float32)}
    tokens = windows.tokens[: min(8, len(windows.tokens))]
    found = []
    for _, attn in _layers(module, params, tokens):
        w, _ = synergy.optimal_weights(attn, "fidelity", horizon=spec.horizon)
        found.append(np.asarray(w))
    files.write_json(path, {"optimal": np.stack(found).tolist(), "windows": len(tokens)})
    return {"optimal": np.stack(found)}


def _layers(module, params, tokens):
    run = pretrained.layer_by_layer(module, params, tokens)
    for _ in range(module.config.num_layers):
        yield next(run)


def window_record(record: dict, b: int) -> dict:
    """Window b's numbers out of a batch record: per layer every per-window field, and the
    rollout's network fidelity and the first token's share."""
    layers = {str(k): _index(d, b) for k, d in record["layers"].items()}
    share = record["rollout"]["sink_share"][b]
    return {
        "layers": layers,
        "rollout": {"network_fidelity": float(share.min()), "first_token_share": float(share[0])},
    }


def _index(tree, b):
    if isinstance(tree, dict):
        return {k: _index(v, b) for k, v in tree.items() if k != "pairwise_synergy"}
    return np.asarray(tree)[b].tolist()


# ---------------------------------------------------------------- summary


def interval(values_WxK, seed: int) -> dict:
    """Mean and 95% percentile-bootstrap interval over windows (axis 0) of each column."""
    x = np.asarray(values_WxK, np.float64)
    mean = x.mean(0)
    if len(x) < 2:
        return {"mean": mean.tolist(), "low": mean.tolist(), "high": mean.tolist()}
    if np.all(x == x[:1]):  # no spread: the bootstrap would divide by zero
        return {"mean": mean.tolist(), "low": mean.tolist(), "high": mean.tolist()}
    result = stats.bootstrap(
        (x,),
        np.mean,
        axis=0,
        confidence_level=0.95,
        n_resamples=2000,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    return {
        "mean": mean.tolist(),
        "low": np.asarray(ci.low).tolist(),
        "high": np.asarray(ci.high).tolist(),
    }


def summarize(records: list[dict], seed: int = 0) -> dict:
    """Per layer: every field of every head and mix (mean, 95% CI over windows), best
    head, gains with the share of windows each mix wins, sink mass, diversity."""
    layers = {}
    for layer in records[0]["layers"]:
        rows = [r["layers"][layer] for r in records]
        layers[layer] = _summarize_graph(rows, seed)
        layers[layer]["sink_mass"] = interval([r["sink_mass"] for r in rows], seed)
        if "without_sink" in rows[0]:
            layers[layer]["without_sink"] = _summarize_graph(
                [r["without_sink"] for r in rows], seed
            )
    rollout = [
        [r["rollout"]["network_fidelity"], r["rollout"]["first_token_share"]] for r in records
    ]
    roll = interval(rollout, seed)
    return {
        "layers": layers,
        "rollout": {
            name: {k: v[i] for k, v in roll.items()}
            for i, name in enumerate(("network_fidelity", "first_token_share"))
        },
    }


def _summarize_graph(rows: list[dict], seed: int) -> dict:
    heads = {f: interval([r["heads"][f] for r in rows], seed) for f in FIELDS}
    mixes = {}
    for mix in rows[0]["mixes"]:
        values = {f: [r["mixes"][mix][f] for r in rows] for f in (*FIELDS, "gain")}
        stat = {f: _scalar(interval(np.asarray(v)[:, None], seed)) for f, v in values.items()}
        stat["wins_share"] = float(np.mean(np.asarray(values["gain"]) > 0))
        mixes[mix] = stat
    fid = np.asarray([r["heads"]["fidelity"] for r in rows])
    return {
        "heads": heads,
        "mixes": mixes,
        "best_head": int(np.argmax(fid.mean(0))),
        "best_head_fidelity": _scalar(
            interval(np.asarray([r["best_head_fidelity"] for r in rows])[:, None], seed)
        ),
        "head_diversity": _scalar(
            interval(np.asarray([r["head_diversity"] for r in rows])[:, None], seed)
        ),
        "cross_head_share_mean": _scalar(
            interval(np.asarray([r["cross_head_share_mean"] for r in rows])[:, None], seed)
        ),
    }


def _scalar(stat: dict) -> dict:
    return {k: v[0] for k, v in stat.items()}


def _description(model, corpus_path, windows: corpus.Windows, cspec, spec) -> dict:
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
