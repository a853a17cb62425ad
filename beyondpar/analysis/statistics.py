"""Answers with their uncertainty: per layer, the mean over windows and a 95% percentile-
bootstrap interval of every metric of every head and mix, the share of windows where each
mix beats its best head, and the gain's interval.

Windows are cut consecutively from a few documents, so they are not independent: an
interval that resampled windows would be too narrow. Every interval here resamples
documents instead (a cluster bootstrap: a drawn document brings all its windows, and a
resample's value is the mean over its windows, as the point estimate is), or, with fewer
than two documents, blocks of consecutive windows (a circular block bootstrap, blocks of
ceil(n^(1/3)) windows). Windows whose documents are unknown are resampled one by one.

A layer's hundreds of intervals come from one call: the resampled units depend only on
the seed and the documents, never on the columns, so columns bootstrapped together get
the intervals they get alone (to rounding)."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

import numpy as np

from beyondpar.measure import record

N_RESAMPLES = 2000
CONFIDENCE = 0.95
# With fewer documents than this, an interval describes these documents only.
FEW_DOCUMENTS = 10
CLUSTER = "cluster bootstrap"
BLOCK = "circular block bootstrap"
WINDOW = "window bootstrap"
# Bytes of one batch of resample counts (resamples x units): bounds memory for long
# documents, and depends only on the units, so the draws never depend on the columns.
_COUNT_BYTES = 8 * 2**20


@dataclasses.dataclass(frozen=True)
class Resampling:
    """How the windows are resampled: `units` independent draws a resample, each of one
    `unit` (documents; blocks of `block_length` consecutive windows; windows)."""

    method: str
    unit: str
    units: int
    windows: int
    documents: int | None  # None: not recorded
    block_length: int = 1

    def text(self) -> str:
        """One sentence for a report: the method, over how many units, and its scope."""
        windows = _count(self.windows, "window")
        if self.method == WINDOW:
            return (
                f"bootstrap over {windows} treated as independent (their documents are not "
                "recorded), so the intervals may be too narrow."
            )
        if self.method == CLUSTER:
            line = (
                f"cluster bootstrap over {self.documents} documents ({windows}): each "
                "resample draws documents with replacement, all windows of a drawn "
                "document together."
            )
        else:
            line = (
                f"circular block bootstrap over the {windows} of 1 document: each resample "
                f"draws {_count(self.units, 'block')} of "
                f"{_count(self.block_length, 'consecutive window')}."
            )
        if self.documents < FEW_DOCUMENTS:
            these = "this document" if self.documents == 1 else "these documents"
            line += (
                f" With fewer than {FEW_DOCUMENTS} documents the intervals describe {these} "
                "only, not other texts of their kind."
            )
        return line

    def as_dict(self) -> dict:
        """For corpus.json: the fields, the confidence, the resamples and the sentence."""
        return {
            **dataclasses.asdict(self),
            "confidence": CONFIDENCE,
            "resamples": N_RESAMPLES,
            "text": self.text(),
        }


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def block_length(windows: int) -> int:
    """Windows a block of the block bootstrap: ceil(n^(1/3)) for n windows, the usual
    order for the mean of a dependent series, but at most n // 2 (so that two windows
    are still two blocks) and at least 1."""
    length = 1
    while length**3 < windows:
        length += 1
    return max(1, min(length, windows // 2))


def resampling(windows: int, documents=None, positions=None) -> Resampling:
    """How `windows` windows of `documents` (one id a window; None: unknown) are
    resampled: by documents when there are two or more, else by blocks of consecutive
    windows in `positions` order (default: the order given)."""
    return _plan(windows, documents, positions)[0]


def _plan(windows: int, documents, positions) -> tuple[Resampling, np.ndarray]:
    """The resampling, and per window its document's index (cluster, window bootstrap)
    or the windows in document order (blocks)."""
    if documents is None:
        return Resampling(WINDOW, "windows", windows, windows, None), np.arange(windows)
    documents = np.asarray(documents)
    if documents.shape != (windows,):
        raise ValueError(
            f"documents must name one document per window, {windows} in all, got shape "
            f"{documents.shape}"
        )
    names, owner = np.unique(documents, return_inverse=True)
    if len(names) >= 2:
        return Resampling(CLUSTER, "documents", len(names), windows, len(names)), owner
    if positions is None:
        order = np.arange(windows)
    else:
        positions = np.asarray(positions)
        if positions.shape != (windows,):
            raise ValueError(
                f"positions must give one position per window, {windows} in all, got shape "
                f"{positions.shape}"
            )
        order = np.argsort(positions, kind="stable")
    length = block_length(windows)
    blocks = -(-windows // length)
    return Resampling(BLOCK, "blocks", blocks, windows, 1, length), order


def _resample_counts(plan: Resampling, seed: int):
    """Batches (resamples x slots) of how often each slot is drawn: a document (cluster,
    window bootstrap) or a window in document order (blocks, the last one cut so that a
    resample holds exactly as many windows as the data)."""
    rng = np.random.default_rng(seed)
    slots = plan.windows if plan.method == BLOCK else plan.units
    batch = int(np.clip(_COUNT_BYTES // (8 * slots), 1, N_RESAMPLES))
    for start in range(0, N_RESAMPLES, batch):
        size = min(batch, N_RESAMPLES - start)
        if plan.method == BLOCK:
            starts = rng.integers(0, slots, (size, plan.units))
            runs = (starts[:, :, None] + np.arange(plan.block_length)) % slots
            drawn = runs.reshape(size, -1)[:, :slots]
        else:
            drawn = rng.integers(0, slots, (size, slots))
        flat = (drawn + slots * np.arange(size)[:, None]).ravel()
        counts = np.bincount(flat, minlength=size * slots).reshape(size, slots)
        yield counts.astype(np.float64)


def resample_means(values, seed: int, documents=None, positions=None) -> np.ndarray:
    """The N_RESAMPLES bootstrap means (R, or R x K for W x K values) of the windows'
    values: each resample's mean over all its windows, as the point estimate weighs them."""
    x = np.asarray(values, np.float64)
    plan, index = _plan(len(x), documents, positions)
    return _means(x.reshape(len(x), -1), plan, index, seed).reshape(-1, *x.shape[1:])


