"""The coalitions of each layer's heads in a real-model analysis: the fidelity game (from
the per-layer measurement of every window) and the loss game (the model under head masks,
on the first windows), summarised per layer with intervals over windows.

Every interval of this summary comes from `intervals` below, the one place that names
the statistics used: the corpus bootstrap, over documents when the windows' documents
are known (windows of one document are not independent), as every corpus statistic."""

from __future__ import annotations

import numpy as np

from beyondpar.analysis import loss_pruning, statistics
from beyondpar.measure import MeasureSpec, coalition_game, record
from beyondpar.pruning import coalition_loss


def intervals(seed: int, documents=None, positions=None):
    """The interval over windows of every summary entry: {key: W or W x K values} ->
    {key: {"mean", "low", "high"}}, resampling the windows' `documents` (one id a window,
    in `positions` order; None: unknown) as `statistics.intervals` does. The games may
    cover only the first windows: their documents are the first ones."""

    def found(blocks: dict) -> dict:
        count = len(next(iter(blocks.values())))
        return statistics.intervals(
            blocks, seed, _first(documents, count), _first(positions, count)
        )

    return found


def _first(ids, count: int):
    return None if ids is None else list(ids)[:count]


def resampling(records: list[dict], played: int) -> dict:
    """How `intervals` resamples the games on the first `played` of the windows whose
    windows.jsonl `records` are given (statistics' description, with its sentence)."""
    documents, positions = statistics.window_documents(records[:played])
    return statistics.resampling(played, documents, positions).as_dict()


def loss_spec(spec: MeasureSpec) -> coalition_loss.LossGameSpec:
    """The loss game valued as the measurement values the fidelity game."""
    return coalition_loss.LossGameSpec(
        exact_heads=spec.exact_coalition_heads,
        permutations=spec.permutations,
        seed=spec.coalition_seed,
    )


def loss_games(module, params, tokens_WxT, layers, spec: MeasureSpec, progress=True) -> dict:
    """{layer: the loss game's COALITION fields (W, ...)} of each of `layers` on the
    windows `tokens_WxT` as next-token prediction (a bar per layer states its cost)."""
    batch = loss_pruning.next_token_batch(tokens_WxT)
    games = loss_spec(spec)
    return {
        layer: coalition_loss.layer_fields(module, params, batch, layer, games, progress)
        for layer in layers
    }


def fidelity_games(layer_rows: dict) -> dict:
    """{layer: the fidelity game's fields (W, ...)} from {layer: [each window's record of
    the layer]} (records with a `coalitions` entry)."""
    out = {}
    for layer, rows in layer_rows.items():
        names = rows[0][record.COALITIONS]
        out[layer] = {n: np.asarray([r[record.COALITIONS][n] for r in rows]) for n in names}
    return out


def summarize(fidelity: dict, loss: dict, seed: int, records: list[dict] | None = None) -> dict:
    """{layer (JSON key): {"fidelity": summary, "loss": summary}} (each a
    `coalition_game.summarize`, the loss where it was measured); intervals over the
    documents of the windows' `records` (windows.jsonl; None: windows independent)."""
    documents, positions = statistics.window_documents(records) if records else (None, None)
    over = intervals(seed, documents, positions)
    out = {}
    for layer, fields in fidelity.items():
        entry = {"fidelity": coalition_game.summarize(fields, "fidelity", over)}
        if layer in loss:
            entry["loss"] = coalition_game.summarize(loss[layer], "loss", over)
        out[str(layer)] = entry
    return out


def batch_games(layers: dict) -> dict:
    """{layer: the fidelity game's fields (B, ...)} of a batch's record {layer: record}."""
    return {
        int(layer): d[record.COALITIONS] for layer, d in layers.items() if record.COALITIONS in d
    }


def of_tokens(module, params, tokens_BxT, layers: dict, spec, seed: int, progress=True) -> dict:
    """The summary of sequences measured together (`layers`: their batch's record per
    layer), the loss game on the same sequences."""
    fidelity = batch_games(layers)
    loss = loss_games(module, params, tokens_BxT, list(fidelity), spec, progress)
    return summarize(fidelity, loss, seed)
