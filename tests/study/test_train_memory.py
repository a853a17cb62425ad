"""A training step's temporaries stay mapped between steps: XLA packs them into blocks
that the device threads' heaps keep (`allocator.bounded_temporaries`)."""

import os
import platform
import subprocess
import sys

import jax
import optax
import pytest

from beyondpar import model as model_lib
from beyondpar import tasks
from beyondpar.base import allocator, parallel
from beyondpar.benchmarks import train as train_benchmark
from beyondpar.study import config_lib, train
from configs import smoke


@pytest.mark.parametrize(
    "fields, batch, tokens, largest",
    [
        # attention probabilities B x H x T x T
        (dict(num_heads=16, max_len=100), 25, 100, 4 * 25 * 16 * 100 * 100),
        # the same at a shorter sequence than max_len
        (dict(num_heads=16, max_len=100), 25, 32, 4 * 25 * 16 * 32 * 32),
        # logits B x T x V
        (dict(num_heads=2, max_len=10, vocab_size=300), 30, 10, 4 * 30 * 10 * 300),
        # MLP activations B x T x F
        (
            dict(num_heads=1, max_len=8, vocab_size=5, mlp_dim=40, embed_dim=16),
            7,
            8,
            4 * 7 * 8 * 40,
        ),
        # the residual stream B x T x D
        (
            dict(num_heads=1, max_len=4, vocab_size=5, mlp_dim=6, embed_dim=32),
            20,
            4,
            4 * 20 * 4 * 32,
        ),
        # the embedding's gradient and moments V x D: one short sequence, a large vocabulary
        (dict(num_heads=1, max_len=8, vocab_size=50_000), 1, 8, 4 * 50_000 * 64),
        # the MLP weights F x D
        (dict(num_heads=1, max_len=2, vocab_size=3, mlp_dim=700, embed_dim=8), 1, 2, 4 * 700 * 8),
        # the position embeddings max_len x D
        (dict(num_heads=1, max_len=900, vocab_size=3, mlp_dim=4, embed_dim=8), 1, 2, 4 * 900 * 8),
    ],
)
def test_largest_tensor_of_a_step(fields, batch, tokens, largest):
    cfg = model_lib.ModelConfig(**fields)
    assert train.largest_tensor_bytes(cfg, batch, tokens) == largest


def test_blocks_hold_the_largest_tensor_on_cpu_only():
    key = "xla_multiheap_size_constraint_per_heap"
    default = allocator.TEMPORARY_BLOCK_BYTES
    assert allocator.bounded_temporaries(0, "cpu") == {key: default}
    assert allocator.bounded_temporaries(default - 1, "cpu") == {key: default}
    assert allocator.bounded_temporaries(default + 12, "cpu") == {key: default + 12}
    # XLA takes an int32: a tensor of 2 GiB or more gets the largest block it accepts.
    assert allocator.bounded_temporaries(2**33, "cpu") == {key: 2**31 - 1}
    assert allocator.bounded_temporaries(default + 12, "gpu") == {}
    assert allocator.bounded_temporaries(default + 12, "tpu") == {}


# Page faults per step of a paper-sized training step (heads, layers and batch size from
# argv) on two CPU devices, after warm-up. At 16 heads its temporaries (about 180 MB per
# device at 4 layers) are more than a device thread's 64 MB heap: packed as one block, each
# step mapped it afresh (90,000 faults per step); in blocks, but with emptied heaps
# unmapped, 37,000. Two layers are enough to show both (38,600 and 14,800 faults per step,
# 1,000 to 3,000 as it is; at one layer the single block fits a heap) and compile in half
# the time.
STEP_FAULTS = """
import resource, sys
import jax, numpy as np, optax
from beyondpar import model as model_lib, tasks
from beyondpar.base import allocator, parallel
from beyondpar.study import train
heads, layers, batch_size, steps = map(int, sys.argv[1:])
allocator.keep_freed_memory()
jax.config.update("jax_num_cpu_devices", 2)
mesh = parallel.data_mesh()
cfg = model_lib.ModelConfig(num_heads=heads, num_layers=layers)
module, tx = model_lib.Transformer(cfg), optax.adam(1e-3)
# Zeros of the state's shapes, made by XLA as the initialiser's arrays are: a step's
# memory does not depend on the values, and the paper-sized initialiser took longer to
# compile (2.8 s) than the steps take to run.
shapes = jax.eval_shape(lambda key: train.create_state(module, key, tx, 100), jax.random.PRNGKey(0))
zeros = lambda: jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), shapes)
state = jax.jit(zeros, out_shardings=parallel.replicated(mesh))()
examples = tasks.make_examples("copy", jax.random.PRNGKey(1), batch_size, 100, 256)
batch = tasks.Examples(*(parallel.shard_batch(np.asarray(a), mesh) for a in examples))
update = train.jitted_update(module, tx, mesh, (batch_size, 100))
key = jax.random.PRNGKey(2)
update.lower(state, batch, key).compile()
for _ in range(3 if steps else 0):
    state, loss = update(state, batch, key)
    jax.block_until_ready(loss)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(steps):
    state, loss = update(state, batch, key)
    jax.block_until_ready(loss)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / max(steps, 1))
"""


