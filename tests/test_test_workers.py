"""The test workers' own upkeep: compiled programs released before the kernel's map
limit is reached (a worker that passed it died inside XLA's compiler)."""

import re

import jax
import jax.numpy as jnp

from helpers.memory_maps import memory_maps, release_compiled_programs


def _compile(count: int) -> list:
    programs = [jax.jit(lambda x, i=i: x * i + 1.0) for i in range(count)]
    for program in programs:
        program(jnp.ones(3)).block_until_ready()
    return programs


def _maps_in_smaps() -> int:
    """The same count from another file: one header line (an address range) per map."""
    with open("/proc/self/smaps") as smaps:
        return sum(1 for line in smaps if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line))


def test_memory_maps_are_counted_one_per_map():
    held, _ = memory_maps()
    assert abs(held - _maps_in_smaps()) <= 8  # maps made or dropped between the two reads


def test_compiled_programs_hold_memory_maps_until_released():
    held, limit = memory_maps()
    assert 0 < held < limit // 2  # this worker is within its budget
    programs = _compile(100)  # kept alive: only the release drops their executables
    grown, _ = memory_maps()
    assert held + 100 <= grown <= held + 100 * 8  # one to a few maps per program's code
    assert not release_compiled_programs(lambda: (grown, 2 * grown))  # at half: kept
    assert memory_maps()[0] >= grown
    assert release_compiled_programs(lambda: (grown, 2 * grown - 2))  # over half
    assert memory_maps()[0] < held + (grown - held) // 4  # most of them unmapped
    assert [float(p(jnp.ones(1))[0]) for p in programs[:3]] == [1.0, 2.0, 3.0]
