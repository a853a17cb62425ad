"""Pruning curves of a model: true ablations through the head mask, with the fidelity of
the heads that remain. Every test runs one small random model (the paper's copy model
keeps its accuracy without any head, so its points cannot be told apart by accuracy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import graphs, metrics, pruning, tasks
from beyondpar import model as model_lib
from beyondpar.study import evaluate, pruning_curves

# One horizon and one step cap for every curve and layer, all on 4 x 40-token batches
# (`masked_models`' and `small_layer`'s): the metric kernels compile once per batch shape
# and setting, and these share them. The horizon and the cap differ, so a curve that swaps
# them shows.
HORIZON, MAX_STEPS = 30, 7
SPEC = (HORIZON, MAX_STEPS, "normalized")

# The model's attention as one compiled program (op by op, a forward pass compiles each of
# its many small operations on its own).
apply_with_attention = jax.jit(model_lib.apply_with_attention, static_argnums=0)
apply_layer = jax.jit(model_lib.apply_layer, static_argnums=0)


@pytest.fixture(scope="module")
def tiny():
    """A small random model (4 layers of 4 heads, 8 features, up to 40 positions) and its
    parameters: one model config for every test that needs no trained model."""
    cfg = model_lib.ModelConfig(num_heads=4, vocab_size=6, max_len=40, mlp_dim=8, embed_dim=8)
    module = model_lib.Transformer(cfg)
    return module, random_params(module, seed=3)


def random_params(module, seed):
    """Parameters of `module`'s shapes drawn in NumPy (the initialiser's program compiles
    for seconds, and any random model serves): matrices N(0, 1 / fan-in), biases 0, layer
    norm scales 1."""
    shapes = jax.eval_shape(lambda key: model_lib.init_params(module, key), jax.random.key(0))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "scale" in name or "bias" in name:
            return jnp.full(leaf.shape, float("scale" in name), leaf.dtype)
        return jnp.asarray(rng.normal(0, leaf.shape[0] ** -0.5, leaf.shape), leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def test_curve_keeps_one_head_and_measures_it(small_model):
    module, params, examples, attn, weights = small_model
    masks = np.ones((2, 4, 4), np.float32)
    masks[1, 0] = [0, 0, 1, 0]  # layer 0 keeps head 2 only
    got = pruning_curves.curve(
        module, params, examples, weights, jnp.asarray(masks), HORIZON, MAX_STEPS, "reference"
    )
    # Every head of layer 0, and every layer's full mix: the (4, 4, 40, 40) program of
    # the other tests.
    own = np.mean(metrics.minimax_fidelity(attn[:, 0], HORIZON), axis=0)[2]
    np.testing.assert_allclose(got["fidelity"][1][0], own, rtol=1e-4)
    mixed = jnp.stack([graphs.combine_heads(attn[:, i], weights[i]) for i in range(4)], 1)
    full = np.mean(metrics.minimax_fidelity(mixed, HORIZON), axis=0)[0]
    np.testing.assert_allclose(got["fidelity"][0][0], full, rtol=1e-4)
    # A true ablation: later layers read the masked layer's output, so their maps move.
    assert np.abs(np.subtract(got["fidelity"][1][1:], got["fidelity"][0][1:])).max() > 1e-6
    assert got["heads_pruned"] == [0, 1]
    np.testing.assert_allclose(got["auc"], np.mean(got["accuracy"]))  # two points


@pytest.mark.parametrize("walk", ["normalized", "reference"])
def test_curve_measures_each_point_with_its_horizon_steps_and_walk(small_model, walk):
    """Fidelity over `horizon` steps, the hitting time over `max_steps` on `walk`, of
    every layer's mix of the heads kept (here, all of them)."""
    module, params, examples, attn, weights = small_model
    masks = jnp.ones((1, 4, 4), jnp.float32)
    got = pruning_curves.curve(module, params, examples, weights, masks, HORIZON, MAX_STEPS, walk)
    mixed = jnp.stack([graphs.combine_heads(attn[:, i], weights[i]) for i in range(4)], 1)
    fidelity = np.mean(metrics.minimax_fidelity(mixed, HORIZON), axis=0)
    hitting = np.mean(metrics.hitting_time(mixed, MAX_STEPS, walk), axis=0)
    np.testing.assert_allclose(got["fidelity"][0], fidelity, rtol=1e-4)
    np.testing.assert_allclose(got["hitting_time"][0], hitting, rtol=1e-4)
    # capped at max_steps, not horizon
    assert np.all(np.asarray(got["hitting_time"][0]) < MAX_STEPS)