def _run_steps(heads: int, layers: int, batch_size: int, steps: int) -> tuple[float, str]:
    """(page faults per step, stderr) of `steps` steps after warm-up, in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", STEP_FAULTS, *map(str, (heads, layers, batch_size, steps))],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"},  # XLA's warnings reach stderr
    )
    return float(out.stdout.split()[-1]), out.stderr


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's heaps")
def test_training_steps_reuse_their_temporaries_without_warnings():
    """16 heads, 25 sequences per device: attention tensors of 16 MB, over the 8 MiB
    default block. XLA would warn at compile time about each one that does not fit."""
    assert train.largest_tensor_bytes(model_lib.ModelConfig(num_heads=16), 25, 100) > (
        allocator.TEMPORARY_BLOCK_BYTES
    )
    faults, stderr = _run_steps(heads=16, layers=2, batch_size=50, steps=4)
    assert faults < 10_000
    assert "per-heap size limit" not in stderr
    # The tests' persistent compilation cache cannot hold such a step: no warning about it.
    assert "Multiple temp buffer allocations" not in stderr


def _block_asked_for(monkeypatch, module, mesh, batch_shape) -> int:
    """The largest tensor `jitted_update` sizes its blocks by (nothing compiled)."""
    seen = []
    monkeypatch.setattr(allocator, "bounded_temporaries", lambda b, p: seen.append(b) or {})
    train.jitted_update.__wrapped__(module, optax.sgd(0.1), mesh, batch_shape)
    return seen[0]


def test_blocks_are_sized_by_each_devices_share_of_the_batch(monkeypatch):
    """A step of 48 sequences of 20 tokens: 12 per device on 4 devices, 48 on one; of 50,
    the largest share is 13 (a device holding fewer never needs more)."""
    cfg = model_lib.ModelConfig(num_heads=16, max_len=30)
    module = model_lib.Transformer(cfg)
    four, one = parallel.data_mesh(jax.devices()[:4]), parallel.data_mesh(jax.devices()[:1])
    assert _block_asked_for(monkeypatch, module, four, (48, 20)) == (
        train.largest_tensor_bytes(cfg, 12, 20)
    )
    assert _block_asked_for(monkeypatch, module, one, (48, 20)) == (
        train.largest_tensor_bytes(cfg, 48, 20)
    )
    assert _block_asked_for(monkeypatch, module, four, (50, 20)) == (
        train.largest_tensor_bytes(cfg, 13, 20)
    )


class _Stop(Exception):
    pass


def test_training_compiles_its_step_for_the_configured_batch(tmp_path, monkeypatch):
    """The batch shape comes from the config's batch size and sequence length (not the
    dataset's size, nor the model's longest sequence)."""
    seen = []

    def spy(*args):
        seen.append(args[4])
        raise _Stop

    monkeypatch.setattr(train, "make_train_step", spy)
    config = smoke.get_config()
    config.optim.batch_size, config.task.seq_len = 12, 10
    with pytest.raises(_Stop):
        train.train_and_evaluate(config, str(tmp_path))
    assert seen == [(12, 10)]


def test_benchmark_step_is_compiled_for_its_batch(monkeypatch):
    """Its examples' shape: 8 sequences of 10 tokens, shorter than the model's 16. (The
    model and length of the test above: its initialisation is compiled once for both.)"""
    seen = []
    real = train.jitted_update
    monkeypatch.setattr(train, "jitted_update", lambda *a: seen.append(a[3]) or real(*a))
    cfg = config_lib.model_config(smoke.get_config())
    examples = tasks.make_examples("copy", jax.random.PRNGKey(1), 8, 10, cfg.vocab_size)
    train_benchmark._jax_step(cfg, parallel.data_mesh(jax.devices()[:2]), examples)
    assert cfg.max_len == 16 and seen == [(8, 10)]
