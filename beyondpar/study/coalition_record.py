"""The coalitions of each layer's heads in an evaluation record: the fidelity game from
the per-layer measurement and the loss game from the model under head masks, summarised
per layer over the evaluation sequences (95% normal intervals over sequences)."""

from __future__ import annotations

import numpy as np

from beyondpar.measure import coalition_game
from beyondpar.pruning import coalition_loss


def layer_games(module, params, examples, fidelity_NxL: dict, seed: int, progress=False) -> dict:
    """{layer (0-based, as a JSON key): {"fidelity": summary, "loss": summary}}, each a
    `coalition_game.summarize`; `fidelity_NxL` the measurement's COALITION fields with
    sequences and layers leading (N, L, ...)."""
    spec = coalition_loss.LossGameSpec(seed=seed)
    out = {}
    for layer in range(module.config.num_layers):
        fidelity = {name: np.asarray(v)[:, layer] for name, v in fidelity_NxL.items()}
        loss = coalition_loss.layer_fields(module, params, examples, layer, spec, progress)
        out[str(layer)] = {
            "fidelity": coalition_game.summarize(
                fidelity, "fidelity", coalition_game.normal_intervals
            ),
            "loss": coalition_game.summarize(loss, "loss", coalition_game.normal_intervals),
        }
    return out
