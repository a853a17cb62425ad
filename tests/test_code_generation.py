"""The suite compiles with quicker code-generation settings (`helpers.compilation.QUICK_COMPILE`);
a released checkpoint of the paper must give the same numbers with XLA's defaults, as
users run it."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from beyondpar import checkpoints, tasks
from beyondpar.study import evaluate, train

# Its own paths: the interpreters below import this file alone, without conftest's
# settings.
TESTS = Path(__file__).resolve().parent
FIXTURE = "4_heads_copy"


def released_numbers() -> dict:
    """Logits, attention, the loss gradient and the array fields of the paper's evaluation
    (no weight search, no pruning) of a released checkpoint on its own sequences, in
    float32 as the launchers run: softmax, exp, log and the metric kernels."""
    with jax.enable_x64(False):
        return _numbers()


def _numbers() -> dict:
    expected = np.load(TESTS / "data" / f"{FIXTURE}.expected.npz")
    module, params = checkpoints.import_reference(TESTS / "data" / f"{FIXTURE}.npz", 4)
    examples = tasks.label("copy", expected["tokens"], module.config.vocab_size)
    spec = evaluate.EvalSpec(optimal_weights=False, pruning=False)
    fields = evaluate.per_sequence(module, params, examples, spec)
    # The evaluation's own forward program, on the evaluation's placement of its arguments
    # (so compiled once), and the gradient compiled as training compiles it: programs
    # with their fusions, not an eager program per operation.
    logits, attention, _ = evaluate.forward(module, *evaluate.placed(params, examples.inputs))

    def loss(p):
        logits = module.apply({"params": p}, examples.inputs)
        return train.loss_and_accuracy(logits, examples)["loss_sum"]

    gradient = jax.jit(jax.grad(loss))(params)
    numbers = {"logits": logits, "attention": attention}
    leaves = jax.tree_util.tree_leaves_with_path(gradient)
    numbers |= {f"grad{jax.tree_util.keystr(path)}": leaf for path, leaf in leaves}
    numbers |= {f"field/{k}": v for k, v in fields.items() if np.ndim(v) > 0}
    return {k: np.asarray(v) for k, v in numbers.items()}


def numbers_compiled_with(xla_flags: str, out: Path) -> dict:
    """`released_numbers()` in a fresh CPU interpreter whose XLA_FLAGS are `xla_flags`, with
    no compilation cache (each run compiles its own programs), saved to `out`."""
    code = (
        f"import sys; sys.path[:0] = [{str(TESTS)!r}]; import jax, numpy as np; "
        "jax.config.update('jax_num_cpu_devices', 4); "
        "from test_code_generation import released_numbers; "
        f"np.savez({str(out)!r}, **released_numbers())"
    )
    env = dict(os.environ, XLA_FLAGS=xla_flags, JAX_PLATFORMS="cpu")
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    run = [sys.executable, "-c", code]
    done = subprocess.run(run, env=env, cwd=TESTS.parent, capture_output=True, text=True)
    assert done.returncode == 0, f"XLA_FLAGS={xla_flags!r}:\n{done.stderr[-3000:]}"
    with np.load(out) as saved:
        return dict(saved)


@pytest.mark.slow
def test_suite_settings_give_the_numbers_of_xlas_defaults(tmp_path):
    from helpers.compilation import QUICK_COMPILE

    # This process compiles with the suite's settings; a fresh one with XLA's defaults.
    assert all(flag.split("=")[0] in os.environ["XLA_FLAGS"] for flag in QUICK_COMPILE.split())
    quick = released_numbers()
    default = numbers_compiled_with("", tmp_path / "default.npz")
    assert quick["logits"].dtype == np.float32
    assert set(quick) == set(default) and len(quick) > 10
    # The settings move the float32 results by 2.2e-7 relative at most (summation order);
    # an approximating setting moves them further: fast-math with XLA's fusion emitters
    # (XLA_FLAGS="--xla_cpu_enable_fast_math=true --xla_cpu_use_fusion_emitters=true",
    # which this process keeps) moves the logits, the attention, 56 of the 60 gradient
    # leaves and four of the evaluation's fields (the gain by 3.7e-6) past the tolerance,
    # and fails here.
    for name, value in quick.items():
        np.testing.assert_allclose(value, default[name], rtol=1e-6, atol=1e-10, err_msg=name)


@pytest.mark.parametrize(
    ("jaxlib", "with_emitter_flag"),
    [("0.10.2", True), ("0.9.0", True), ("0.11.2", False), ("0.12.0", False), ("1.0.0", False)],
)
def test_quick_flags_name_only_flags_the_installed_xla_knows(jaxlib, with_emitter_flag):
    """XLA aborts the process on an unknown flag; jaxlib 0.11's XLA has no emitter switch
    (seen: `Unknown flag in XLA_FLAGS: --xla_cpu_use_fusion_emitters=false`)."""
    from helpers.compilation import quick_compile_flags

    flags = quick_compile_flags(jaxlib).split()
    assert ("--xla_cpu_use_fusion_emitters=false" in flags) is with_emitter_flag
    assert flags[:3] == [
        "--xla_backend_optimization_level=1",
        "--xla_llvm_disable_expensive_passes=true",
        "--xla_cpu_parallel_codegen_split_count=1",
    ]


def test_a_flag_the_caller_set_keeps_the_callers_value():
    """The suite's flags follow the caller's XLA_FLAGS, except those the caller set."""
    from helpers.compilation import with_flags

    quick = "--xla_backend_optimization_level=1 --xla_cpu_parallel_codegen_split_count=1"
    assert with_flags("--xla_backend_optimization_level=3", quick) == (
        "--xla_backend_optimization_level=3 --xla_cpu_parallel_codegen_split_count=1"
    )
    assert with_flags("", quick) == quick