def test_curve_measures_fidelity_over_its_horizon_when_the_step_cap_is_longer(small_model):
    """A horizon of one step under a step cap of MAX_STEPS: the mixes' fidelity moves
    between the two, so only a fidelity over `horizon` steps matches."""
    module, params, examples, attn, weights = small_model
    masks = jnp.ones((1, 4, 4), jnp.float32)
    got = pruning_curves.curve(module, params, examples, weights, masks, 1, MAX_STEPS, "normalized")
    mixed = jnp.stack([graphs.combine_heads(attn[:, i], weights[i]) for i in range(4)], 1)
    one_step = np.mean(metrics.minimax_fidelity(mixed, 1), axis=0)
    capped = np.mean(metrics.minimax_fidelity(mixed, MAX_STEPS), axis=0)
    assert not np.allclose(one_step, capped, rtol=1e-3, atol=0)  # the case tells them apart
    np.testing.assert_allclose(got["fidelity"][0], one_step, rtol=1e-4)


@pytest.fixture(scope="module")
def masked_models(tiny):
    """The small random model, a curve's masks over its 4 x 4 heads, and each mask's whole
    masked model measured directly: (accuracy, fidelity, hitting time) of every point,
    the last two per layer; and the unmasked model's attention (the first point's). Its
    accuracy moves with every removal, so points cannot be swapped unseen."""
    module, params = tiny
    examples = tasks.make_examples("copy", jax.random.PRNGKey(0), 4, 40, 6)
    weights = np.asarray(model_lib.head_importances(module, params))
    order = [(2, 1), (0, 3), (2, 0), (3, 3), (0, 0), (1, 2)]
    masks = jnp.asarray(pruning.masks_along(order, 4, 4))
    want, attns = [], []
    for mask in np.asarray(masks):
        logits, attn = apply_with_attention(module, params, examples.inputs, mask)
        correct = (np.argmax(logits, -1) == examples.targets) & examples.predictable
        mixes = jnp.stack(
            [graphs.combine_heads(attn[:, i], weights[i] * mask[i]) for i in range(4)]
        )
        fid = np.mean(metrics.minimax_fidelity(mixes, HORIZON), axis=1)  # per layer
        hit = np.mean(metrics.hitting_time(mixes, MAX_STEPS, "normalized"), axis=1)
        want.append((correct.sum() / examples.predictable.sum(), fid, hit))
        attns.append(attn)
    return (module, params, examples, weights, masks), want, np.asarray(attns[0])


@pytest.fixture(scope="module")
def small_model(masked_models):
    """The small random model on its 4 x 40-token copy batch, as conftest's `reference`
    gives the paper's model: (module, params, examples, attention, head importances). One
    model config, so the curve's layer programs compile once for the file."""
    (module, params, examples, weights, _), _, attn = masked_models
    return module, params, examples, attn, weights


@pytest.mark.parametrize("group, mix_bytes", [(16, 2**28), (2, 2**28), (16, 1)])
def test_points_that_share_layers_are_each_the_masked_model(
    masked_models, group, mix_bytes, monkeypatch
):
    """Every point of a curve is the whole masked model, whatever layer each removal is
    in (the curve shares the layers before the points' masks differ, and the attention
    of a layer among the masks that read the same stream, in groups of at most `group`
    masks and `mix_bytes` of mixes)."""
    monkeypatch.setattr(pruning_curves, "MASK_GROUP", group)
    monkeypatch.setattr(pruning_curves, "MIX_BYTES", mix_bytes)
    (module, params, examples, weights, masks), want, _ = masked_models
    got = pruning_curves.curve(module, params, examples, weights, masks, *SPEC)
    for p, (accuracy, fid, hit) in enumerate(want):
        assert got["accuracy"][p] == pytest.approx(accuracy)
        for layer in range(4):
            np.testing.assert_allclose(got["fidelity"][p][layer], fid[layer], rtol=1e-5)
            np.testing.assert_allclose(got["hitting_time"][p][layer], hit[layer], rtol=1e-5)
    assert len(set(got["accuracy"])) == len(masks)  # 13, 12, 20, 17, 18, 14, 9 of 160


def test_accuracy_counts_predictable_positions_only(masked_models):
    """The accuracy is over predictable positions: targets equal to the model's own
    prediction at even positions only, predictable on the first 5 positions, give the
    share of even positions among them (the others, right or wrong, do not count)."""
    (module, params, examples, weights, masks), _, _ = masked_models
    logits, _ = apply_with_attention(module, params, examples.inputs, masks[0])
    predicted = np.argmax(logits, -1)
    even = np.arange(40) % 2 == 0
    targets = np.where(even, predicted, (predicted + 1) % 6)
    predictable = np.broadcast_to(np.arange(40) < 5, (4, 40))  # positions 0, 2, 4 of 5 even
    examples = tasks.Examples(examples.inputs, jnp.asarray(targets), jnp.asarray(predictable))
    got = pruning_curves.curve(
        module, params, examples, weights, masks[:1], HORIZON, MAX_STEPS, "normalized"
    )
    assert got["accuracy"] == [pytest.approx(3 / 5)]


