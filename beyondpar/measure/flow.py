"""Each token's flow to the sink (its node fidelity, max_t s_t[j]) for every head of one
layer and for mixes of its heads: what a report page draws beside the layer's attention
(`reports.packing.layer` packs both). The study's evaluation and the real-model analyses
draw it alike, so it is computed here, once, below both."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from beyondpar import graphs, metrics


def layer_flows(attn_HxTxT, mixes: dict, horizon: int) -> tuple[np.ndarray, dict]:
    """(each head's node fidelity (H, T), {name: the mix's node fidelity (T,)}) of one
    layer's attention, for mixes {name: head weights (H,)}."""
    attn = jnp.asarray(attn_HxTxT, jnp.float32)
    heads = np.asarray(metrics.node_fidelity(attn, horizon))
    mixed = {
        name: np.asarray(metrics.node_fidelity(graphs.combine_heads(attn, jnp.asarray(w)), horizon))
        for name, w in mixes.items()
    }
    return heads, mixed
