"""The attention and flow a report page draws, in the few bytes a page can hold.

Attention is causal, so only the cells on and below the diagonal are stored, one byte
each (the square root of the probability, so that small weights keep some resolution:
a probability p comes back within `max_error(p)`), gzipped; a sequence longer than fits
a byte budget is shown in blocks of `pool` tokens (a block of keys sums its attention, a
block of queries averages it; a block's flow is its worst token's); every flow value
keeps 3 significant digits, and the worst-served token of each operator is kept exactly.
Plain arrays in, JSON-able values out: any workflow computes the numbers, this module
only packs them for `reports.html`.
"""

from __future__ import annotations

import base64
import gzip

import numpy as np

from beyondpar.reports import html

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


def max_error(p):
    """How far `decode` may put a probability p from its value: the square root is rounded
    to 1/(2 LEVELS), so |p' - p| = |s' - s| (s' + s) <= (sqrt(p) + 1/(4 LEVELS)) / LEVELS."""
    return (np.sqrt(np.clip(p, 0.0, 1.0)) + 0.25 / LEVELS) / LEVELS


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


def block_labels(labels: list[str], pool: int) -> list[str]:
    """A token's text, or a block's first token and its positions."""
    if pool == 1:
        return list(labels)
    return [
        f"{i}-{min(i + pool, len(labels)) - 1} {labels[i]!r}" for i in range(0, len(labels), pool)
    ]


def layer(attn_HxTxT, heads_phi_HxT, mixes_phi: dict, pool: int = 1) -> dict:
    """A layer's view: its attention (pooled, encoded), and the flow to the sink of each
    head and of each mix {name: node fidelity (T,)}."""
    pooled = pooled_attention(attn_HxTxT, pool)
    return {
        "attention": encode(pooled),
        "shape": list(pooled.shape),
        "heads": flow(heads_phi_HxT, pool),
        "mixes": {name: flow(phi, pool) for name, phi in mixes_phi.items()},
    }
