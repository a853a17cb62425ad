"""The attention a checkpoint's record carries for the study's page: its first evaluation
sequence (the same tokens for every run of a task: fixed by the evaluation seed), every
layer and head, with each token's flow to the sink for every head and for the learned
and uniform mixes (and the held-out optimum when searched), packed by `reports.packing`
as the analyses' views are, so that `reports.html` draws both alike. A record written
before it existed has no `KEY`: its page simply has no heatmap."""

from __future__ import annotations

import numpy as np

from beyondpar.measure import flow
from beyondpar.measure import record as schema
from beyondpar.reports import packing

KEY = "attention_view"  # in an evaluation record
SEQUENCE = 0  # the evaluation sequence shown: the first
NAME = "the first evaluation sequence"
# Attention bytes of one record before compression (gzip and base64 about cancel): the
# paper's 100 tokens with 16 heads in 4 layers fit whole (323 kB); 256 tokens are shown
# in blocks of 3.
BUDGET_BYTES = 2**19


def sequence_view(attn_LxHxTxT, tokens_T, mixes: dict, horizon: int) -> dict:
    """{sequence, labels, pool, layers: {"0": `packing.layer` view, ...}} of one sequence:
    its attention pooled to fit `BUDGET_BYTES`, and the flow of every head and of each
    mix {name: weights (L, H)} over `horizon` steps. Labels are the token ids."""
    attn = np.asarray(attn_LxHxTxT, np.float32)
    num_layers, num_heads, tokens = attn.shape[:3]
    pool = packing.pool_size(num_layers * num_heads, tokens, BUDGET_BYTES)
    layers = {}
    for layer in range(num_layers):
        weights = {name: np.asarray(w)[layer] for name, w in mixes.items()}
        heads, mixed = flow.layer_flows(attn[layer], weights, horizon)
        layers[str(layer)] = packing.layer(attn[layer], heads, mixed, pool)
    labels = packing.block_labels([str(int(t)) for t in np.asarray(tokens_T)], pool)
    return {"sequence": SEQUENCE, "labels": labels, "pool": pool, "layers": layers}


def first_sequence(attn_NxLxHxTxT, inputs_NxT, mixes: dict, horizon: int) -> dict:
    """The view of sequence `SEQUENCE` of an evaluation, with the learned mix, the uniform
    mix and the others of `mixes` {name: weights per sequence (N, L, H)}."""
    chosen = {name: np.asarray(w)[SEQUENCE] for name, w in mixes.items()}
    learned = chosen[schema.LEARNED]
    uniform = {schema.UNIFORM: np.full_like(learned, 1 / learned.shape[-1])}
    chosen = {schema.LEARNED: learned, **uniform, **chosen}
    attn = np.asarray(attn_NxLxHxTxT[SEQUENCE])
    return sequence_view(attn, np.asarray(inputs_NxT)[SEQUENCE], chosen, horizon)
