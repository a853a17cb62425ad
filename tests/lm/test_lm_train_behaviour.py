"""Language-model training against its documented behaviour: the optimiser's defaults,
clipping and weight-decay mask, the update step's loss and gradient norm (with and
without microbatches), parameter and FLOPs counts, the named sizes, and one short run
whose logged numbers are recomputed from its checkpoint, schedule and event files."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tensorboard.backend.event_processing import event_accumulator

from beyondpar import checkpoints
from beyondpar import model as model_lib
from beyondpar.base import parallel
from beyondpar.lm import data as data_lib
from beyondpar.study import (
    config_lib,
    runs,
    text_config,
    text_graphs,
    text_optim,
    text_step,
    text_training,
    train,
)
from configs import lm
from helpers.lm_training import tiny_config

PEAK = 1e12  # a made-up chip peak, so that the CPU run logs its utilisation


def run_config():
    config = tiny_config(steps=12, warmup_steps=4)
    config.log_every_steps = 4
    config.eval_every_steps = 6
    config.checkpoint_every_steps = 6
    # 70 held-out windows: more than one padded chunk of 64 over the devices.
    config.evaluation.update(heldout_windows=70, graph_windows=2, graph_tokens=16)
    return config


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lm_behaviour") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(text_config, "peak_flops", lambda kind: PEAK)
        runs.train_and_evaluate(run_config(), str(workdir))
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return workdir, [json.loads(line) for line in lines]


def closed_form_lr(t, peak, floor_ratio, warmup, steps):
    if t < warmup:
        return peak * t / warmup
    cosine = (1 + math.cos(math.pi * (t - warmup) / (steps - warmup))) / 2
    return peak * (floor_ratio + (1 - floor_ratio) * cosine)


def test_lm_train_documented_optimiser_defaults():
    o = config_lib.base_text_config().optim
    assert (o.beta2, o.weight_decay, o.min_learning_rate_ratio, o.clip_norm) == (
        0.95,
        0.1,
        0.1,
        1.0,
    )
    s = text_optim.OptimSettings.from_config(tiny_config(steps=40, warmup_steps=7).optim)
    lr = text_optim.schedule(s)
    for t in (0, 1, 6, 7, 8, 20, 39, 40):
        want = closed_form_lr(t, 1e-2, 0.1, 7, 40)
        np.testing.assert_allclose(float(lr(t)), want, rtol=1e-5, atol=1e-9)


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


def test_lm_train_update_logs_mean_token_loss_and_unclipped_gradient_norm(small_model):
    (module, params), mesh = small_model, parallel.data_mesh()
    tx = text_optim.optimizer(settings(clip_norm=1e-3))
    windows = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (8, 13), 0, 17))

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


def test_lm_train_run_logs_at_its_intervals_and_the_schedules_rate(short_run):
    _, records = short_run
    assert [r["step"] for r in records] == [4, 6, 8, 12]
    assert [r["step"] for r in records if "eval/loss" in r] == [6, 12]
    for r in records:
        want = closed_form_lr(r["step"] - 1, 1e-2, 0.1, 4, 12)
        assert r["train/learning_rate"] == pytest.approx(want, rel=1e-5)


def test_lm_train_run_logs_flops_utilisation(short_run):
    _, records = short_run
    config = run_config()
    fpt = text_config.flops_per_token(config_lib.model_config(config), config.seq_len)
    for r in records:
        assert r["tokens_per_s"] == pytest.approx(r["steps_per_s"] * 16 * 32, rel=1e-6)
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * fpt / (PEAK * jax.device_count()))


def test_lm_train_run_evaluation_recomputed_from_its_checkpoint(short_run):
    workdir, records = short_run
    config = run_config()
    step, state = checkpoints.load(workdir / "checkpoints")
    assert step == 12
    params = state["params"]
    text_data = data_lib.load(config.data, config.seed, cache_dir=str(workdir))
    heldout = np.asarray(text_data.heldout_windows(70, config.seq_len))
    module = model_lib.Transformer(config_lib.model_config(config))
    # Jitted: one program for the 70 windows at once (the run's went in padded chunks).
    nats = jax.jit(text_step.window_nats, static_argnums=0)(module, params, heldout)
    nats = np.asarray(nats, np.float64)
    last = records[-1]
    assert last["eval/loss"] == pytest.approx(nats.sum() / (70 * 32), rel=1e-5)
    bpb = last["eval/loss"] / math.log(2) / text_data.bytes_per_token
    assert last["eval/bits_per_byte"] == pytest.approx(bpb, rel=1e-9)
    windows = text_graphs.graph_windows(heldout, config.evaluation)
    measures = text_graphs.graph_measures(module, params, windows, config.evaluation)
    assert set(measures) <= set(last) and "layer2/sink_mass" in measures
    for name, value in measures.items():
        assert last[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name


def test_lm_train_run_events_match_the_metrics_lines(short_run):
    workdir, records = short_run
    acc = event_accumulator.EventAccumulator(str(workdir))
    acc.Reload()
    for r in records:
        for name, value in r.items():
            if name == "step" or not isinstance(value, float):
                continue
            events = {e.step: e.value for e in acc.Scalars(name)}
            assert events[r["step"]] == pytest.approx(value, rel=1e-6), (name, r["step"])
