"""Language-model training steps against their documented behaviour: clipping and the
weight-decay mask, the update step's loss and gradient norm (with and without
microbatches), microbatched gradients, bfloat16 compute, held-out padding, parameter and
FLOPs counts and the named sizes. One small model serves every step test (one init)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from beyondpar import model as model_lib
from beyondpar.base import parallel
from beyondpar.study import (
    config_lib,
    text_config,
    text_optim,
    text_step,
    text_training,
    train,
)
from configs import lm
from helpers.lm_training import tiny_config


def settings(**changes):
    optim = tiny_config().optim
    optim.update(dict(warmup_steps=0, steps=10, **changes))
    return text_optim.OptimSettings.from_config(optim)


def adam_mu(opt_state):
    found = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
    return next(s for s in found if isinstance(s, optax.ScaleByAdamState)).mu


def test_lm_train_gradients_clipped_by_global_norm():
    s = settings(clip_norm=1.0, weight_decay=0.0)
    tx = text_optim.optimizer(s)
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    grads = {"w": jnp.array([[3.0, 0.0], [0.0, 0.0]]), "b": jnp.array([4.0, 0.0])}
    _, opt_state = jax.jit(tx.update)(grads, tx.init(params), params)
    # The first moment is (1 - beta1) times the clipped gradient: g / |g| with |g| = 5.
    mu = adam_mu(opt_state)
    np.testing.assert_allclose(mu["w"], (1 - s.beta1) * grads["w"] / 5, rtol=1e-6)
    np.testing.assert_allclose(mu["b"], (1 - s.beta1) * grads["b"] / 5, rtol=1e-6)


def small_module():
    cfg = model_lib.ModelConfig(
        vocab_size=17, embed_dim=16, num_layers=1, num_heads=4, mlp_dim=24, max_len=12,
        dropout_rate=0.0,
    )  # fmt: skip
    return model_lib.Transformer(cfg)


@pytest.fixture(scope="module")
def small_model():
    """The small transformer and its parameters for 12-token windows: one init program
    for the tests below and the training states they create."""
    module = small_module()
    return module, model_lib.init_params(module, jax.random.PRNGKey(0), 12)


@pytest.fixture(scope="module")
def windows():
    """8 windows of 12 tokens (and the next) over the small model's vocabulary."""
    return np.asarray(jax.random.randint(jax.random.PRNGKey(1), (8, 13), 0, 17))


def test_lm_train_weight_decay_on_matrices_only(small_model):
    s = settings(weight_decay=0.1)
    tx = text_optim.optimizer(s)
    _, params = small_model
    zeros = jax.tree.map(jnp.zeros_like, params)
    # Jitted: one program, not one per parameter shape and operation.
    updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
    shrink = s.learning_rate * s.weight_decay

    def check(p, u):
        want = -shrink * p if p.ndim >= 2 else jnp.zeros_like(p)
        np.testing.assert_allclose(u, want, rtol=1e-5, atol=1e-12)

    jax.tree.map(check, params, updates)
    assert any(p.ndim == 1 for p in jax.tree.leaves(params))


