"""Llama, Mistral and Qwen2 (one architecture, as Hugging Face stores it).

RMSNorm, SwiGLU, rotary embeddings with the feature halves paired, grouped-query
attention (query head h reads kv head h // (H / H_kv)); q/k/v biases for Qwen2 or when
`attention_bias` is set; tied or separate output head; explicit `head_dim` honoured.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import numpy as np

from beyondpar.pretrained import layers
from beyondpar.pretrained.config_fields import field, one_of

MODEL_TYPES = ("llama", "mistral", "qwen2")
ROPE_TYPES = ("default", "llama3")
ACTIVATIONS = {"silu": jax.nn.silu, "swish": jax.nn.silu, "gelu": jax.nn.gelu}


@dataclasses.dataclass(frozen=True)
class Rope:
    theta: float = 10000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192

    @classmethod
    def from_hf(cls, c: dict) -> Rope:
        """`rope_parameters` (transformers 5) or `rope_scaling` + top-level `rope_theta`."""
        params = c.get("rope_parameters") or c.get("rope_scaling") or {}
        theta = params.get("rope_theta", c.get("rope_theta", 10000.0))
        kind = one_of(
            "rope_type", params.get("rope_type", params.get("type", "default")), ROPE_TYPES
        )
        if float(c.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ValueError(
                "config.json field 'partial_rotary_factor' must be 1.0, "
                f"got {c['partial_rotary_factor']!r}"
            )
        if kind == "default":
            return cls(theta=float(theta))
        return cls(
            theta=float(theta),
            kind=kind,
            factor=field(params, "factor", float),
            low_freq_factor=field(params, "low_freq_factor", float),
            high_freq_factor=field(params, "high_freq_factor", float),
            original_max_len=field(params, "original_max_position_embeddings"),
        )

    def inverse_frequencies(self, head_dim: int) -> np.ndarray:
        """(head_dim / 2,) rotation rates; `llama3` slows the long wavelengths smoothly."""
        exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
        inv = 1.0 / self.theta**exponents
        if self.kind == "llama3":
            wavelen = 2 * math.pi / inv
            low_wavelen = self.original_max_len / self.low_freq_factor
            high_wavelen = self.original_max_len / self.high_freq_factor
            scaled = np.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = (self.original_max_len / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            inv = np.where(medium, smoothed, scaled)
        return inv.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    model_type: str
    vocab_size: int
    max_len: int
    embed_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    eps: float
    rope: Rope
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    tied: bool = False
    activation: str = "silu"
    sliding_window: int | None = None

    @classmethod
    def from_hf(cls, c: dict) -> LlamaConfig:
        kind = one_of("model_type", c.get("model_type"), MODEL_TYPES)
        embed, heads = field(c, "hidden_size"), field(c, "num_attention_heads")
        kv = field(c, "num_key_value_heads", default=heads)
        if heads % kv:
            raise ValueError(
                f"config.json field 'num_key_value_heads' must divide num_attention_heads={heads}, "
                f"got {kv}"
            )
        head_dim = field(c, "head_dim", default=None)
        if head_dim is None:
            if embed % heads:
                raise ValueError(
                    f"config.json field 'num_attention_heads' must divide hidden_size={embed} "
                    f"when head_dim is not given, got {heads}"
                )
            head_dim = embed // heads
        bias = bool(c.get("attention_bias", False))
        return cls(
            model_type=kind,
            vocab_size=field(c, "vocab_size"),
            max_len=field(c, "max_position_embeddings"),
            embed_dim=embed,
            num_layers=field(c, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            mlp_dim=field(c, "intermediate_size"),
            eps=field(c, "rms_norm_eps", float, default=1e-6),
            rope=Rope.from_hf(c),
            qkv_bias=bias or kind == "qwen2",
            out_bias=bias and kind != "qwen2",
            mlp_bias=bool(c.get("mlp_bias", False)),
            tied=bool(c.get("tie_word_embeddings", False)),
            activation=one_of("hidden_act", c.get("hidden_act", "silu"), ACTIVATIONS),
            sliding_window=_sliding_window(c, kind),
        )


def _sliding_window(c: dict, kind: str) -> int | None:
    """The window attention is limited to, when the config turns one on."""
    if kind == "qwen2" and not c.get("use_sliding_window", False):
        return None
    window = c.get("sliding_window")
    return None if window is None else int(window)


class LlamaBlock(nn.Module):
    config: LlamaConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        b, t, _ = x.shape
        if cfg.sliding_window is not None and t > cfg.sliding_window:
            raise ValueError(
                f"text length must be <= config.json field 'sliding_window'="
                f"{cfg.sliding_window} (windowed attention is not supported), got {t} tokens"
            )
        h = layers.RMSNorm(cfg.eps, name="input_layernorm")(x)
        heads = lambda n, name: nn.Dense(n * cfg.head_dim, use_bias=cfg.qkv_bias, name=name)(
            h
        ).reshape(b, t, n, cfg.head_dim)
        inv_freq = cfg.rope.inverse_frequencies(cfg.head_dim)
        q = layers.rotate_half_split(heads(cfg.num_heads, "q_proj"), inv_freq)
        k = layers.rotate_half_split(heads(cfg.num_kv_heads, "k_proj"), inv_freq)
        v = heads(cfg.num_kv_heads, "v_proj")
        attn = layers.causal_attention(self, q, k, v, 1 / math.sqrt(cfg.head_dim))
        x = x + nn.Dense(cfg.embed_dim, use_bias=cfg.out_bias, name="o_proj")(attn)
        h = layers.RMSNorm(cfg.eps, name="post_attention_layernorm")(x)
        dense = lambda n, name: nn.Dense(n, use_bias=cfg.mlp_bias, name=name)
        gated = ACTIVATIONS[cfg.activation](dense(cfg.mlp_dim, "gate_proj")(h))
        return x + dense(cfg.embed_dim, "down_proj")(gated * dense(cfg.mlp_dim, "up_proj")(h))


class Llama(nn.Module):
    """tokens (B, T) -> logits (B, T, V); attention of every layer sown."""

    config: LlamaConfig
    layer_prefix = "layers"

    def setup(self):
        cfg = self.config
        self.embed_tokens = nn.Embed(cfg.vocab_size, cfg.embed_dim)
        self.layers = [LlamaBlock(cfg) for _ in range(cfg.num_layers)]
        self.norm = layers.RMSNorm(cfg.eps)
        if not cfg.tied:
            self.lm_head = nn.Dense(cfg.vocab_size, use_bias=False)

    def embed(self, tokens_BxT):
        return self.embed_tokens(tokens_BxT)

    def unembed(self, x):
        x = self.norm(x)
        return self.embed_tokens.attend(x) if self.config.tied else self.lm_head(x)

    def __call__(self, tokens_BxT):
        x = self.embed(tokens_BxT)
        for block in self.layers:
            x = block(x)
        return self.unembed(x)


def block_module(config: LlamaConfig, index: int) -> LlamaBlock:
    """Layer `index` alone (every layer runs the same code), to go one layer at a time."""
    del index
    return LlamaBlock(config)


def hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """Hugging Face tensor name of a parameter path, and whether it needs a transpose."""
    *mods, param = path
    if mods == ["lm_head"]:
        return "lm_head.weight", True
    leaf = {"kernel": "weight", "scale": "weight", "bias": "bias", "embedding": "weight"}[param]
    names = []
    for m in mods:
        if m.startswith("layers_"):
            names.append(f"layers.{m.removeprefix('layers_')}")
        elif m in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names.append(f"self_attn.{m}")
        elif m in ("gate_proj", "up_proj", "down_proj"):
            names.append(f"mlp.{m}")
        else:
            names.append(m)
    return f"model.{'.'.join(names)}.{leaf}", param == "kernel"  # Linear is out x in


def out_kernel(params, layer: int):
    """The attention output projection of a layer as a Dense kernel (in x out)."""
    return params[f"layers_{layer}"]["o_proj"]["kernel"]
