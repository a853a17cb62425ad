"""Llama, Mistral, Qwen2 and Qwen3 (one architecture, as Hugging Face stores it).

RMSNorm, SwiGLU, rotary embeddings with the feature halves paired (every feature; the
first `partial_rotary_factor` of each head for the scaled rope types only, as transformers
reads it), grouped-query attention (query head h reads kv head h // (H / H_kv)); q/k/v
biases for Qwen2 or when `attention_bias` is set (not Mistral's), MLP biases by
`mlp_bias` (Llama's only); Qwen3's RMSNorm over each head's q and k; sliding windows per
layer; tied or separate output head; explicit `head_dim` honoured (Qwen3: 128 when
absent).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn

from beyondpar.pretrained import layers, rotary
from beyondpar.pretrained.config_fields import field, one_of

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
# transformers' defaults where a config leaves a field out (not where it writes null).
DEFAULT_WINDOW = 4096  # Mistral's, Qwen2's and Qwen3's `sliding_window`
DEFAULT_MAX_WINDOW_LAYERS = 28  # Qwen2's and Qwen3's
QWEN3_HEAD_DIM = 128


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
    rope: rotary.Rope
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    tied: bool = False
    activation: str = "silu"
    qk_norm: bool = False
    layer_windows: tuple[int | None, ...] = ()

    def window(self, layer: int) -> int | None:
        """The sliding window of a layer (None: full causal attention)."""
        return self.layer_windows[layer] if self.layer_windows else None

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
        head_dim = field(c, "head_dim", default=QWEN3_HEAD_DIM if kind == "qwen3" else None)
        if head_dim is None:
            if embed % heads:
                raise ValueError(
                    f"config.json field 'num_attention_heads' must divide hidden_size={embed} "
                    f"when head_dim is not given, got {heads}"
                )
            head_dim = embed // heads
        bias = bool(c.get("attention_bias", False)) and kind != "mistral"  # Mistral has none
        num_layers = field(c, "num_hidden_layers")
        return cls(
            model_type=kind,
            vocab_size=field(c, "vocab_size"),
            max_len=field(c, "max_position_embeddings"),
            embed_dim=embed,
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            mlp_dim=field(c, "intermediate_size"),
            eps=field(c, "rms_norm_eps", float, default=1e-6),
            rope=rotary.Rope.from_hf(c, ROPE_TYPES, default_partial=False),
            qkv_bias=bias or kind == "qwen2",
            out_bias=bias and kind != "qwen2",
            mlp_bias=bool(c.get("mlp_bias", False)) and kind == "llama",  # Llama's field only
            tied=bool(c.get("tie_word_embeddings", False)),
            activation=one_of("hidden_act", c.get("hidden_act", "silu"), layers.ACTIVATIONS),
            qk_norm=kind == "qwen3",
            layer_windows=_layer_windows(c, kind, num_layers),
        )


def _layer_windows(c: dict, kind: str, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window, as transformers decides it: Llama has none; Qwen2 and
    Qwen3 none unless `use_sliding_window`; else `layer_types` when the config lists them
    (Mistral's then loads as Ministral, which follows them); else Mistral windows every
    layer, and Qwen the layers from `max_window_layers` (28 when absent) on. A
    `sliding_window` left out is 4096; written as null, no window."""
    if kind == "llama":
        return ()
    window = field(c, "sliding_window", default=None if "sliding_window" in c else DEFAULT_WINDOW)
    qwen = kind in ("qwen2", "qwen3")
    if qwen and not c.get("use_sliding_window", False):
        window = None  # Qwen's configs drop the window unless `use_sliding_window`
    types = c.get("layer_types")
    if types is not None:
        if len(types) != num_layers:
            raise ValueError(
                f"config.json field 'layer_types' must list {num_layers} layers, got {len(types)}"
            )
        if "sliding_attention" in types and window is None:
            raise ValueError(
                "config.json must set 'sliding_window'"
                + (" and 'use_sliding_window': true" if qwen else "")
                + f" for its sliding layers, got layer_types {types}"
            )
        return tuple(window if t == "sliding_attention" else None for t in types)
    if window is None:
        return ()
    if kind == "mistral":
        return (window,) * num_layers
    first = c.get("max_window_layers", DEFAULT_MAX_WINDOW_LAYERS)
    first = DEFAULT_MAX_WINDOW_LAYERS if first is None else int(first)
    return tuple(window if i >= first else None for i in range(num_layers))


