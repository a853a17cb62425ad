"""Pieces the model families share: causal (optionally windowed) attention that sows
float32 probabilities and takes a head mask, Hugging Face's RMSNorm, and rotary
embeddings with the feature halves paired, on all or the first part of each head."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def attention_mask(t: int, window: int | None) -> jax.Array:
    """(T, T) keys each query may read: j <= i, and i - j < window when one is set (a
    query reads itself and the window - 1 keys before it, as transformers' eager code)."""
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= i - j < window
    return jnp.asarray(allowed)


def causal_attention(
    module: nn.Module,
    q_BxTxHxD,
    k_BxTxKxD,
    v_BxTxKxD,
    scale: float,
    window: int | None = None,
    head_mask=None,
):
    """Softmax(q k^T * scale) v under a causal mask, query head h reading kv head h // (H/K).

    Scores and probabilities are float32 whatever the parameters' dtype (as Hugging Face's
    eager attention), and the probabilities (B, H, T, T) are sown as `attention`.
    `head_mask` (H,) or (B, H) scales each head's output before the output projection.
    """
    b, t, h, d = q_BxTxHxD.shape
    kv = k_BxTxKxD.shape[2]
    q = q_BxTxHxD.reshape(b, t, kv, h // kv, d).astype(jnp.float32)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k_BxTxKxD.astype(jnp.float32)) * scale
    scores = scores.reshape(b, h, t, t)
    allowed = attention_mask(t, window)
    probs = jax.nn.softmax(jnp.where(allowed, scores, jnp.finfo(jnp.float32).min), axis=-1)
    module.sow("intermediates", "attention", probs)
    grouped = probs.reshape(b, kv, h // kv, t, t).astype(v_BxTxKxD.dtype)
    out = jnp.einsum("bkgqs,bskd->bqkgd", grouped, v_BxTxKxD).reshape(b, t, h, -1)
    if head_mask is not None:
        out = out * jnp.broadcast_to(head_mask, (b, h)).astype(out.dtype)[:, None, :, None]
    return out.reshape(b, t, -1)


class RMSNorm(nn.Module):
    """x / rms(x) * scale, normalised in float32 and cast back before the scale (as HF)."""

    eps: float

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
        return scale * normed.astype(x.dtype)


def inverse_frequencies(theta: float, rotary_dim: int) -> np.ndarray:
    """(rotary_dim / 2,) rotation rates theta^(-2i / rotary_dim), in float64."""
    return 1.0 / theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)


def rotary_dim(head_dim: int, partial_factor: float) -> int:
    """Features per head that rotate: int(head_dim * factor), as transformers rounds it."""
    return int(head_dim * partial_factor)


def rotate_half_split(x_BxTxHxD, inv_freq_half: np.ndarray):
    """Rotary embedding of positions 0..T-1 with the feature halves paired (HF's layout).

    Only the first 2 * len(inv_freq_half) features of each head rotate; the rest pass
    through (partial rotary, as GPT-NeoX and `partial_rotary_factor` < 1).
    """
    t = x_BxTxHxD.shape[1]
    rot = 2 * len(inv_freq_half)
    x_rot, x_pass = x_BxTxHxD[..., :rot], x_BxTxHxD[..., rot:]
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * jnp.asarray(inv_freq_half, jnp.float32)
    angles = jnp.concatenate([angles, angles], -1)[None, :, None, :]
    cos, sin = jnp.cos(angles).astype(x_rot.dtype), jnp.sin(angles).astype(x_rot.dtype)
    x1, x2 = jnp.split(x_rot, 2, axis=-1)
    rotated = x_rot * cos + jnp.concatenate([-x2, x1], -1) * sin
    return jnp.concatenate([rotated, x_pass], -1) if x_pass.shape[-1] else rotated
