"""The upkeep of a test process that compiles many programs: every XLA CPU executable
maps its own code pages, and the kernel limits how many maps a process holds; and the
garbage collector, whose full collections scan every object those programs keep."""

import gc

import jax

# Allocations between young-generation collections (CPython's default: 700). A test
# process builds millions of short-lived objects tracing and lowering programs while it
# holds thousands of compiled ones: at the default, objects still alive mid-trace are
# promoted and pile up until a full collection scans the whole heap (0.5 to 2.5 s each,
# 15 of them in three heavy files); collected this rarely, most die young.
YOUNG_COLLECTION_ALLOCATIONS = 50_000


def memory_maps() -> tuple[int, int]:
    """(memory maps this process holds, the kernel's limit), or (0, 1) off Linux."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            held = sum(1 for _ in maps)
        with open("/proc/sys/vm/max_map_count") as limit:
            return held, int(limit.read())
    except OSError:
        return 0, 1


def release_compiled_programs(maps=memory_maps) -> bool:
    """Drop every compiled program when this process holds more than half the kernel's
    memory maps; True when it did. Every XLA CPU executable maps its own code pages, and
    a test worker that kept them all for a whole run passed the limit (vm.max_map_count,
    65,530 by default) and died in the compiler when the next program could not map its
    code."""
    held, limit = maps()
    if held <= limit // 2:
        return False
    jax.clear_caches()
    return True


def collect_garbage_less_often() -> None:
    """Young collections every `YOUNG_COLLECTION_ALLOCATIONS` allocations, the older
    generations' thresholds unchanged."""
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, *gc.get_threshold()[1:])
