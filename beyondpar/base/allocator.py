"""Freed memory kept for reuse by the process (glibc).

glibc serves an allocation of a few MB or more with a fresh `mmap` and unmaps it on
free, so every jitted call that makes a large temporary (a 50 x 16 x 100 x 100 attention
tensor is 32 MB) touches new pages and pays one page fault per 4 KB: about 8,000 faults,
a third of a paper-sized layer pass on CPU. Raising the mmap and trim thresholds lets
such buffers come from, and go back to, the heap: the next call finds them mapped.
The cost is that the process keeps its peak heap instead of returning it to the system.

That covers the main thread. XLA runs each CPU device's program on a worker thread, and
glibc serves those threads from arenas made of heaps of at most 64 MB: a larger block is
mapped afresh and unmapped on free whatever the thresholds say, and a heap left empty is
unmapped. XLA packs a program's temporaries into one block by default (about 80 MB per
device for a 4-head training step of the paper's size), so each step faulted on every page
of it (39,000 faults at 4 heads, 90,000 at 16). `bounded_temporaries` makes XLA pack them
into blocks that fit a heap, and a top pad of a whole heap keeps emptied heaps mapped.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_LARGEST = 2**31 - 1  # mallopt takes an int, and XLA's block option an int32
# A worker heap is at most 64 MB on 64-bit systems. The trim threshold already keeps glibc
# from shrinking one; a top pad of a whole heap also keeps it from unmapping an emptied one
# (it does so only when the heap before would keep that much room free). New worker heaps
# are then made writable whole at once: address space the kernel commits (it matters only
# with overcommit off), not memory until it is touched.
_HEAP_BYTES = 64 * 2**20
# An eighth of a worker heap, so that several blocks share one.
TEMPORARY_BLOCK_BYTES = 8 * 2**20


def keep_freed_memory() -> bool:
    """Ask the C library to keep freed memory for reuse; True when it agreed. Elsewhere
    than glibc on Linux (no `mallopt`, or one that refuses) nothing changes: False."""
    if not sys.platform.startswith("linux"):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    settings = (
        (_M_TRIM_THRESHOLD, _LARGEST),
        (_M_MMAP_THRESHOLD, _LARGEST),
        (_M_TOP_PAD, _HEAP_BYTES),
    )
    accepted = [mallopt(param, value) == 1 for param, value in settings]  # each one tried
    return all(accepted)


def bounded_temporaries(largest_tensor_bytes: int, platform: str) -> dict[str, int]:
    """`jax.jit` compiler options that pack a program's temporaries into blocks of at most
    `TEMPORARY_BLOCK_BYTES`, or of its largest tensor when that is larger (XLA warns at
    compile time about a tensor that does not fit a block). For CPU programs called again
    and again (a training step) whose temporaries add up to more than a worker thread's
    heap; none on other platforms (`jax.Device.platform`), which have their own allocators."""
    if platform != "cpu":
        return {}
    block = min(max(TEMPORARY_BLOCK_BYTES, int(largest_tensor_bytes)), _LARGEST)
    return {"xla_multiheap_size_constraint_per_heap": block}