def test_pruning_curves_cover_every_order(masked_models):
    (module, params, examples, weights, _), _, attn = masked_models
    spec = evaluate.EvalSpec(horizon=HORIZON, max_steps=MAX_STEPS)
    curves = pruning_curves.pruning_curves(module, params, examples, weights, attn, spec)
    assert set(curves) == set(pruning.ORDERS)
    for curve in curves.values():
        assert len(curve["accuracy"]) == 13 and len(curve["fidelity"][0]) == 4
        assert 0 <= curve["auc"] <= 1
        layers = [layer for layer, _ in curve["order"]]
        assert len(set(map(tuple, curve["order"]))) == 12
        assert sorted(layers) == sorted(list(range(4)) * 3)


def test_curve_takes_the_models_mixes_as_causal_without_a_check(small_model, monkeypatch):
    """The model masks every score above the diagonal: its mixes go to the minimax's early
    stop (causal operators only) without a pass that checks it."""
    module, params, examples, attn, weights = small_model
    mixed = jnp.stack([graphs.combine_heads(attn[:, i], weights[i]) for i in range(4)], 1)
    want = np.mean(metrics.minimax_fidelity(mixed, HORIZON), 0)
    for where in (metrics, metrics.operators):  # the public name and the kernels' own
        monkeypatch.setattr(where, "is_causal", lambda c: pytest.fail("causality checked"))
    masks = jnp.ones((1, 4, 4), jnp.float32)
    got = pruning_curves.curve(
        module, params, examples, weights, masks, HORIZON, MAX_STEPS, "reference"
    )
    np.testing.assert_allclose(got["fidelity"][0], want, rtol=1e-4)


def test_masks_that_read_one_stream_share_its_attention(tiny):
    """A group's masks only scale the heads' outputs: the softmax runs once on B x H x T x
    T for the whole group, not once per mask, and each mask's results are its own."""
    module, params = tiny
    stream = np.random.default_rng(2).standard_normal((4, 40, 8), np.float32)
    masks = [[1, 1, 1, 1], [0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 1, 1]]  # a group of 4, padded size
    masks = jnp.asarray(masks, jnp.float32)
    importance = jnp.asarray([0.1, 0.2, 0.3, 0.4])
    args = (module, params["layers_1"], stream, masks, importance)
    jaxpr = jax.make_jaxpr(pruning_curves._group_runs, static_argnums=0)(*args)
    exp_shapes = [
        eqn.outvars[0].aval.shape for eqn in _equations(jaxpr.jaxpr) if eqn.primitive.name == "exp"
    ]
    assert exp_shapes == [(4, 4, 40, 40)]  # one softmax, no mask axis
    out, mixed = pruning_curves._group_runs(*args)
    for g, mask in enumerate(masks):
        own_out, attn = apply_layer(module, params["layers_1"], stream, mask)
        np.testing.assert_allclose(out[g], own_out, rtol=1e-5, atol=1e-6)
        mix = graphs.combine_heads(attn, importance * mask)
        np.testing.assert_allclose(mixed[g], mix, rtol=1e-5, atol=1e-7)


def _equations(jaxpr):
    """Every equation of a jaxpr, those of its sub-jaxprs (jit, custom rules) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                yield from _equations(inner)


@pytest.fixture(scope="module")
def small_layer(tiny):
    """The small random model's layer 1, two input streams and five masks, read in an order
    that is not the streams' (masks 0, 2, 4 read stream 1; masks 1, 3 read stream 0)."""
    module, params = tiny
    streams = np.random.default_rng(4).standard_normal((2, 4, 40, 8), np.float32)
    inputs = np.array([1, 0, 1, 0, 1])
    masks = jnp.asarray(
        [[1, 1, 1, 1], [0, 1, 1, 0], [1, 0, 0, 1], [0, 0, 1, 0], [1, 1, 0, 1]], jnp.float32
    )
    importance = jnp.asarray([0.4, 0.1, 0.3, 0.2])
    return module, params["layers_1"], streams, inputs, masks, importance


