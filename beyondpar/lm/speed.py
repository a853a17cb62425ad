"""How fast the loader hands out training batches, for the training benchmark: the
loader should outrun a training step by far (goal: 10x its tokens per second)."""

from __future__ import annotations

import contextlib
import os
import time

from beyondpar.base import checks


@contextlib.contextmanager
def one_core():
    """This process pinned to one of its cores (where the OS allows), then released."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)


def train_batch_tokens_per_second(
    text_data, batch_size: int, seq_len: int, steps: int = 20, process_count: int = 1
) -> float:
    """Input tokens per second that `text_data.train_batch` delivers on one core, over
    `steps` consecutive steps after one warm-up step (which builds the batch order)."""
    checks.positive_int("steps", steps)
    with one_core():
        text_data.train_batch(0, batch_size, seq_len, 0, process_count)
        start = time.perf_counter()
        for step in range(1, steps + 1):
            text_data.train_batch(step, batch_size, seq_len, 0, process_count)
        seconds = time.perf_counter() - start
    return steps * (batch_size // process_count) * seq_len / max(seconds, 1e-9)
