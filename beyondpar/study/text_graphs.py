"""The attention graphs of a language model in training: at each evaluation, every
layer's heads on a few fixed held-out windows, measured by `measure.measure_layer`.

Logged per layer (numbered from 1, as the study's reports number them), each a mean over
the windows: the best head's minimax fidelity, the fidelity of the learned (output-
projection), uniform and held-out optimal mixes, each mix's wins (the share of windows on
which it beats that window's best head) and the heads' sink mass (attention on token 0).
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from beyondpar import measure
from beyondpar.measure import record
from beyondpar.study import evaluate

MIXES = (record.LEARNED, record.UNIFORM, record.OPTIMAL)


def measure_spec(evaluation: ml_collections.ConfigDict, num_heads: int) -> measure.MeasureSpec:
    """No pairwise synergy (H^2 operators); the optimum searched when there is a choice."""
    return measure.MeasureSpec(
        horizon=evaluation.horizon,
        max_steps=evaluation.max_steps,
        eps=evaluation.eps,
        pairwise=False,
        optimal_weights=num_heads > 1,
        folds=evaluation.folds,
    )


def graph_windows(heldout_windows_NxT1: np.ndarray, evaluation) -> np.ndarray:
    """The windows the graphs are measured on: the first few held-out ones' inputs, cut
    to `graph_tokens` tokens."""
    inputs = np.asarray(heldout_windows_NxT1)[:, :-1]
    return inputs[: evaluation.graph_windows, : evaluation.graph_tokens]


def layer_values(found: dict) -> dict[str, float]:
    """The logged means of one layer's `measure_layer` record."""
    best = np.asarray(found[record.BEST_HEAD_FIDELITY])
    out = {record.BEST_HEAD_FIDELITY: float(best.mean())}
    for mix in MIXES:
        fidelity = found["mixes"].get(mix, {}).get(record.FIDELITY)
        if fidelity is None:  # one head: the mixes are the head itself
            fidelity = best
        fidelity = np.asarray(fidelity)
        out[f"fidelity_{mix}"] = float(fidelity.mean())
        out[f"wins_{mix}"] = float((fidelity > best).mean())
    out[record.SINK_MASS.name] = float(np.asarray(found[record.SINK_MASS.name]).mean())
    return out


def graph_measures(module, params, windows_NxT, evaluation) -> dict[str, float]:
    """{"layer{l}/{name}": value} for every layer, l from 1."""
    params = jax.device_get(params)
    _, attn_NxLxHxTxT, weights_LxH = evaluate.forward(module, params, np.asarray(windows_NxT))
    attn, weights = np.asarray(attn_NxLxHxTxT), np.asarray(weights_LxH)
    spec = measure_spec(evaluation, attn.shape[2])
    out = {}
    for layer in range(attn.shape[1]):
        found = measure.measure_layer(attn[:, layer], weights[layer], spec)
        for name, value in layer_values(found).items():
            out[f"layer{layer + 1}/{name}"] = value
    return out