class LlamaBlock(nn.Module):
    config: LlamaConfig
    layer_index: int = 0

    @nn.compact
    def __call__(self, x, head_mask=None):
        cfg = self.config
        b, t, _ = x.shape
        h = layers.RMSNorm(cfg.eps, name="input_layernorm")(x)
        heads = lambda n, name: nn.Dense(n * cfg.head_dim, use_bias=cfg.qkv_bias, name=name)(
            h
        ).reshape(b, t, n, cfg.head_dim)
        q, k = heads(cfg.num_heads, "q_proj"), heads(cfg.num_kv_heads, "k_proj")
        if cfg.qk_norm:
            q = layers.RMSNorm(cfg.eps, name="q_norm")(q)
            k = layers.RMSNorm(cfg.eps, name="k_norm")(k)
        inv_freq = cfg.rope.inverse_frequencies(cfg.head_dim)
        q = layers.rotate_half_split(q, inv_freq, cfg.rope.attention_factor)
        k = layers.rotate_half_split(k, inv_freq, cfg.rope.attention_factor)
        v = heads(cfg.num_kv_heads, "v_proj")
        window = cfg.window(self.layer_index)
        scale = 1 / math.sqrt(cfg.head_dim)
        attn = layers.causal_attention(self, q, k, v, scale, window, head_mask)
        x = x + nn.Dense(cfg.embed_dim, use_bias=cfg.out_bias, name="o_proj")(attn)
        h = layers.RMSNorm(cfg.eps, name="post_attention_layernorm")(x)
        dense = lambda n, name: nn.Dense(n, use_bias=cfg.mlp_bias, name=name)
        gated = layers.ACTIVATIONS[cfg.activation](dense(cfg.mlp_dim, "gate_proj")(h))
        return x + dense(cfg.embed_dim, "down_proj")(gated * dense(cfg.mlp_dim, "up_proj")(h))


class Llama(layers.DecoderStack):
    """tokens (B, T) -> logits (B, T, V); attention of every layer sown."""

    config: LlamaConfig

    def block(self, index: int) -> LlamaBlock:
        return LlamaBlock(self.config, index)


def block_module(config: LlamaConfig, index: int) -> LlamaBlock:
    """Layer `index` alone, to go one layer at a time. Only its window depends on it: the
    block of the first layer with the same window stands for it, so that every layer
    alike runs one compiled program."""
    windows = config.layer_windows
    return LlamaBlock(config, windows.index(windows[index]) if windows else 0)


def hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """Hugging Face tensor name of a parameter path, and whether it needs a transpose
    (the names Gemma and Phi-3 share with Llama, their fused projections included)."""
    *mods, param = path
    if mods == ["lm_head"]:
        return "lm_head.weight", False  # an Embed: vocab x hidden, as stored
    leaf = {"kernel": "weight", "scale": "weight", "bias": "bias", "embedding": "weight"}[param]
    names = []
    for m in mods:
        if m.startswith("layers_"):
            names.append(f"layers.{m.removeprefix('layers_')}")
        elif m in ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "q_norm", "k_norm"):
            names.append(f"self_attn.{m}")
        elif m in ("gate_proj", "up_proj", "gate_up_proj", "down_proj"):
            names.append(f"mlp.{m}")
        else:
            names.append(m)
    return f"model.{'.'.join(names)}.{leaf}", param == "kernel"  # Linear is out x in


def out_kernel(params, layer: int):
    """The attention output projection of a layer as a Dense kernel (in x out)."""
    return params[f"layers_{layer}"]["o_proj"]["kernel"]


def build(config: dict) -> Llama:
    return Llama(LlamaConfig.from_hf(config))


def gguf_config(source) -> dict:
    """The config.json of a llama, qwen2 or qwen3 GGUF file (`source`, a GgufFile) as
    llama.cpp runs it: a recorded window on every layer (a windowed llama is Mistral),
    its rotary share, and its per-frequency rope factors (`rope_freqs`)."""
    config = source.decoder_config()
    window = source.arch_value("attention.sliding_window", None)
    if window and source.arch == "llama" and config["attention_bias"]:
        raise ValueError(
            f"GGUF file {source.path}: a llama model with attention biases must have no "
            f"llama.attention.sliding_window (transformers' Llama has no window and its "
            f"Mistral no biases), got a window of {window}"
        )
    if window:
        config["sliding_window"] = window
        config["model_type"] = "mistral" if source.arch == "llama" else source.arch
        config["use_sliding_window"] = True
        # A GGUF file keeps no max_window_layers: a recorded window is read as every
        # layer's (llama.cpp windows no Qwen2 layer at all: it ignores the key).
        config["max_window_layers"] = 0
    if config["partial_rotary_factor"] != 1 and config["rope_scaling"] is None:
        # llama.cpp turns `rope.dimension_count` features; transformers' Llama and Qwen
        # read a partial factor only beside a scaled rope: linear by 1 is the default.
        config["rope_scaling"] = {"rope_type": "linear", "factor": 1.0}
    if "rope_freqs.weight" in source.tensors:
        config["rope_freq_factors"] = source.dequantize("rope_freqs.weight").tolist()
    return config
