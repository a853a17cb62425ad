"""What the report page draws for a few texts or windows of a pretrained model: each
head's attention, and every token's flow to the sink (its node fidelity, max_t s_t[j])
for each head and each mix, packed small by `reports.packing` (one byte per causal cell,
pooled beyond `BUDGET_BYTES`)."""

from __future__ import annotations

import numpy as np

from beyondpar import pretrained
from beyondpar.analysis import optimum
from beyondpar.measure import flow
from beyondpar.reports import packing

FILE = "views.json"  # beside a corpus summary
KEY = "views"  # in a text record (never written to analysis.json: the page holds it)
BUDGET_BYTES = 3 * 2**20  # attention bytes of every view together, before compression
MAX_VIEWS = 4


def layer_view(attn_HxTxT, mixes: dict, horizon: int, pool: int) -> dict:
    """A layer's attention (pooled, encoded) and the flow of each head and each mix
    {name: weights (H,)}."""
    heads, mixed = flow.layer_flows(attn_HxTxT, mixes, horizon)
    return packing.layer(np.asarray(attn_HxTxT, np.float32), heads, mixed, pool)


def count(num_windows: int, num_layers: int, num_heads: int, tokens: int) -> int:
    """How many windows' attention fit the budget unpooled (at least one, at most
    `MAX_VIEWS`)."""
    per_window = num_layers * num_heads * packing.triangle(tokens)
    return max(1, min(MAX_VIEWS, num_windows, BUDGET_BYTES // max(1, per_window)))


def token_views(module, params, tokens_BxT, labels, horizon: int, extra=None, layers=None):
    """One view per sequence of `tokens_BxT` (labels: each sequence's token texts): per
    layer (of `layers`, default all), attention and flow for the learned mix, the uniform
    mix and any `extra` {name: weights (B, L, H)}."""
    tokens = np.asarray(tokens_BxT)
    cfg = module.config
    shown = range(cfg.num_layers) if layers is None else layers
    learned = np.asarray(pretrained.head_importances(module, params))
    cells = len(tokens) * len(shown) * cfg.num_heads
    pool = packing.pool_size(cells, tokens.shape[1], BUDGET_BYTES)
    views = [
        {"labels": packing.block_labels(labels[b], pool), "pool": pool, "layers": {}}
        for b in range(len(tokens))
    ]
    uniform = np.full(cfg.num_heads, 1.0 / cfg.num_heads, np.float32)
    for layer, attn in pretrained.layer_by_layer(module, params, tokens):
        if layer not in shown:
            continue
        attn = np.asarray(attn)
        for b, view in enumerate(views):
            mixes = {"learned": learned[layer], "uniform": uniform}
            mixes.update({name: np.asarray(w)[b, layer] for name, w in (extra or {}).items()})
            view["layers"][str(layer)] = layer_view(attn[b], mixes, horizon, pool)
    return views


def corpus_views(module, params, tokenizer, windows, spec, found=None) -> list[dict]:
    """Views of the first windows that fit the budget (`count`), named by window and
    document; with the corpus optimum `found`, each window's held-out optimal mix too."""
    cfg = module.config
    layers = range(cfg.num_layers) if spec.layers is None else spec.layers
    tokens = np.asarray(windows.tokens)
    n = count(len(tokens), len(layers), cfg.num_heads, tokens.shape[1])
    extra = {}
    if found is not None:
        weights = optimum.per_window(found, "weights", len(tokens), cfg.num_layers)
        extra["optimal"] = weights[:n]
    labels = [[tokenizer.decode([int(i)]) for i in row] for row in tokens[:n]]
    views = token_views(module, params, tokens[:n], labels, spec.horizon, extra, layers)
    for i, view in enumerate(views):
        view["name"] = f"window {i} (document {int(windows.document[i])})"
    return views
