"""`study.text_step` against closed forms: a bigram model (logits = a table's row of the
input token) has a cross-entropy computable by hand in float64, so each step's loss,
gradients, dtype handling and output sharding are checked exactly on the four test
devices."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from beyondpar import model as model_lib
from beyondpar.base import allocator, parallel
from beyondpar.study import runs, text_step, train
from helpers.lm_training import tiny_config

VOCAB = 5


class Bigram(nn.Module):
    """Logits of the next token: row `x` of a (VOCAB, VOCAB) table for input token x."""

    data_axis: str | None = None

    @nn.compact
    def __call__(self, inputs, deterministic=True):
        table = self.param("table", nn.initializers.normal(1.0), (VOCAB, VOCAB))
        return table[inputs]


def _table():
    # Thirds: not representable in bfloat16, so its rounding shows.
    return (np.arange(VOCAB * VOCAB).reshape(VOCAB, VOCAB) % 7 - 3) / 3.0


def _windows():
    rng = np.random.default_rng(0)
    return rng.integers(0, VOCAB, size=(8, 6)).astype(np.int32)


def _nats64(table, windows):
    """Each window's summed next-token cross-entropy, float64 by hand."""
    logits = np.asarray(table, np.float64)[windows[:, :-1]]
    lse = np.log(np.exp(logits).sum(-1))
    picked = np.take_along_axis(logits, windows[:, 1:, None], -1)[..., 0]
    return (lse - picked).sum(-1)


def _bf16(x):
    return np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32), np.float64)


def test_window_nats_is_each_windows_summed_cross_entropy():
    params = {"table": jnp.asarray(_table(), jnp.float32)}
    # Jitted: one program, not one per operation.
    got = jax.jit(text_step.window_nats, static_argnums=0)(Bigram(), params, _windows())
    np.testing.assert_allclose(got, _nats64(_table(), _windows()), rtol=1e-5)


def test_window_loss_sums_runs_bfloat16_on_rounded_params():
    params = {"table": jnp.asarray(_table(), jnp.float32)}
    windows = jnp.asarray(_windows())
    sums = jax.jit(text_step.window_loss_sums, static_argnums=(0, 3))
    total, count = sums(Bigram(), params, windows, jnp.bfloat16)
    expected = _nats64(_bf16(_table()), _windows()).sum()
    assert float(count) == windows.shape[0] * (windows.shape[1] - 1)
    np.testing.assert_allclose(float(total), expected, rtol=2e-6)
    assert abs(expected - _nats64(_table(), _windows()).sum()) > 1e-3  # the rounding shows


@pytest.mark.parametrize(
    "name, platform, expected",
    [("auto", "cpu", "float32"), ("auto", "gpu", "bfloat16"), ("float32", "tpu", "float32")],
)
def test_resolve_dtype(name, platform, expected):
    assert text_step.resolve_dtype(name, platform) == jnp.dtype(expected)


def test_accumulated_gradients_are_the_whole_batchs_mean():
    x = jnp.arange(1.0, 9.0)[:, None] * jnp.ones((8, 3))

    def loss_fn(p, piece, index):
        return jnp.mean((piece * p) ** 2)

    p = jnp.asarray(0.5)
    gradients = jax.jit(text_step.accumulated_gradients, static_argnums=(0, 3))
    loss, grad = gradients(loss_fn, p, x, 4)
    # mean over all of (x p)^2 = p^2 mean(x^2); its derivative 2 p mean(x^2).
    mean_sq = float(np.mean(np.arange(1.0, 9.0) ** 2))
    np.testing.assert_allclose(float(loss), 0.25 * mean_sq, rtol=1e-6)
    np.testing.assert_allclose(float(grad), 2 * 0.5 * mean_sq, rtol=1e-6)


def test_sharded_gradients_are_the_whole_batchs_mean_loss_and_gradient():
    mesh = parallel.data_mesh()
    assert mesh.size == 4
    params = {"table": jnp.asarray(_table(), jnp.float32)}
    windows = jnp.asarray(_windows())
    # Jitted, as the update runs it (eagerly, shard_map runs each operation alone).
    step = jax.jit(text_step.sharded_gradients(Bigram(), mesh, 2, jnp.float32))
    loss, grads = step(params, windows, jax.random.PRNGKey(0))

    def mean_loss(p):
        total, count = text_step.window_loss_sums(Bigram(), p, windows)
        return total / count

    want_loss, want_grads = jax.jit(jax.value_and_grad(mean_loss))(params)
    np.testing.assert_allclose(float(loss), _nats64(_table(), _windows()).mean() / 5, rtol=1e-5)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    np.testing.assert_allclose(grads["table"], want_grads["table"], rtol=1e-5, atol=1e-7)