def test_lm_train_update_logs_mean_token_loss_and_unclipped_gradient_norm(small_model, windows):
    (module, params), mesh = small_model, parallel.data_mesh()
    tx = text_optim.optimizer(settings(clip_norm=1e-3))

    def mean_loss(p):
        logits = module.apply({"params": p}, windows[:, :-1], deterministic=True)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])
        return ce.mean()

    # Jitted: op by op, the forward and backward passes compiled each operation alone.
    loss, grads = jax.jit(jax.value_and_grad(mean_loss))(params)
    new_params = []
    for microbatches in (1, 2):
        state = train.create_state(module, jax.random.PRNGKey(0), tx, 12)
        state = jax.device_put(state, parallel.replicated(mesh))
        update = text_step.jitted_update(module, tx, mesh, microbatches, "float32")
        state, metrics = update(state, windows, jax.random.PRNGKey(2))
        np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
        np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(grads), rtol=1e-4)
        new_params.append(jax.device_get(state["params"]))
    # A key bias moves every score of a query row by the same amount, which the softmax
    # ignores: its gradient is 0 but for rounding, which Adam's first step turns into
    # steps of up to the learning rate either way. Every other parameter agrees.
    for path, grad in jax.tree_util.tree_leaves_with_path(grads):
        if "key" in jax.tree_util.keystr(path) and "bias" in jax.tree_util.keystr(path):
            assert float(jnp.max(jnp.abs(grad))) < 1e-6 * float(optax.tree.norm(grads))
    one, two = (jax.tree_util.tree_leaves_with_path(p) for p in new_params)
    for (path, a), (_, b) in zip(one, two, strict=True):
        name = jax.tree_util.keystr(path)
        if not ("key" in name and "bias" in name):
            np.testing.assert_allclose(a, b, atol=1e-6, err_msg=name)


def test_lm_train_parameter_and_flops_counts():
    for size in ("cpu", "gpu"):
        cfg = config_lib.model_config(lm.get_config(f"size={size}"))
        module = model_lib.Transformer(cfg)
        shapes = jax.eval_shape(lambda m=module: model_lib.init_params(m, jax.random.PRNGKey(0)))
        embeddings = (cfg.vocab_size + cfg.max_len) * cfg.embed_dim
        assert text_config.non_embedding_params(cfg) == model_lib.count_params(shapes) - embeddings
    # GPT-2 small's shape: N = 86,215,936 - (256 + 1024) * 768, then 6 N + 12 L d T.
    assert text_config.non_embedding_params(cfg) == 85_232_896
    assert text_config.flops_per_token(cfg, 1024) == 6 * 85_232_896 + 12 * 12 * 768 * 1024
    assert text_config.flops_per_token(cfg, 512) == 6 * 85_232_896 + 12 * 12 * 768 * 512


def test_lm_train_named_sizes_take_their_own_fields():
    for name, size in lm.SIZES.items():
        config = lm.get_config(f"heads=8,size={name}")
        assert config.seq_len == size["seq_len"]
        assert {k: config.model[k] for k in size["model"]} == size["model"]
        assert {k: config.optim[k] for k in size["optim"]} == size["optim"]
        every = (config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps)
        assert every == tuple(size["every"][k] for k in ("log", "eval", "checkpoint"))
        assert config.model.embed_dim // 8 == config_lib.model_config(config).head_dim
    assert lm.get_config("size=tpu").optim.microbatches == 4


def test_lm_train_heldout_nats_drop_the_padding():
    mesh = parallel.data_mesh()
    windows = np.arange(70 * 5).reshape(70, 5)
    got = text_training.heldout_nats(lambda p, w: jnp.sum(w, axis=-1), None, windows, mesh)
    np.testing.assert_array_equal(got, windows.sum(-1))


def test_lm_train_microbatches_give_the_full_batchs_gradient(small_model, windows):
    module, params = small_model

    def mean_loss(p, piece, index):
        total, count = text_step.window_loss_sums(module, p, piece)
        return total / count

    gradients = jax.jit(text_step.accumulated_gradients, static_argnums=(0, 3))
    want = gradients(mean_loss, params, windows, 1)
    got = gradients(mean_loss, params, windows, 4)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, want)


def test_lm_train_bfloat16_compute_keeps_float32_parameters(small_model, windows):
    assert text_step.resolve_dtype("auto", "cpu") == jnp.float32
    assert text_step.resolve_dtype("auto", "gpu") == jnp.bfloat16
    module, params = small_model

    def loss(p, dtype):
        return text_step.window_loss_sums(module, p, windows, dtype)[0]

    # Two programs: the bfloat16 loss with its gradients, and the float32 loss.
    half, grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, jnp.bfloat16)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    full = jax.jit(loss, static_argnums=1)(params, jnp.float32)
    np.testing.assert_allclose(half, full, rtol=2e-2)