def _means(values_WxC, plan: Resampling, index, seed: int) -> np.ndarray:
    """R x C resample means: counts of each slot times its sum, over counts times its
    number of windows."""
    if plan.method == BLOCK:
        sums, sizes = values_WxC[index], np.ones(len(index))
    else:
        sums = np.zeros((plan.units, values_WxC.shape[1]))
        np.add.at(sums, index, values_WxC)
        sizes = np.bincount(index, minlength=plan.units).astype(np.float64)
    means = [(c @ sums) / (c @ sizes)[:, None] for c in _resample_counts(plan, seed)]
    return np.concatenate(means)


def interval(values, seed: int, documents=None, positions=None) -> dict:
    """Mean and 95% bootstrap interval over windows (axis 0) of each column of W x K
    values (lists), or of W values (floats); `documents` and `positions` as in
    `resampling`."""
    return intervals({None: values}, seed, documents, positions)[None]


def cluster_interval(values_W, clusters_W, seed: int, positions_W=None) -> dict:
    """The interval of values whose windows come from documents `clusters_W` (any ids),
    with how it was found: {mean, low, high, method, unit, units, text}. The public door
    for every analysis that needs an interval over windows of documents."""
    stat = interval(values_W, seed, clusters_W, positions_W)
    plan = resampling(len(np.asarray(values_W)), clusters_W, positions_W)
    return {
        **stat,
        "method": plan.method,
        "unit": plan.unit,
        "units": plan.units,
        "text": plan.text(),
    }


def intervals(
    blocks: dict[Hashable, object], seed: int, documents=None, positions=None
) -> dict[Hashable, dict]:
    """`interval` of every block (W or W x K values, the same W) by its key, float for
    float, from one set of resamples: the means are each block's own, and columns without
    spread (every window alike) and every column of a single window have low = high =
    mean."""
    arrays = {key: np.asarray(v, np.float64) for key, v in blocks.items()}
    windows = {len(x) for x in arrays.values()}
    if len(windows) > 1:
        counts = {key: len(x) for key, x in arrays.items()}
        raise ValueError(f"blocks must have one value per window each, got windows {counts}")
    (count,) = windows
    plan, index = _plan(count, documents, positions)
    means = {key: x.mean(0) for key, x in arrays.items()}
    columns = np.concatenate([x.reshape(count, -1) for x in arrays.values()], axis=1)
    low = high = np.concatenate([np.ravel(m) for m in means.values()])
    flat = (columns == columns[:1]).all(0) if count > 1 else np.ones(len(low), bool)
    if not flat.all():
        spread = _means(columns[:, ~flat], plan, index, seed)
        tail = 100 * (1 - CONFIDENCE) / 2
        low, high = low.copy(), high.copy()
        low[~flat], high[~flat] = np.percentile(spread, [tail, 100 - tail], axis=0)
    edges = np.cumsum([np.size(m) for m in means.values()])[:-1]
    ends = zip(np.split(low, edges), np.split(high, edges), strict=True)
    out = {}
    for (key, mean), (lo, hi) in zip(means.items(), ends, strict=True):
        shape = np.shape(mean)  # () for W values: floats, as `interval` gives them
        out[key] = {
            "mean": mean.tolist(),
            "low": lo.reshape(shape).tolist(),
            "high": hi.reshape(shape).tolist(),
        }
    return out


