"""Freed memory kept for reuse by the process (glibc).

glibc serves an allocation of a few MB or more with a fresh `mmap` and unmaps it on
free, so every jitted call that makes a large temporary (a 50 x 16 x 100 x 100 attention
tensor is 32 MB) touches new pages and pays one page fault per 4 KB: about 8,000 faults,
a third of a paper-sized layer pass on CPU. Raising the mmap and trim thresholds lets
such buffers come from, and go back to, the heap: the next call finds them mapped.
The cost is that the process keeps its peak heap instead of returning it to the system.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_LARGEST = 2**31 - 1  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Ask the C library to keep freed memory for reuse; True when it agreed. Elsewhere
    than glibc on Linux (no `mallopt`, or one that refuses) nothing changes: False."""
    if not sys.platform.startswith("linux"):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(param, _LARGEST) == 1 for param in (_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD))
