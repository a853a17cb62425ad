"""Which parameter splits along the mesh's `model` axis, and along which dimension.

Megatron's layout: the projections that make heads (q, k, v; fused qkv) and MLP
features (up, gate) split their output features, the projections that read them (the
attention output, the MLP down projection) their input features, so every device holds
whole heads and its share of the features; embeddings and output heads (tied or untied,
both vocab x hidden) split the vocabulary. A split happens only when the unit divides
evenly by the axis size (query heads, kv heads, features, vocabulary); otherwise, and
for norms (Gemma's q/k norms too) and anything not named here, the parameter is
replicated, which is always correct, only not spread.

Fused projections split as their rows are laid out. GPT-NeoX stores q, k, v per head, so
each device gets whole heads with their keys and values. Phi-3's are read in its own
grouped order (`phi3.row_order`): `qkv_proj` by kv head, so it splits by kv heads (whole
groups of query heads with their key and value head per device; replicated when the kv
heads do not divide), and `gate_up_proj` with gate and up features side by side, so each
device gets matching ones. GPT-2's `c_attn` stores all queries, then all keys, then all
values: its split gives whole heads but not a head's query, key and value on one device,
and XLA moves them after the projection (correct, only more traffic).
"""

from __future__ import annotations

from jax.sharding import PartitionSpec as P

from beyondpar.base.parallel import MODEL

# Flax module name -> (what its split dimension counts, "out" or "in" features).
SPLITS = {
    # Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 (and Phi-3's unfused ones)
    "q_proj": ("heads", "out"),
    "k_proj": ("kv_heads", "out"),
    "v_proj": ("kv_heads", "out"),
    "o_proj": ("heads", "in"),
    "gate_proj": ("features", "out"),
    "up_proj": ("features", "out"),
    "down_proj": ("features", "in"),
    "embed_tokens": ("vocab", "rows"),
    "lm_head": ("vocab", "rows"),
    # Phi-3, fused in `phi3.row_order`'s groups
    "qkv_proj": ("kv_heads", "out"),
    "gate_up_proj": ("features", "out"),
    # GPT-2
    "c_attn": ("heads", "out"),
    "c_proj": ("heads", "in"),
    "c_fc": ("features", "out"),
    "mlp_c_proj": ("features", "in"),
    "wte": ("vocab", "rows"),
    # GPT-NeoX
    "query_key_value": ("heads", "out"),
    "dense": ("heads", "in"),
    "dense_h_to_4h": ("features", "out"),
    "dense_4h_to_h": ("features", "in"),
    "embed_in": ("vocab", "rows"),
    "embed_out": ("vocab", "rows"),
}


def units(config) -> dict[str, int]:
    """How many of each split unit a model has."""
    return {
        "heads": config.num_heads,
        "kv_heads": getattr(config, "num_kv_heads", config.num_heads),
        "features": config.mlp_dim,
        "vocab": config.vocab_size,
    }


def partition_spec(keys: tuple[str, ...], ndim: int, config, model_size: int) -> P:
    """The PartitionSpec of the parameter at `keys` (module names, then the leaf name) on
    a mesh whose `model` axis has `model_size` devices."""
    *modules, leaf = keys
    split = SPLITS.get(modules[-1]) if modules else None
    if split is None or model_size == 1:
        return P()
    unit, side = split
    if units(config)[unit] % model_size:
        return P()
    if side == "rows" and leaf == "embedding":
        return P(MODEL, None)
    if side == "out" and leaf == "kernel":
        return P(*([None] * (ndim - 1)), MODEL)
    if side == "out" and leaf == "bias":
        return P(MODEL)
    if side == "in" and leaf == "kernel":
        return P(MODEL, *([None] * (ndim - 1)))
    return P()  # the bias of a projection that reads split features is whole
