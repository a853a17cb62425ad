"""Where a jitted step's time goes, by kind of work, from a JAX profiler trace.

Each XLA operation of the trace is named after its HLO instruction; the compiled program
maps that name to the JAX operation that made it (its `op_name`), which says whether it
is forward (`jvp`) or backward (`transpose(jvp)`) work and in which module. Times are
per step and per device (the trace holds every device's operations).

An operation the compiler makes anew has no `op_name`: at one head XLA rewrites the
attention's batched products (B x 1 x T x T) without the head axis, and they would count
as unnamed work (a fifth of a 1-head step). A product or a reduction without one takes
its name from the operations it reads (`op_names`).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import re
import tempfile
from collections.abc import Callable, Iterable

import jax

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{$")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_REFERENCE = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
# What an unnamed operation is named after: the first of these that it, or the
# computation it calls (one level deep: XLA's CPU fusions nest no further), does.
_WORK = {"dot": "dot_general", "convolution": "dot_general", "reduce": "reduce"}
_OP_NAME = re.compile(r"op_name=\"([^\"]*)\"")
_SOFTMAX_AND_DROPOUT = ("reduce_max", "reduce_sum", "exp", "div", "select_n", "Dropout")
UNNAMED = "other operations (copies, loops)"
_COLLECTIVE_OPS = ("psum", "pmean", "all_gather", "psum_scatter")


def op_names(compiled_text: str) -> dict[str, str | None]:
    """HLO instruction name -> the `op_name` of the JAX operation it came from (None when
    the compiler made it without one). A product (dot or convolution, alone or fused) or
    a reduction without one is named `<module path>/dot_general` or `<module path>/reduce`
    after the named operations it reads through unnamed ones: backward if any of them is
    (forward work never reads backward results; an unnamed reduction of the gradients in
    an optimiser would count as backward too), with the module path of the first such.

    A named operation keeps its name whatever the compiler made of it: the softmax
    backward's row term (`model._attend_backward`) is a product named by its einsum at 4
    heads and more, and an unnamed reduction at one head (softmax work there)."""
    instructions, work = _parse(compiled_text)
    names = {name: instruction.op_name for name, instruction in instructions.items()}
    for name, kind in work.items():
        if names[name] is None:
            names[name] = _inferred_name(instructions[name], instructions, kind)
    return names


@dataclasses.dataclass(frozen=True)
class _Instruction:
    """What naming an operation needs of an HLO instruction: the inputs it reads, and
    the computation it calls, whose operations say what work a fusion does."""

    op_name: str | None
    opcode: str
    operands: tuple[str, ...]
    calls: str | None  # the computation a fusion runs


def _parse(compiled_text: str) -> tuple[dict[str, _Instruction], dict[str, str]]:
    """(every instruction by name, {name: "dot_general" or "reduce"} of those that compute
    a product or else a reduction, alone or in the computation they call)."""
    instructions, bodies, current = {}, collections.defaultdict(set), None
    for line in compiled_text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(1)
            continue
        found = _INSTRUCTION.match(line)
        if found:
            instruction = _instruction(found.group(2))
            instructions[found.group(1)] = instruction
            bodies[current].add(instruction.opcode)
    work = {}
    for name, instruction in instructions.items():
        called = bodies.get(instruction.calls, set()) if instruction.calls else set()
        opcodes = {instruction.opcode} | called
        kind = next((kind for opcode, kind in _WORK.items() if opcode in opcodes), None)
        if kind:
            work[name] = kind
    return instructions, work


def _instruction(text: str) -> _Instruction:
    """One instruction from the text after `%name = `: shape, opcode(operands), attributes."""
    found = _OPCODE.match(text, _shape_end(text))
    opcode, operands = "", ()
    if found:
        depth, end = 1, found.end()
        while depth and end < len(text):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        opcode, operands = found.group(1), tuple(_REFERENCE.findall(text[found.end() : end]))
    name, calls = _OP_NAME.search(text), _CALLS.search(text)
    return _Instruction(
        name.group(1) if name else None, opcode, operands, calls.group(1) if calls else None
    )


def _shape_end(text: str) -> int:
    """Where an instruction's shape ends: a tuple's closing parenthesis, or the first space."""
    if not text.startswith("("):
        return max(text.find(" "), 0)
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return i + 1
    return len(text)


def _inferred_name(
    unnamed: _Instruction, instructions: dict[str, _Instruction], kind: str
) -> str | None:
    """`<module path>/<kind>` of the named operations `unnamed` reads (see `op_names`),
    None when it reads none."""
    named, queue, seen = [], collections.deque(unnamed.operands), set()
    while queue:
        operand = queue.popleft()
        if operand in seen or operand not in instructions:
            continue
        seen.add(operand)
        source = instructions[operand]
        if source.op_name is None:
            queue.extend(source.operands)
        else:
            named.append(source.op_name)
    if not named:
        return None
    backward = [name for name in named if "transpose(jvp(" in name]
    return f"{(backward or named)[0].rsplit('/', 1)[0]}/{kind}"


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
    softmax_work = last == "reduce" or any(part in last for part in _SOFTMAX_AND_DROPOUT)
    if "/attn/" in op_name and softmax_work:
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