def test_jitted_window_nats_are_replicated_on_every_device():
    # A multi-process run reads every window's nats in each process: left split over
    # `data`, no one process could fetch them.
    mesh = parallel.data_mesh()
    params = jax.device_put(
        {"table": jnp.asarray(_table(), jnp.float32)}, parallel.replicated(mesh)
    )
    windows = parallel.shard_batch(_windows(), mesh)
    got = text_step.jitted_window_nats(Bigram(), mesh, "float32")(params, windows)
    assert got.sharding.is_fully_replicated
    assert all(s.data.shape == (8,) for s in got.addressable_shards)
    np.testing.assert_allclose(np.asarray(got), _nats64(_table(), _windows()), rtol=1e-5)


@dataclasses.dataclass(frozen=True)
class DropoutConfig:
    dropout_rate: float = 0.5


class DropoutBigram(nn.Module):
    """`Bigram` with dropout on its logits, and the `config.dropout_rate` the step reads."""

    config: DropoutConfig = DropoutConfig()
    data_axis: str | None = None

    @nn.compact
    def __call__(self, inputs, deterministic=True):
        table = self.param("table", nn.initializers.normal(1.0), (VOCAB, VOCAB))
        return nn.Dropout(self.config.dropout_rate)(table[inputs], deterministic=deterministic)


def test_jitted_update_draws_new_dropout_masks_each_step_from_one_key():
    # A run passes the same key to every update: the step number must vary the masks.
    mesh = parallel.data_mesh()
    tx = optax.sgd(0.0)  # the parameters stay put, so only the masks change the loss
    update = text_step.jitted_update(DropoutBigram(), tx, mesh, 1, "float32")
    windows = parallel.shard_batch(_windows(), mesh)
    key = jax.random.PRNGKey(3)

    def state_at(step):  # fresh arrays each time: the update donates its state
        params = {"table": jnp.asarray(_table(), jnp.float32)}
        state = {"step": jnp.asarray(step, jnp.int32), "params": params}
        return jax.device_put({**state, "opt_state": tx.init(params)}, parallel.replicated(mesh))

    state, first = update(state_at(0), windows, key)
    assert int(state["step"]) == 1
    _, second = update(state, windows, key)
    _, again = update(state_at(0), windows, key)
    assert float(first["loss"]) == float(again["loss"])  # the same step, the same masks
    assert abs(float(first["loss"]) - float(second["loss"])) > 1e-3


def test_sharded_gradients_drop_each_microbatch_with_its_own_key():
    """Microbatch i drops with fold_in(key, i): 8 windows on 4 devices in 2 microbatches
    are 8 one-window slices, slice (device d, microbatch i) under key fold_in(key, i),
    whose mean loss and its gradient the step must give (one key for both microbatches
    would repeat a device's masks)."""
    mesh = parallel.data_mesh()
    params = {"table": jnp.asarray(_table(), jnp.float32)}
    key = jax.random.PRNGKey(7)
    step = jax.jit(text_step.sharded_gradients(DropoutBigram(), mesh, 2, jnp.float32))
    loss, grads = step(params, jnp.asarray(_windows()), key)

    # The 8 slices in (device, microbatch) order, each with its microbatch's key.
    pieces = _windows().reshape(8, 1, 6)
    slice_keys = jnp.stack([jax.random.fold_in(key, i) for _, i in np.ndindex(4, 2)])

    def mean_loss(p):
        def slice_loss(piece, slice_key):
            total, count = text_step.window_loss_sums(
                DropoutBigram(), p, piece, train_key=slice_key
            )
            return total / count

        return jnp.mean(jax.vmap(slice_loss)(pieces, slice_keys))

    # Jitted and mapped over the slices: one pass in one program.
    want_loss, want_grads = jax.jit(jax.value_and_grad(mean_loss))(params)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    np.testing.assert_allclose(grads["table"], want_grads["table"], rtol=1e-5, atol=1e-7)
    undropped = _nats64(_table(), _windows()).mean() / 5
    assert abs(float(loss) - undropped) > 1e-2  # the masks do change the loss


