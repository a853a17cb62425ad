"""Answers with their uncertainty: per layer, the mean and a 95% percentile-bootstrap
interval over windows of every metric of every head and mix, the share of windows where
each mix beats its best head, and the gain's interval.

A layer's hundreds of intervals come from two bootstrap calls, not one each: every call
seeds a fresh generator with the same seed, and its resampled window indices depend only
on the number of windows and of resamples, so columns bootstrapped together get the
numbers they get alone."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from beyondpar.measure import record

N_RESAMPLES = 2000
# Bytes of resampled values one batch of a bootstrap call holds: batches that stay in the
# cache make a layer's calls about twice as fast as one batch of all resamples.
_RESAMPLE_BYTES = 4 * 2**20


def interval(values, seed: int) -> dict:
    """Mean and 95% percentile-bootstrap interval over windows (axis 0) of each column of
    W x K values (lists), or of W values (floats)."""
    return intervals({None: values}, seed)[None]


def intervals(blocks: dict[Hashable, object], seed: int) -> dict[Hashable, dict]:
    """`interval` of every block (W or W x K values, the same W) by its key, float for
    float: blocks without spread (every window alike) or with one window have low = high
    = mean; the others share bootstrap calls."""
    arrays = {key: np.asarray(v, np.float64) for key, v in blocks.items()}
    windows = {len(x) for x in arrays.values()}
    if len(windows) > 1:
        counts = {key: len(x) for key, x in arrays.items()}
        raise ValueError(f"blocks must have one value per window each, got windows {counts}")
    out = {}
    for key, x in arrays.items():
        if len(x) < 2 or np.all(x == x[:1]):  # no spread: nothing to resample
            mean = x.mean(0).tolist()
            out[key] = {"mean": mean, "low": mean, "high": mean}
    spread = {key: x for key, x in arrays.items() if key not in out}
    # np.mean sums a resample's windows pairwise where they lie contiguous, as in a lone
    # column's own call, and one after another where the columns lie innermost, as in a
    # wider block's: each group is summed as its blocks were alone, float for float.
    lone = {key: x for key, x in spread.items() if x[0].size == 1}
    wide = {key: x for key, x in spread.items() if key not in lone}
    for group, mean in ((lone, _contiguous_mean), (wide, np.mean)):
        if group:
            out.update(_bootstrap_group(group, seed, mean))
    return {key: out[key] for key in arrays}


def _contiguous_mean(resampled, axis):
    """np.mean of the resamples with their windows contiguous, as a lone column has them:
    the resamples of several columns side by side have the columns innermost."""
    return np.mean(np.ascontiguousarray(resampled), axis=axis)


def _bootstrap_group(blocks: dict, seed: int, mean) -> dict:
    """Every block's interval from one bootstrap of their columns side by side."""
    columns = [x.reshape(len(x), -1) for x in blocks.values()]
    low, high = _percentile_bootstrap(np.concatenate(columns, axis=1), seed, mean)
    edges = np.cumsum([c.shape[1] for c in columns])[:-1]
    ends = zip(np.split(low, edges), np.split(high, edges), strict=True)
    out = {}
    for (key, x), (lo, hi) in zip(blocks.items(), ends, strict=True):
        shape = x.shape[1:]  # () for W values: floats, as `interval` gives them
        out[key] = {
            "mean": x.mean(0).tolist(),
            "low": lo.reshape(shape).tolist(),
            "high": hi.reshape(shape).tolist(),
        }
    return out


def _percentile_bootstrap(values_WxC, seed: int, mean):
    """Low and high (C,) of the 95% percentile-bootstrap interval of each column's `mean`,
    resampling windows with `np.random.default_rng(seed)` in batches that draw the same
    indices as one go (the contiguous copy of `_contiguous_mean` counted twice)."""
    from scipy import stats  # 0.8 s to import: only when an interval is asked for

    batch = int(np.clip(_RESAMPLE_BYTES // (2 * values_WxC.nbytes), 1, N_RESAMPLES))
    result = stats.bootstrap(
        (values_WxC,),
        mean,
        axis=0,
        confidence_level=0.95,
        n_resamples=N_RESAMPLES,
        batch=batch,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    return np.asarray(ci.low), np.asarray(ci.high)


def summarize(records: list[dict], seed: int = 0) -> dict:
    """Per layer: every field of every head and mix (mean, 95% CI over windows), best
    head, gains with the share of windows each mix wins, sink mass, diversity."""
    layers = {
        layer: _summarize_layer([r["layers"][layer] for r in records], seed)
        for layer in records[0]["layers"]
    }
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


def _summarize_layer(rows: list[dict], seed: int) -> dict:
    """One layer's summary: its graph, sink mass, and the graph without the sink tokens,
    from one set of bootstrap calls over all their columns."""
    graphs = {"full": rows}
    if record.WITHOUT_SINK in rows[0]:
        graphs[record.WITHOUT_SINK] = [r[record.WITHOUT_SINK] for r in rows]
    sink_mass = record.SINK_MASS.name
    blocks = {(sink_mass,): [r[sink_mass] for r in rows]}
    for name, graph_rows in graphs.items():
        blocks.update({(name, *key): v for key, v in _graph_blocks(graph_rows).items()})
    stat = intervals(blocks, seed)
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
