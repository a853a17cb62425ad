"""GPT-2 (model_type "gpt2") as Hugging Face stores it.

Conv1D weights are stored in x out (already a Flax kernel); c_attn holds q, k, v side by
side; learned positions; LayerNorm with bias; the output head is the token embedding, or
`lm_head.weight` when `tie_word_embeddings` is false.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax.numpy as jnp

from beyondpar.pretrained import layers
from beyondpar.pretrained.config_fields import field, one_of

MODEL_TYPES = ("gpt2",)

ACTIVATIONS = layers.ACTIVATIONS
# GPT2LMHeadModel saves the body as `transformer.*` and an untied head as `lm_head.*`; the
# original `gpt2` upload has no prefix.
CHECKPOINT_PREFIXES = ({}, {"lm_head.": "lm_head.", "": "transformer."})


@dataclasses.dataclass(frozen=True)
class Gpt2Config:
    vocab_size: int
    max_len: int
    embed_dim: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    activation: str
    eps: float
    scale_attn_weights: bool = True
    scale_by_inverse_layer_idx: bool = False
    tied: bool = True

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @classmethod
    def from_hf(cls, c: dict) -> Gpt2Config:
        embed, heads = field(c, "n_embd"), field(c, "n_head")
        if embed % heads:
            raise ValueError(f"config.json field 'n_head' must divide n_embd={embed}, got {heads}")
        if c.get("add_cross_attention"):
            raise ValueError("config.json field 'add_cross_attention' must be false, got true")
        return cls(
            vocab_size=field(c, "vocab_size"),
            max_len=field(c, "n_positions", default=field(c, "n_ctx", default=1024)),
            embed_dim=embed,
            num_layers=field(c, "n_layer"),
            num_heads=heads,
            mlp_dim=field(c, "n_inner", default=4 * embed),
            activation=one_of(
                "activation_function", c.get("activation_function", "gelu_new"), ACTIVATIONS
            ),
            eps=field(c, "layer_norm_epsilon", float, default=1e-5),
            scale_attn_weights=bool(c.get("scale_attn_weights", True)),
            scale_by_inverse_layer_idx=bool(c.get("scale_attn_by_inverse_layer_idx", False)),
            tied=bool(c.get("tie_word_embeddings", True)),
        )


class Gpt2Block(nn.Module):
    config: Gpt2Config
    layer_index: int = 0

    @nn.compact
    def __call__(self, x, head_mask=None):
        cfg = self.config
        b, t, d = x.shape
        h = nn.LayerNorm(epsilon=cfg.eps, name="ln_1")(x)
        qkv = nn.Dense(3 * d, name="c_attn")(h).reshape(b, t, 3, cfg.num_heads, cfg.head_dim)
        scale = 1 / math.sqrt(cfg.head_dim) if cfg.scale_attn_weights else 1.0
        if cfg.scale_by_inverse_layer_idx:
            scale /= self.layer_index + 1
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        attn = layers.causal_attention(self, q, k, v, scale, head_mask=head_mask)
        x = x + nn.Dense(d, name="c_proj")(attn)
        h = nn.LayerNorm(epsilon=cfg.eps, name="ln_2")(x)
        h = ACTIVATIONS[cfg.activation](nn.Dense(cfg.mlp_dim, name="c_fc")(h))
        return x + nn.Dense(d, name="mlp_c_proj")(h)


class Gpt2(nn.Module):
    """tokens (B, T) -> logits (B, T, V); attention of every layer sown."""

    config: Gpt2Config
    layer_prefix = "h"

    def setup(self):
        cfg = self.config
        self.wte = nn.Embed(cfg.vocab_size, cfg.embed_dim)
        self.wpe = nn.Embed(cfg.max_len, cfg.embed_dim)
        self.h = [Gpt2Block(cfg, i) for i in range(cfg.num_layers)]
        self.ln_f = nn.LayerNorm(epsilon=cfg.eps)
        if not cfg.tied:
            self.lm_head = nn.Embed(cfg.vocab_size, cfg.embed_dim)

    def embed(self, tokens_BxT):
        return self.wte(tokens_BxT) + self.wpe(jnp.arange(tokens_BxT.shape[-1]))

    def unembed(self, x):
        return (self.wte if self.config.tied else self.lm_head).attend(self.ln_f(x))

    def __call__(self, tokens_BxT, head_mask=None):
        x = self.embed(tokens_BxT)
        for i, block in enumerate(self.h):
            x = block(x, None if head_mask is None else head_mask[..., i, :])
        return self.unembed(x)


def block_module(config: Gpt2Config, index: int) -> Gpt2Block:
    """Layer `index` alone, to run the network one layer at a time."""
    return Gpt2Block(config, index if config.scale_by_inverse_layer_idx else 0)


def hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """Hugging Face tensor name of a parameter path, and whether it needs a transpose."""
    leaf = {"kernel": "weight", "scale": "weight", "bias": "bias", "embedding": "weight"}
    *mods, param = path
    if mods == ["lm_head"]:
        return "lm_head.weight", False  # an Embed: vocab x hidden, as stored
    if mods[-1] == "mlp_c_proj":
        mods = [*mods[:-1], "mlp", "c_proj"]
    elif mods[-1] in ("c_attn", "c_proj"):
        mods = [*mods[:-1], "attn", mods[-1]]
    elif mods[-1] == "c_fc":
        mods = [*mods[:-1], "mlp", "c_fc"]
    name = ".".join(m.replace("h_", "h.", 1) if m.startswith("h_") else m for m in mods)
    return f"{name}.{leaf[param]}", False  # Conv1D is stored in x out, like a Flax kernel


def out_kernel(params, layer: int):
    """The attention output projection of a layer as a Dense kernel (in x out)."""
    return params[f"h_{layer}"]["c_proj"]["kernel"]


def build(config: dict) -> Gpt2:
    return Gpt2(Gpt2Config.from_hf(config))


def gguf_config(source) -> dict:
    """The config.json of a gpt2 GGUF file (`source`: a GgufFile)."""
    return {
        "model_type": "gpt2",
        "vocab_size": source.arch_value("vocab_size", len(source.value("tokenizer.ggml.tokens"))),
        "n_positions": source.arch_value("context_length"),
        "n_embd": source.arch_value("embedding_length"),
        "n_layer": source.arch_value("block_count"),
        "n_head": source.arch_value("attention.head_count"),
        "n_inner": source.arch_value("feed_forward_length"),
        "layer_norm_epsilon": source.arch_value("attention.layer_norm_epsilon"),
        "activation_function": "gelu_new",
        "tie_word_embeddings": "output.weight" not in source.tensors,
    }