def window_documents(records: list[dict]) -> tuple[list | None, list | None]:
    """The windows' documents and positions in them (from their windows.jsonl records),
    None where a record lacks them."""
    documents = [r.get("document") for r in records]
    positions = [r.get("position") for r in records]
    if any(d is None for d in documents):
        return None, None
    return documents, None if any(p is None for p in positions) else positions


def summarize(records: list[dict], seed: int = 0) -> dict:
    """Per layer: every field of every head and mix (mean, 95% interval over windows,
    resampled by their `document`s, in order of `position`), best head, gains with the
    share of windows each mix wins, sink mass, diversity; and how it was resampled."""
    documents, positions = window_documents(records)
    layers = {
        layer: _summarize_layer([r["layers"][layer] for r in records], seed, documents, positions)
        for layer in records[0]["layers"]
    }
    rollout = [
        [r["rollout"]["network_fidelity"], r["rollout"]["first_token_share"]] for r in records
    ]
    roll = interval(rollout, seed, documents, positions)
    return {
        "layers": layers,
        "rollout": {
            name: {k: v[i] for k, v in roll.items()}
            for i, name in enumerate(("network_fidelity", "first_token_share"))
        },
        "intervals": resampling(len(records), documents, positions).as_dict(),
    }


def _summarize_layer(rows: list[dict], seed: int, documents, positions) -> dict:
    """One layer's summary: its graph, sink mass, and the graph without the sink tokens,
    from one bootstrap over all their columns."""
    graphs = {"full": rows}
    if record.WITHOUT_SINK in rows[0]:
        graphs[record.WITHOUT_SINK] = [r[record.WITHOUT_SINK] for r in rows]
    sink_mass = record.SINK_MASS.name
    blocks = {(sink_mass,): [r[sink_mass] for r in rows]}
    for name, graph_rows in graphs.items():
        blocks.update({(name, *key): v for key, v in _graph_blocks(graph_rows).items()})
    stat = intervals(blocks, seed, documents, positions)
    out = {}
    for name, graph_rows in graphs.items():
        graph_stat = {key[1:]: v for key, v in stat.items() if key[0] == name}
        out[name] = _summarize_graph(graph_rows, graph_stat)
    layer = out.pop("full")
    layer[sink_mass] = stat[sink_mass,]
    layer.update(out)
    return layer


def _graph_blocks(rows: list[dict]) -> dict[tuple, list]:
    """A graph's values over windows by key: W x H per head field, W per scalar."""
    blocks = {("heads", f): [r["heads"][f] for r in rows] for f in record.OPERATOR_FIELDS}
    for mix in rows[0]["mixes"]:
        for f in record.MIX_FIELDS:
            blocks["mixes", mix, f] = [r["mixes"][mix][f] for r in rows]
    blocks.update({(name,): [r[name] for r in rows] for name in record.LAYER_SCALARS})
    return blocks


def _summarize_graph(rows: list[dict], stat: dict[tuple, dict]) -> dict:
    """A graph's summary from `stat`, the intervals of its `_graph_blocks`."""
    mixes = {}
    for mix in rows[0]["mixes"]:
        mixes[mix] = {f: stat["mixes", mix, f] for f in record.MIX_FIELDS}
        gains = np.asarray([r["mixes"][mix][record.GAIN.name] for r in rows])
        mixes[mix]["wins_share"] = float(np.mean(gains > 0))
    fid = np.asarray([r["heads"]["fidelity"] for r in rows])
    return {
        "heads": {f: stat["heads", f] for f in record.OPERATOR_FIELDS},
        "mixes": mixes,
        "best_head": int(np.argmax(fid.mean(0))),
        **{name: stat[name,] for name in record.LAYER_SCALARS},
    }
