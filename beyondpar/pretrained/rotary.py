"""Rotary position embeddings as the families' config.json files define them.

One `Rope` per attention layer type: its base, the share of each head that rotates, and
its scaling: `linear` (rates divided by a factor), `llama3` (long wavelengths slowed
smoothly), `yarn` (slow rates interpolated, a factor on cos and sin) or `longrope`
(Phi-3: per-frequency short or long factors, picked by the text's length as transformers
picks them, and a factor on cos and sin).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from beyondpar.pretrained import layers
from beyondpar.pretrained.config_fields import field, one_of


@dataclasses.dataclass(frozen=True)
class Rope:
    theta: float = 10000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192
    partial_factor: float = 1.0
    freq_factors: tuple[float, ...] | None = None  # llama.cpp's rope_freqs (GGUF)
    short_factors: tuple[float, ...] = ()  # longrope
    long_factors: tuple[float, ...] = ()
    attention_factor: float = 1.0
    yarn_betas: tuple[float, float, bool] = (32.0, 1.0, True)  # beta_fast, beta_slow, truncate

    @classmethod
    def from_hf(cls, c: dict, kinds, default_partial: bool = True) -> Rope:
        """`rope_scaling` (older configs) or `rope_parameters` (transformers 5) with the
        top-level `rope_theta` and `partial_rotary_factor` as fallbacks. `default_partial`
        False: the family's default rope turns every feature whatever the factor says
        (Llama, Mistral, Qwen, Gemma: only the scaled rope types read it)."""
        params = c.get("rope_scaling") or c.get("rope_parameters") or {}
        return cls.from_params(params, c, kinds, default_partial=default_partial)

    @classmethod
    def from_params(
        cls, params: dict, c: dict, kinds, theta: float | None = None, default_partial: bool = True
    ) -> Rope:
        """The rope one parameter dict describes; `c` is the whole config (for fields
        transformers reads beside it) and `theta` the base when neither names one."""
        base = params.get("rope_theta", c.get("rope_theta", 10000.0 if theta is None else theta))
        kind = one_of("rope_type", params.get("rope_type", params.get("type", "default")), kinds)
        reads_partial = default_partial or kind != "default"
        partial = partial_rotary_factor(params, c, "partial_rotary_factor") if reads_partial else 1
        common = dict(theta=float(base), partial_factor=partial, kind=kind)
        factors = c.get("rope_freq_factors")  # llama.cpp's divisors, beside any scaling
        if factors is not None and kind in ("default", "linear"):
            common["freq_factors"] = tuple(factors)
        if kind == "default":
            return cls(**common)
        if kind == "dynamic":  # NTK scaling starts past the context, which texts never pass
            return cls(**{**common, "kind": "default"})
        if kind == "linear":
            return cls(**common, factor=field(params, "factor", float))
        if kind == "longrope":
            return cls(**common, **_longrope(params, c))
        if kind == "yarn":
            return cls(**common, **_yarn(params, c))
        return cls(
            **common,
            factor=field(params, "factor", float),
            low_freq_factor=field(params, "low_freq_factor", float),
            high_freq_factor=field(params, "high_freq_factor", float),
            original_max_len=_original_max_len(params, c),
        )

    def inverse_frequencies(self, head_dim: int, seq_len: int = 1) -> np.ndarray:
        """(rotary_dim / 2,) float32 rotation rates for a text of `seq_len` tokens."""
        dim = layers.rotary_dim(head_dim, self.partial_factor)
        if self.kind == "longrope":
            long = seq_len > self.original_max_len
            factors = self.long_factors if long else self.short_factors
            _check_count(factors, dim // 2, f"rope_parameters {_FACTOR[long]!r}")
            return layers.inverse_frequencies(self.theta, dim, factors)
        inv = layers.inverse_frequencies(self.theta, dim)
        if self.freq_factors is not None:
            _check_count(self.freq_factors, len(inv), "rope frequency factors")
            inv = (inv / np.asarray(self.freq_factors)).astype(np.float32)
        if self.kind == "linear":
            inv = inv / np.float32(self.factor)  # in float32, as transformers divides
        elif self.kind == "llama3":
            inv = self._llama3(inv)
        elif self.kind == "yarn":
            inv = self._yarn_rates(inv, layers.rotary_powers(self.theta, dim), dim)
        return inv.astype(np.float32)

    def _yarn_rates(self, inv: np.ndarray, powers: np.ndarray, dim: int) -> np.ndarray:
        """YaRN: rates below the ramp interpolated (divided by `factor`), above it kept,
        blended linearly across it; in float32 in transformers' order of operations. The
        ramp's ends: the rates that turn `beta_fast` and `beta_slow` times over the
        original length, floored and ceiled unless `truncate` is false."""
        interpolated = np.float32(1) / (np.float32(self.factor) * powers)
        fast, slow, truncate = self.yarn_betas

        def rate_index(rotations):
            turns = self.original_max_len / (rotations * 2 * math.pi)
            return dim * math.log(turns) / (2 * math.log(self.theta))

        low, high = rate_index(fast), rate_index(slow)
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        high += 0.001 if low == high else 0.0
        ramp = np.clip((np.arange(len(inv), dtype=np.float32) - low) / (high - low), 0, 1)
        kept = np.float32(1) - ramp.astype(np.float32)
        return interpolated * (np.float32(1) - kept) + inv * kept

    def _llama3(self, inv: np.ndarray) -> np.ndarray:
        """Long wavelengths slowed by `factor`, the medium band blended, in float32 in
        transformers' order of operations (a blend rounded once from float64 differs in
        the last bit, which peaked attention shows)."""
        inv = inv.astype(np.float32)
        factor, original = np.float32(self.factor), self.original_max_len
        wavelen = np.float32(2 * math.pi) / inv
        low_wavelen = np.float32(original / self.low_freq_factor)
        high_wavelen = np.float32(original / self.high_freq_factor)
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (np.float32(original) / wavelen - np.float32(self.low_freq_factor)) / np.float32(
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (np.float32(1) - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled)


_FACTOR = {False: "short_factor", True: "long_factor"}


def _check_count(factors, size: int, name: str) -> None:
    if len(factors) != size:
        raise ValueError(f"{name} must number {size} (rotary dim / 2), got {len(factors)}")


def _original_max_len(params: dict, c: dict) -> int:
    """The pretraining context of a scaled rope, as transformers standardises it: the
    top-level `original_max_position_embeddings` wins over the rope dict's, and
    `max_position_embeddings` stands in when neither gives one."""
    if c.get("original_max_position_embeddings") is not None:
        return field(c, "original_max_position_embeddings")
    if params.get("original_max_position_embeddings") is not None:
        return field(params, "original_max_position_embeddings")
    return field(c, "max_position_embeddings")


def _yarn(params: dict, c: dict) -> dict:
    """YaRN's fields as transformers reads them: `factor` (max_position_embeddings over the
    original length when null), the attention factor (0.1 ln(s) + 1, or the ratio of two
    such with `mscale` and `mscale_all_dim`), `beta_fast` (32), `beta_slow` (1) and
    `truncate` (true) for the ramp."""
    original = _original_max_len(params, c)
    factor = params.get("factor") or field(c, "max_position_embeddings") / original

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        both = params.get("mscale") and params.get("mscale_all_dim")
        attention = (
            mscale(factor, params["mscale"]) / mscale(factor, params["mscale_all_dim"])
            if both
            else mscale(factor)
        )
    betas = (
        float(params.get("beta_fast") or 32),
        float(params.get("beta_slow") or 1),
        bool(params.get("truncate", True)),
    )
    return dict(
        factor=float(factor),
        original_max_len=original,
        attention_factor=float(attention),
        yarn_betas=betas,
    )


def _longrope(params: dict, c: dict) -> dict:
    """Phi-3's longrope, as transformers reads Phi-3: the top-level
    `original_max_position_embeddings` (4096 when absent) wins over the rope dict's; the
    attention factor defaults to sqrt(1 + ln(s) / ln(original)), s = `factor` or
    max_position_embeddings / original (1 when s <= 1)."""
    original = field(c, "original_max_position_embeddings", default=4096)
    factor = params.get("factor") or field(c, "max_position_embeddings") / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return dict(
        short_factors=tuple(_factor_list(params, "short_factor")),
        long_factors=tuple(_factor_list(params, "long_factor")),
        original_max_len=original,
        attention_factor=float(attention),
    )


def _factor_list(params: dict, name: str) -> list[float]:
    value = params.get(name)
    if not isinstance(value, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value
    ):
        raise ValueError(
            f"config.json rope field {name!r} must be a list of positive numbers, got {value!r}"
        )
    return [float(v) for v in value]


def partial_rotary_factor(params: dict, config: dict, name: str) -> float:
    """The share of each head's features that rotate, in (0, 1]: the rope dict's, else
    the top-level one, else 1 (null counts as absent, as transformers reads it)."""
    value = params.get(name)
    value = config.get(name) if value is None else value
    value = 1.0 if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"config.json field {name!r} must be a number in (0, 1], got {value!r}")
    return float(value)
