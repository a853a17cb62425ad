"""Pieces the model families share: causal attention that sows float32 probabilities,
Hugging Face's RMSNorm and half-split rotary embeddings."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def causal_attention(module: nn.Module, q_BxTxHxD, k_BxTxKxD, v_BxTxKxD, scale: float):
    """Softmax(q k^T * scale) v under a causal mask, query head h reading kv head h // (H/K).

    Scores and probabilities are float32 whatever the parameters' dtype (as Hugging Face's
    eager attention), and the probabilities (B, H, T, T) are sown as `attention`.
    """
    b, t, h, d = q_BxTxHxD.shape
    kv = k_BxTxKxD.shape[2]
    q = q_BxTxHxD.reshape(b, t, kv, h // kv, d).astype(jnp.float32)
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k_BxTxKxD.astype(jnp.float32)) * scale
    scores = scores.reshape(b, h, t, t)
    causal = jnp.tril(jnp.ones((t, t), bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(jnp.float32).min), axis=-1)
    module.sow("intermediates", "attention", probs)
    grouped = probs.reshape(b, kv, h // kv, t, t).astype(v_BxTxKxD.dtype)
    out = jnp.einsum("bkgqs,bskd->bqkgd", grouped, v_BxTxKxD)
    return out.reshape(b, t, h * d)


class RMSNorm(nn.Module):
    """x / rms(x) * scale, normalised in float32 and cast back before the scale (as HF)."""

    eps: float

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
        return scale * normed.astype(x.dtype)


def rotate_half_split(x_BxTxHxD, inv_freq_half: np.ndarray):
    """Rotary embedding of positions 0..T-1 with the feature halves paired (HF's layout)."""
    t = x_BxTxHxD.shape[1]
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * jnp.asarray(inv_freq_half, jnp.float32)
    angles = jnp.concatenate([angles, angles], -1)[None, :, None, :]
    cos, sin = jnp.cos(angles).astype(x_BxTxHxD.dtype), jnp.sin(angles).astype(x_BxTxHxD.dtype)
    x1, x2 = jnp.split(x_BxTxHxD, 2, axis=-1)
    return x_BxTxHxD * cos + jnp.concatenate([-x2, x1], -1) * sin
