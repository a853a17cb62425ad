"""What the report page draws for a few texts or windows: each head's attention, and every
token's flow to the sink (its node fidelity, max_t s_t[j]) for each head and each mix.

The page is one file that must stay small: attention is causal, so only the cells on and
below the diagonal are stored, one byte each (the square root of the probability, so that
small weights keep some resolution); a window longer than fits the byte budget is shown
in blocks of `pool` tokens (a block of keys sums its attention, a block of queries
averages it; a block's flow is its worst token's); every flow value keeps 3 significant
digits. The worst-served token of each operator
is kept exactly, at full resolution.
"""

from __future__ import annotations

import base64
import gzip

import jax.numpy as jnp
import numpy as np

from beyondpar import graphs, metrics, pretrained
from beyondpar.analysis import optimum
from beyondpar.reports import html

FILE = "views.json"  # beside a corpus summary
KEY = "views"  # in a text record (never written to analysis.json: the page holds it)
BUDGET_BYTES = 3 * 2**20  # attention bytes of every view together, before compression
MAX_VIEWS = 4
LEVELS = html.LEVELS  # one byte per cell: round(LEVELS * sqrt(probability))


def sig3(values) -> list:
    """Floats (nested lists) with 3 significant digits: the page shows no more."""
    return np.vectorize(lambda x: float(f"{x:.3g}"), otypes=[float])(values).tolist()


def pool_size(num_maps: int, tokens: int, budget: int) -> int:
    """The smallest block of tokens for which `num_maps` causal maps (their lower
    triangles) fit `budget` bytes."""
    pool = 1
    while num_maps * triangle(-(-tokens // pool)) > budget and pool < tokens:
        pool += 1
    return pool


def triangle(n: int) -> int:
    """Cells on and below the diagonal of an n x n map: all causal attention has."""
    return n * (n + 1) // 2


def pooled_attention(attn_HxTxT, pool: int) -> np.ndarray:
    """(H, T', T'): keys summed and queries averaged over blocks of `pool` tokens (the last
    block may be shorter), so that every row still sums to 1."""
    a = np.asarray(attn_HxTxT, np.float32)
    if pool == 1:
        return a
    edges = np.arange(0, a.shape[-1], pool)
    keys = np.add.reduceat(a, edges, axis=-1)
    counts = np.diff(np.append(edges, a.shape[-1]))
    return np.add.reduceat(keys, edges, axis=-2) / counts[:, None]


def encode(attn_HxTxT) -> str:
    """Causal attention -> one byte per cell on and below the diagonal (row by row, head
    after head; see `LEVELS`), gzipped (the browser inflates it with its own
    DecompressionStream: 40% fewer bytes), in base64."""
    a = np.asarray(attn_HxTxT, np.float64)
    rows, cols = np.tril_indices(a.shape[-1])
    q = np.rint(LEVELS * np.sqrt(np.clip(a[..., rows, cols], 0.0, 1.0)))
    packed = gzip.compress(q.astype(np.uint8).tobytes(), 9, mtime=0)
    return base64.b64encode(packed).decode("ascii")


def decode(text: str, shape) -> np.ndarray:
    """The inverse of `encode` (zeros above the diagonal), up to its rounding."""
    *heads, n, _ = shape
    q = np.frombuffer(gzip.decompress(base64.b64decode(text)), np.uint8).reshape(
        *heads, triangle(n)
    )
    out = np.zeros(shape)
    rows, cols = np.tril_indices(n)
    out[..., rows, cols] = (q.astype(np.float64) / LEVELS) ** 2
    return out


def block_min(values_xT, pool: int) -> np.ndarray:
    """Each block's smallest value: a block is as well served as its worst token."""
    v = np.asarray(values_xT, np.float64)
    return v if pool == 1 else np.minimum.reduceat(v, np.arange(0, v.shape[-1], pool), axis=-1)


def flow(phi_xT, pool: int) -> dict:
    """One operator's (or each head's) flow to the sink: per (pooled) token, the worst
    token and its value at full precision."""
    phi = np.asarray(phi_xT, np.float64)
    worst = phi.argmin(-1)
    return {
        "values": sig3(block_min(phi, pool)),
        "worst_token": worst.tolist(),
        "worst_value": np.take_along_axis(phi, worst[..., None], -1)[..., 0].tolist(),
    }


def layer_view(attn_HxTxT, mixes: dict, horizon: int, pool: int) -> dict:
    """A layer's attention (pooled, encoded) and the flow of each head and each mix
    {name: weights (H,)}."""
    attn = jnp.asarray(attn_HxTxT, jnp.float32)
    heads = np.asarray(metrics.node_fidelity(attn, horizon))
    mixed = {
        name: np.asarray(metrics.node_fidelity(graphs.combine_heads(attn, jnp.asarray(w)), horizon))
        for name, w in mixes.items()
    }
    pooled = pooled_attention(attn, pool)
    return {
        "attention": encode(pooled),
        "shape": list(pooled.shape),
        "heads": flow(heads, pool),
        "mixes": {name: flow(phi, pool) for name, phi in mixed.items()},
    }


def block_labels(labels: list[str], pool: int) -> list[str]:
    """A token's text, or a block's first token and its positions."""
    if pool == 1:
        return list(labels)
    return [
        f"{i}-{min(i + pool, len(labels)) - 1} {labels[i]!r}" for i in range(0, len(labels), pool)
    ]


def count(num_windows: int, num_layers: int, num_heads: int, tokens: int) -> int:
    """How many windows' attention fit the budget unpooled (at least one, at most
    `MAX_VIEWS`)."""
    per_window = num_layers * num_heads * triangle(tokens)
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
    pool = pool_size(cells, tokens.shape[1], BUDGET_BYTES)
    views = [
        {"labels": block_labels(labels[b], pool), "pool": pool, "layers": {}}
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
