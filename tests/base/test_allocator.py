"""Freed memory kept for reuse: a large buffer allocated again does not fault afresh."""

import platform
import subprocess
import sys

import pytest

from beyondpar.base import allocator

# libc's malloc and free from Python, freed memory kept when argv[1] is "keep". Each script
# runs in a fresh interpreter: the setting is process-wide.
MALLOC = """
import ctypes, resource, sys
from beyondpar.base import allocator
kept = allocator.keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
"""

# Faults while filling a 64 MB malloc buffer for the second time (one per 4 KB page: 16,384
# when its pages are new).
SECOND_FILL_FAULTS = (
    MALLOC
    + """
size = 64 * 2**20
def fill():
    buffer = libc.malloc(size)
    ctypes.memset(buffer, 1, size)
    libc.free(buffer)
fill()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
fill()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
)


def _second_fill(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", SECOND_FILL_FAULTS, mode],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_kept_memory_is_reused_without_page_faults():
    """By default glibc maps a 64 MB buffer afresh (a fault per page); once freed memory
    is kept, the second buffer reuses the first one's pages."""
    default, faults_default = _second_fill("default")
    kept, faults_kept = _second_fill("keep")
    assert default == "None" and faults_default >= 16_000
    assert kept == "True" and faults_kept < 1_000


# Faults while a worker thread fills two 40 MB malloc buffers for the second time. A
# thread's heaps hold at most 64 MB, so the second buffer gets a heap of its own, which
# glibc unmaps once it is empty unless freed memory is kept (a fault per 4 KB page afresh).
THREAD_SECOND_FILL_FAULTS = (
    MALLOC
    + """
import threading
size = 40 * 2**20
def fill():
    buffers = [libc.malloc(size) for _ in range(2)]
    for buffer in buffers:
        ctypes.memset(buffer, 1, size)
    for buffer in reversed(buffers):
        libc.free(buffer)
faults = []
def work():
    fill()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fill()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
worker = threading.Thread(target=work)
worker.start()
worker.join()
print(kept, faults[0])
"""
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_worker_threads_emptied_heaps_stay_mapped():
    """A worker thread's two 40 MB buffers, freed and allocated again, fault afresh on a
    whole buffer by default and reuse their pages once freed memory is kept."""
    run = lambda mode: subprocess.run(
        [sys.executable, "-c", THREAD_SECOND_FILL_FAULTS, mode],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    default, kept = run("default"), run("keep")
    assert default[0] == "None" and int(default[1]) >= 10_000
    assert kept[0] == "True" and int(kept[1]) < 1_000


# Address space (VmSize, KiB) that a 200 MiB heap allocation adds once freed memory is kept:
# the heap grows by the allocation and the top pad, which is one worker heap (64 MiB).
ADDRESS_SPACE_OF_ONE_ALLOCATION = """
import ctypes
from beyondpar.base import allocator
def vm_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
assert allocator.keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
before = vm_kib()
buffer = libc.malloc(200 * 2**20)
print(vm_kib() - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_the_top_pad_is_one_heap_of_address_space():
    out = subprocess.run(
        [sys.executable, "-c", ADDRESS_SPACE_OF_ONE_ALLOCATION],
        capture_output=True,
        text=True,
        check=True,
    )
    grown_mib = int(out.stdout.split()[-1]) / 1024
    assert 200 <= grown_mib < 300


class _FakeLibc:
    """A C library whose `mallopt` records each call and refuses the parameters given."""

    def __init__(self, refused=()):
        self.calls, self.refused = [], set(refused)

        def mallopt(param, value):
            self.calls.append((param, value))
            return 0 if param in self.refused else 1

        self.mallopt = mallopt


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is asked on Linux")
@pytest.mark.parametrize("refused, agreed", [((), True), ((-2,), False), ((-1,), False)])
def test_every_setting_is_tried_and_one_refusal_is_reported(monkeypatch, refused, agreed):
    """Trim threshold, mmap threshold and top pad are each asked for, even after a refusal,
    and the answer is True only when the library agreed to all three."""
    libc = _FakeLibc(refused)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: libc)
    assert allocator.keep_freed_memory() is agreed
    assert libc.calls == [(-1, 2**31 - 1), (-3, 2**31 - 1), (-2, 64 * 2**20)]