@pytest.mark.parametrize(
    "group, inputs",
    [(16, None), (2, None), (16, [0, 1, 0, 1, 0])],
    ids=["one-group-a-stream", "groups-of-two", "first-group-padded"],
)
def test_layer_gives_each_mask_its_own_stream_in_mask_order(
    small_layer, group, inputs, monkeypatch
):
    """Whatever order the masks' input streams come in, and however the masks that read
    one stream are grouped, mask u's results are the layer on stream `inputs[u]` under
    mask u, in the order of the masks; also when a group other than the last is padded
    (three masks on stream 0 run as four), whose padding rows must not shift the next."""
    monkeypatch.setattr(pruning_curves, "MASK_GROUP", group)
    module, layer_params, streams, fixture_inputs, masks, importance = small_layer
    inputs = np.asarray(fixture_inputs if inputs is None else inputs)
    out, fid, hit = pruning_curves._layer(
        module, layer_params, streams, inputs, masks, importance, SPEC
    )
    assert out.shape == (5, 4, 40, 8) and fid.shape == hit.shape == (5,)
    mixes = []
    for u, mask in enumerate(masks):
        own, attn = apply_layer(module, layer_params, streams[inputs[u]], mask)
        np.testing.assert_allclose(out[u], own, rtol=1e-5, atol=1e-6)
        mixes.append(graphs.combine_heads(attn, importance * mask))
    # Scored four masks at a time (the last repeated): the 4 x 4 x 40 x 40 programs of
    # the curve tests.
    mixes = jnp.stack(mixes + mixes[-1:] * 3).reshape(2, 4, 4, 40, 40)
    fidelity = np.concatenate([metrics.minimax_fidelity(m, HORIZON) for m in mixes])
    hitting = np.concatenate([metrics.hitting_time(m, MAX_STEPS, SPEC[2]) for m in mixes])
    np.testing.assert_allclose(fid, np.mean(fidelity, -1)[:5], rtol=1e-5)
    np.testing.assert_allclose(hit, np.mean(hitting, -1)[:5], rtol=1e-5)


def test_layer_keeps_each_call_within_the_mix_budget(small_layer, monkeypatch):
    """No call holds more masks' mixes (B x T x T float32 each) than `MIX_BYTES` allows,
    even when `MASK_GROUP` would allow more."""
    module, layer_params, streams, inputs, masks, importance = small_layer
    monkeypatch.setattr(pruning_curves, "MASK_GROUP", 16)
    monkeypatch.setattr(pruning_curves, "MIX_BYTES", 2 * 4 * 40 * 40 * 4)  # two mixes
    sizes, run = [], pruning_curves._group_runs

    def counted(module, layer_params, stream, masks_GxH, importance_H):
        sizes.append(masks_GxH.shape[0])
        return run(module, layer_params, stream, masks_GxH, importance_H)

    monkeypatch.setattr(pruning_curves, "_group_runs", counted)
    pruning_curves._layer(module, layer_params, streams, inputs, masks, importance, SPEC)
    assert sorted(sizes) == [1, 2, 2]  # stream 1: masks 0, 2 | mask 4; stream 0: masks 1, 3


@pytest.mark.parametrize("batch,tokens", [(1, 8), (3, 12), (5, 100), (50, 100), (7, 900)])
@pytest.mark.parametrize("mix_bytes", [1, 3 * 2**20, 5 * 2**20, 256 * 2**20])
def test_padded_groups_never_take_a_call_over_the_mix_budget(monkeypatch, batch, tokens, mix_bytes):
    """The group limit is a power of two, at most `MASK_GROUP`, and the largest such
    whose mixes fit in `MIX_BYTES` (one mask when not even one fits): padding a group
    to a power of two cannot take it over the budget."""
    monkeypatch.setattr(pruning_curves, "MIX_BYTES", mix_bytes)
    limit = pruning_curves.group_limit(batch, tokens)
    per_mask = batch * tokens * tokens * 4
    fits = min(pruning_curves.MASK_GROUP, mix_bytes // per_mask)
    assert limit & (limit - 1) == 0 and 1 <= limit <= max(1, fits) < 2 * limit
    for size in range(1, limit + 1):
        padded = len(pruning_curves._padded(np.arange(size)))
        assert padded <= limit and (padded * per_mask <= mix_bytes or limit == 1)


@pytest.mark.parametrize("size", range(1, 18))
def test_groups_are_padded_to_the_next_power_of_two_with_their_last_member(size):
    group = np.arange(size) + 7
    padded = pruning_curves._padded(group)
    n = len(padded)
    assert n & (n - 1) == 0 and size <= n < 2 * size  # the smallest power of two >= size
    np.testing.assert_array_equal(padded[:size], group)
    assert np.all(padded[size:] == group[-1])