def _block_asked_for(monkeypatch, mesh, microbatches, windows_shape):
    """The largest tensor `jitted_update` sizes its temporaries' blocks by (None: it asks
    for none), nothing compiled."""
    seen = []
    monkeypatch.setattr(allocator, "bounded_temporaries", lambda b, p: seen.append(b) or {})
    module = model_lib.Transformer(_TEXT_MODEL)
    text_step.jitted_update.__wrapped__(
        module, optax.sgd(0.1), mesh, microbatches, "float32", windows_shape
    )
    return seen[0] if seen else None


_TEXT_MODEL = model_lib.ModelConfig(num_heads=16, max_len=30, dropout_rate=0.0)


def test_text_blocks_are_sized_by_each_devices_share_of_a_microbatch(monkeypatch):
    """48 windows of 20 + 1 tokens: 6 sequences of 20 tokens per device and microbatch on
    4 devices with 2 microbatches, 48 on one device with one; no shape, no blocks."""
    four, one = parallel.data_mesh(jax.devices()[:4]), parallel.data_mesh(jax.devices()[:1])
    largest = train.largest_tensor_bytes
    assert _block_asked_for(monkeypatch, four, 2, (48, 21)) == largest(_TEXT_MODEL, 6, 20)
    assert _block_asked_for(monkeypatch, one, 1, (48, 21)) == largest(_TEXT_MODEL, 48, 20)
    assert _block_asked_for(monkeypatch, four, 2, (50, 21)) == largest(_TEXT_MODEL, 7, 20)
    assert _block_asked_for(monkeypatch, four, 1, None) is None


class _Stop(Exception):
    pass


def test_text_training_compiles_its_step_for_the_configured_windows(tmp_path, monkeypatch):
    """The step's windows are the config's batch of seq_len + 1 tokens (inputs and the
    next token), per microbatch as the config splits it."""
    seen = []

    def spy(module, tx, mesh, microbatches, dtype, windows_shape=None):
        seen.append((microbatches, windows_shape))
        raise _Stop

    def no_parameters(module, key, tx, seq_len):  # the step's shapes need none
        return {"step": jnp.zeros((), jnp.int32), "params": {}, "opt_state": ()}

    monkeypatch.setattr(text_step, "jitted_update", spy)
    monkeypatch.setattr(train, "create_state", no_parameters)
    config = tiny_config(steps=2, warmup_steps=1)
    config.optim.batch_size, config.seq_len, config.optim.microbatches = 12, 10, 3
    with pytest.raises(_Stop):
        runs.train_and_evaluate(config, str(tmp_path / "run"))
    assert seen == [(3, (12, 11))]


def test_jitted_update_computes_in_the_dtype_it_is_given():
    """ "bfloat16": the step's loss is the bfloat16 pass's (parameters rounded), not the
    float32 one, whose loss it differs from by the rounding of the thirds in the table."""
    mesh = parallel.data_mesh()
    tx = optax.sgd(0.0)
    windows = parallel.shard_batch(_windows(), mesh)
    losses = {}
    for name in ("bfloat16", "float32"):
        params = {"table": jnp.asarray(_table(), jnp.float32)}
        state = {"step": jnp.asarray(0, jnp.int32), "params": params, "opt_state": tx.init(params)}
        state = jax.device_put(state, parallel.replicated(mesh))
        update = text_step.jitted_update(Bigram(), tx, mesh, 1, name)
        losses[name] = float(update(state, windows, jax.random.PRNGKey(0))[1]["loss"])
    tokens = _windows().shape[0] * (_windows().shape[1] - 1)
    np.testing.assert_allclose(
        losses["bfloat16"], _nats64(_bf16(_table()), _windows()).sum() / tokens, rtol=2e-6
    )
    np.testing.assert_allclose(
        losses["float32"], _nats64(_table(), _windows()).sum() / tokens, rtol=1e-6
    )
    assert abs(losses["bfloat16"] - losses["float32"]) > 1e-4
