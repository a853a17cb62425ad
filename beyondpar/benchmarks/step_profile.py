"""Where a jitted step's time goes, by kind of work, from a JAX profiler trace.

Each XLA operation of the trace is named after its HLO instruction; the compiled program
maps that name to the JAX operation that made it (its `op_name`), which says whether it
is forward (`jvp`) or backward (`transpose(jvp)`) work and in which module. Times are
per step and per device (the trace holds every device's operations).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile
from collections.abc import Callable, Iterable

import jax

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$", re.M)
_OP_NAME = re.compile(r"op_name=\"([^\"]*)\"")
_SOFTMAX_AND_DROPOUT = ("reduce_max", "reduce_sum", "exp", "div", "select_n", "Dropout")
UNNAMED = "other operations (copies, loops)"
_COLLECTIVE_OPS = ("psum", "pmean", "all_gather", "psum_scatter")


def op_names(compiled_text: str) -> dict[str, str | None]:
    """HLO instruction name -> the `op_name` of the JAX operation it came from (None when
    the compiler made it without one)."""
    names = {}
    for m in _INSTRUCTION.finditer(compiled_text):
        found = _OP_NAME.search(m.group(2))
        names[m.group(1)] = found.group(1) if found else None
    return names


def category(instruction: str, op_name: str | None) -> str:
    """The kind of work of one XLA operation of a training step."""
    collective = instruction.startswith(("all-reduce", "reduce-scatter", "all-gather"))
    # XLA may name a collective after its JAX operation (`psum.3`) rather than its opcode.
    if collective or (op_name or "").rsplit("/", 1)[-1] in _COLLECTIVE_OPS:
        return "gradient all-reduce (with the wait for the other devices)"
    if op_name is None:
        return UNNAMED
    if "transpose(jvp(" in op_name:
        phase = "backward"
    elif "jvp(" in op_name:
        phase = "forward"
    else:
        return "optimiser update"
    if "dot_general" in op_name:
        return f"{phase}: matmuls"
    last = op_name.rsplit("/", 1)[-1]
    if "/attn/" in op_name and any(part in last for part in _SOFTMAX_AND_DROPOUT):
        return f"{phase}: attention softmax, mask and dropout"
    return f"{phase}: norms, activations, biases, residuals, loss"


def breakdown(events: Iterable[dict], names: dict[str, str], steps: int, devices: int):
    """Milliseconds per step and device by `category`, largest first, from trace events."""
    totals = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") == "X" and name in names:  # an operation, not a host span
            totals[category(name, names[name])] += event.get("dur", 0.0)
    scale = 1e-3 / (steps * devices)
    return {kind: us * scale for kind, us in totals.most_common()}


def profile(step: Callable[[], object], compiled_text: str, steps: int, devices: int) -> dict:
    """Milliseconds per step and device by kind of work, over `steps` traced calls of
    `step` (already compiled; each call's result is waited for)."""
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        try:
            for _ in range(steps):
                jax.block_until_ready(step())
        finally:
            jax.profiler.stop_trace()
        traces = glob.glob(f"{folder}/**/*.trace.json.gz", recursive=True)
        if not traces:
            raise RuntimeError(f"the JAX profiler wrote no trace under {folder}")
        with gzip.open(traces[0]) as f:
            events = json.load(f)["traceEvents"]
    return breakdown(events, op_names(compiled_text), steps, devices)
