"""A released checkpoint of the paper cut to a shorter maximum length: the same weights
and file name, so evaluated as the paper's file is, on sequences of `max_len` tokens
(the cost of the attention metrics grows with the cube of the length)."""

from pathlib import Path

import numpy as np

from helpers.paths import DATA


def short_reference(
    folder: Path, name: str = "1_heads_cycle.npz", max_len: int = 16, layers: int | None = None
) -> Path:
    """folder/name: the released `name` with only its first `max_len` positions, and only
    its first `layers` layers when given (every one otherwise)."""
    state = dict(np.load(DATA / name))
    state["pos_emb.weight"] = state["pos_emb.weight"][:max_len]
    if layers is not None:
        state = {k: v for k, v in state.items() if _layer(k) < layers}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with open(path, "wb") as f:
        np.savez(f, **state)
    return path


def _layer(key: str) -> int:
    """The layer of a released state dict's key ("layers.3.attn..." is 3); -1 outside them."""
    parts = key.split(".")
    return int(parts[1]) if parts[0] == "layers" else -1
