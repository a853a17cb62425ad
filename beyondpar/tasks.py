"""Synthetic sequence tasks: pure functions of a PRNG key.

Each task maps uniform random tokens x (N, T) to targets and a mask of the positions a
causal model can predict (it sees x[0..i] at position i).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from beyondpar import batches
from beyondpar.base import checks

# A task's examples are the batch every workflow scores a model on.
Examples = batches.Batch


def _copy(x, lag):
    return x, jnp.ones(x.shape, bool)


def _zero(x, lag):
    return jnp.zeros_like(x), jnp.ones(x.shape, bool)


def _shift(x, lag):
    """target[i] = x[i - lag], wrapping around: the first `lag` positions are unseen."""
    positions = jnp.arange(x.shape[-1])
    return jnp.roll(x, lag, axis=-1), jnp.broadcast_to(positions >= lag, x.shape)


def _cycle(x, lag):
    """The paper's cycle task: target[i] = x[i - 1], target[0] = x[T - 1]."""
    return _shift(x, 1)


def _pair_sum(x, lag, vocab_size):
    """target[i] = (x[i - 1] + x[i - lag]) mod V: needs two earlier positions at once."""
    targets = (jnp.roll(x, 1, axis=-1) + jnp.roll(x, lag, axis=-1)) % vocab_size
    positions = jnp.arange(x.shape[-1])
    return targets, jnp.broadcast_to(positions >= lag, x.shape)


def _induction(x):
    """Next-token prediction on a repeated prefix: target[i] = x[i + 1], and at the last
    position x[T/2], which followed x[T-1]'s earlier occurrence. In the repeat (i >= T/2)
    that is the token that followed the earlier occurrence of x[i], i.e. x[i - T/2 + 1]: a
    previous-token head and an induction head, in two layers, working together. In the
    prefix the next token is a fresh random one, so only the repeat is predictable."""
    half = x.shape[-1] // 2
    positions = jnp.arange(x.shape[-1])
    return jnp.roll(x, -1, axis=-1), jnp.broadcast_to(positions >= half, x.shape)


def _induction_inputs(key, num: int, seq_len: int, vocab_size: int):
    """A prefix of T/2 distinct random tokens (so every token's earlier occurrence is
    unique), then the same prefix again."""
    half = seq_len // 2
    keys = jax.random.split(key, num)
    prefix = jax.vmap(lambda k: jax.random.permutation(k, vocab_size)[:half])(keys)
    return jnp.concatenate([prefix, prefix], axis=-1).astype(jnp.int32)


TASKS = ("copy", "cycle", "zero", "shift", "pair_sum", "induction")
# Tasks whose targets need attention: the copy target is the current token and `zero`
# a constant, both carried without any head.
ATTENTION_TASKS = ("cycle", "shift", "pair_sum", "induction")
# The smallest sizes a task can be made at: a position to read and a later one to predict,
# and two tokens to tell apart.
MIN_SEQ_LEN, MIN_VOCAB_SIZE = 2, 2


def make_examples(
    name: str, key: jax.Array, num: int, seq_len: int, vocab_size: int, lag: int = 1
) -> Examples:
    """`num` random sequences of task `name`; `lag` is k for `shift` and `pair_sum`."""
    num = checks.positive_int("num", num)
    seq_len = checks.integer_at_least("seq_len", seq_len, MIN_SEQ_LEN)
    vocab_size = checks.integer_at_least("vocab_size", vocab_size, MIN_VOCAB_SIZE)
    check(name, seq_len, vocab_size, lag)
    if name == "induction":
        x = _induction_inputs(key, num, seq_len, vocab_size)
    else:
        x = jax.random.randint(key, (num, seq_len), 0, vocab_size, dtype=jnp.int32)
    return label(name, x, vocab_size, lag)


def check(name: str, seq_len: int, vocab_size: int, lag: int = 1) -> None:
    """ValueError naming the setting when task `name` cannot be made at these sizes."""
    _check_task(name, seq_len, lag)
    if name != "induction":
        return
    if seq_len % 2:
        raise ValueError(f"seq_len for task 'induction' must be even, got {seq_len}")
    if vocab_size < seq_len // 2:
        raise ValueError(
            f"vocab_size for task 'induction' must be >= seq_len / 2 = {seq_len // 2} "
            f"(the prefix has distinct tokens), got {vocab_size}"
        )


def _check_task(name: str, seq_len: int, lag: int) -> None:
    checks.one_of("task name", name, TASKS)
    min_lag = 2 if name == "pair_sum" else 1
    if name in ("shift", "pair_sum") and not (isinstance(lag, int) and min_lag <= lag < seq_len):
        raise ValueError(f"lag for task {name!r} must be in [{min_lag}, {seq_len}), got {lag!r}")


def label(name: str, inputs, vocab_size: int, lag: int = 1) -> Examples:
    """Targets and predictable positions of task `name` for given input tokens (N, T)."""
    x = jnp.asarray(inputs, jnp.int32)
    _check_task(name, x.shape[-1], lag)
    if name == "pair_sum":
        targets, mask = _pair_sum(x, lag, vocab_size)
    elif name == "induction":
        targets, mask = _induction(x)
    else:
        rule = {"copy": _copy, "cycle": _cycle, "zero": _zero, "shift": _shift}[name]
        targets, mask = rule(x, lag)
    return Examples(x, targets.astype(jnp.int32), mask)
