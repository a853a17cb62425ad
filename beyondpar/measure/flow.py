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
    layer's attention, for mixes {name: head weights (H,)}: the heads and the mixes in
    one kernel call (one compilation per layer shape)."""
    attn = jnp.asarray(attn_HxTxT, jnp.float32)
    names = list(mixes)
    operators = attn
    if names:
        weights = jnp.stack([jnp.asarray(mixes[name], jnp.float32) for name in names])
        operators = jnp.concatenate([attn, graphs.combine_heads(attn, weights)])
    phi = np.asarray(metrics.node_fidelity(operators, horizon))
    num_heads = attn.shape[0]
    return phi[:num_heads], {name: phi[num_heads + i] for i, name in enumerate(names)}
