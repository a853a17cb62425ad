"""Answers with their uncertainty: per layer, the mean and a 95% percentile-bootstrap
interval over windows of every metric of every head and mix, the share of windows where
each mix beats its best head, and the gain's interval."""

from __future__ import annotations

import numpy as np
from scipy import stats

FIELDS = (
    "fidelity",
    "fidelity_median",
    "fidelity_p10",
    "hitting_time_reference",
    "hitting_time_normalized",
    "tv_mixing_time_normalized",
    "spectral_mixing_time_normalized",
)


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
