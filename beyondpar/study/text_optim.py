"""The language model's optimiser: AdamW under linear warmup and cosine decay, after
clipping the gradient's global norm. One object per setting (cached), so that runs of a
grid with the same optimiser share one compiled update."""

from __future__ import annotations

import dataclasses
import functools

import jax
import ml_collections
import optax


@dataclasses.dataclass(frozen=True)
class OptimSettings:
    """The `optim` block as hashable numbers (a jit cache key)."""

    learning_rate: float
    min_learning_rate_ratio: float
    warmup_steps: int
    steps: int
    weight_decay: float
    beta1: float
    beta2: float
    clip_norm: float

    @classmethod
    def from_config(cls, optim: ml_collections.ConfigDict) -> OptimSettings:
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: type_(optim[name]) for name, type_ in _types(names)})


def _types(names):
    ints = {"warmup_steps", "steps"}
    return [(name, int if name in ints else float) for name in names]


def schedule(s: OptimSettings) -> optax.Schedule:
    """0 -> peak linearly over `warmup_steps`, then a cosine to peak * min ratio at `steps`."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=s.learning_rate,
        warmup_steps=s.warmup_steps,
        decay_steps=max(s.steps, s.warmup_steps + 1),
        end_value=s.learning_rate * s.min_learning_rate_ratio,
    )


def decays(params):
    """Weight decay on matrices only: biases, norm scales and nothing of rank 1."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


@functools.cache
def optimizer(s: OptimSettings) -> optax.GradientTransformation:
    """Clip by global norm, then AdamW with `schedule(s)`."""
    return optax.chain(
        optax.clip_by_global_norm(s.clip_norm),
        optax.adamw(schedule(s), b1=s.beta1, b2=s.beta2, weight_decay=s.weight_decay, mask=decays),
    )
