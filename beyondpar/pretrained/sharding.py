"""Which parameter splits along the mesh's `model` axis, and along which dimension.

Megatron's layout: the projections that make heads (q, k, v; fused qkv) and MLP
features (up, gate) split their output features, the projections that read them (the
attention output, the MLP down projection) their input features, so every device holds
whole heads and its share of the features; embeddings and output heads (tied or untied,
both vocab x hidden) split the vocabulary. A split happens only when the unit divides
evenly by the axis size (query heads, kv heads, features, vocabulary); otherwise, and
for norms and anything not named here, the parameter is replicated, which is always
correct, only not spread.
"""

from __future__ import annotations

from jax.sharding import PartitionSpec as P

from beyondpar.base.parallel import MODEL

# Flax module name -> (what its split dimension counts, "out" or "in" features).
SPLITS = {
    # Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 (Phi-3's fused qkv_proj and
    # gate_up_proj, not named, are replicated)
    "q_proj": ("heads", "out"),
    "k_proj": ("kv_heads", "out"),
    "v_proj": ("kv_heads", "out"),
    "o_proj": ("heads", "in"),
    "gate_proj": ("features", "out"),
    "up_proj": ("features", "out"),
    "down_proj": ("features", "in"),
    "embed_tokens": ("vocab", "rows"),
    "lm_head": ("vocab", "rows"),
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
