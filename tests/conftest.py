"""Test setup and shared fixtures. The suite runs as users run the code: float32, x64 off
(a test that compares with a float64 reference is marked `float64`, and x64 is on
inside it), on four fake CPU devices, with quicker compilation and a compilation
cache of its own. Helpers live in the `helpers` package."""

import atexit
import os
import shutil
import tempfile

from helpers.compilation import QUICK_COMPILE, with_flags

# Compile-speed settings (`helpers.compilation`): subprocesses inherit them.
os.environ["XLA_FLAGS"] = with_flags(os.environ.get("XLA_FLAGS", ""), QUICK_COMPILE)
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
jax.config.update("jax_enable_x64", False)  # the default, whatever JAX_ENABLE_X64 says
jax.config.update("jax_compilation_cache_dir", _COMPILED)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
jax.config.update("jax_compilation_cache_max_size", _CACHE_BYTES)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from beyondpar import checkpoints, tasks  # noqa: E402
from beyondpar import model as model_lib  # noqa: E402
from helpers.file_order import longest_first  # noqa: E402
from helpers.markers import refuse_float64_without_marker  # noqa: E402
from helpers.memory_maps import collect_garbage_less_often, release_compiled_programs  # noqa: E402
from helpers.paths import DATA, FIXTURES, load_fixture  # noqa: E402
from helpers.trained_runs import shared_folder, smoke_config, trained_once  # noqa: E402

collect_garbage_less_often()  # a test process holds thousands of compiled programs
pytest_plugins = ["helpers.worker_exit"]  # a worker ends without finalisation


def pytest_collection_modifyitems(items):
    refuse_float64_without_marker(items)
    longest_first(items)


@pytest.fixture(autouse=True)
def _float64_when_marked(request):
    """x64 on for a test marked `float64`, off again after it. Switched in the global
    config, not with the `jax.enable_x64` context, which holds for the calling thread only:
    checkpoint loading converts tensors on worker threads."""
    if request.node.get_closest_marker("float64") is None:
        yield
        return
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", False)


@pytest.fixture(params=FIXTURES)
def fixture(request):
    state, expected = load_fixture(request.param)
    return request.param, state, expected


@pytest.fixture(scope="session")
def reference():
    """The paper's released 4-head copy model on 4 copy sequences of 40 tokens (vocabulary
    256): (module, params, examples, attention in float64 as NumPy, head importances)."""
    module, params = checkpoints.import_reference(DATA / "4_heads_copy.npz", 4)
    examples = tasks.make_examples("copy", jax.random.PRNGKey(0), 4, 40, 256)
    _, attn = model_lib.apply_with_attention(module, params, examples.inputs)
    weights = model_lib.head_importances(module, params)
    return module, params, examples, np.asarray(attn, np.float64), np.asarray(weights)


# Small runs trained once for the whole test run (by the first worker that needs one) and
# read by every test that needs no config of its own; a test that changes one copies it.


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """configs/smoke.py trained: 64 steps, checkpoints at 56 and 64."""
    return trained_once(shared_folder(tmp_path_factory), "smoke", smoke_config())


@pytest.fixture(scope="session")
def one_epoch_run(tmp_path_factory):
    """configs/smoke.py for one epoch, no weight search or pruning: 8 steps, checkpoint 8."""
    config = smoke_config(epochs=1, evaluation_extras=False)
    return trained_once(shared_folder(tmp_path_factory), "one-epoch", config)


@pytest.fixture(scope="session")
def two_epoch_run(tmp_path_factory):
    """configs/smoke.py for two epochs, no weight search or pruning: 16 steps, checkpoints
    at 8 and 16."""
    config = smoke_config(epochs=2, evaluation_extras=False)
    return trained_once(shared_folder(tmp_path_factory), "two-epoch", config)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Checked after each test file (a test file's programs are mostly its own)."""
    yield
    release_compiled_programs()
