"""Head masks and pruning: exact equivalences, gradient importance, greedy orders, curves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import graphs, metrics, pruning, tasks
from beyondpar import model as model_lib

SMALL = dict(vocab_size=11, embed_dim=16, num_layers=2, mlp_dim=24, max_len=12)
# One horizon for the greedy orders on the released model's attention: each horizon and
# each count of candidate mixes is a program of its own.
HORIZON = 50


@pytest.fixture(scope="module")
def small():
    module = model_lib.Transformer(model_lib.ModelConfig(num_heads=4, **SMALL))
    params = model_lib.init_params(module, jax.random.PRNGKey(0))
    tokens = np.random.default_rng(1).integers(0, 11, (3, 12), dtype=np.int32)
    return module, params, tokens


def test_all_ones_mask_is_the_model_bit_for_bit(small):
    module, params, tokens = small
    plain, attn = model_lib.apply_with_attention(module, params, tokens)
    masked, attn_masked = model_lib.apply_with_attention(module, params, tokens, np.ones((2, 4)))
    np.testing.assert_array_equal(masked, plain)
    np.testing.assert_array_equal(attn_masked, attn)
    per_sequence = module.apply({"params": params}, tokens, head_mask=jnp.ones((3, 2, 4)))
    np.testing.assert_array_equal(per_sequence, plain)


def scaled_out_kernel(params, layer, head, factor, head_dim=4):
    """Parameters with head `head`'s rows of layer `layer`'s output projection scaled."""
    params = jax.tree.map(lambda x: x, params)
    kernel = params[f"layers_{layer}"]["attn"]["out"]["kernel"]
    rows = slice(head * head_dim, (head + 1) * head_dim)
    params[f"layers_{layer}"]["attn"]["out"]["kernel"] = kernel.at[rows].multiply(factor)
    return params


@pytest.mark.parametrize("factor", [0.0, 0.5])
def test_mask_scales_the_heads_block_of_the_output_projection(small, factor):
    module, params, tokens = small
    mask = np.ones((2, 4))
    mask[1, 2] = factor
    masked, _ = model_lib.apply_with_attention(module, params, tokens, mask)
    edited = module.apply({"params": scaled_out_kernel(params, 1, 2, factor)}, tokens)
    np.testing.assert_allclose(masked, edited, rtol=1e-5, atol=1e-6)
    assert (
        np.abs(np.asarray(masked) - np.asarray(module.apply({"params": params}, tokens))).max()
        > 1e-4
    )


def test_per_sequence_masks_equal_separate_calls(small):
    module, params, tokens = small
    masks = np.ones((3, 2, 4))
    masks[0, 0, 1] = 0.0
    masks[2, 1, :3] = 0.0
    together = module.apply({"params": params}, tokens, head_mask=masks)
    for b in range(3):
        # The batch under sequence b's mask alone: row b is sequence b's separate call.
        alone = module.apply({"params": params}, tokens, head_mask=masks[b])
        np.testing.assert_allclose(together[b], alone[b], rtol=1e-6, atol=1e-6)
    # And other sequences under other masks beside it (the same shapes, so the same
    # programs): a sequence's output does not depend on the others in its batch.
    others = tokens.copy()
    others[:2] = np.random.default_rng(2).integers(0, 11, (2, 12))
    other_masks = np.stack([masks[2][::-1], np.zeros((2, 4)), masks[2]])
    beside = module.apply({"params": params}, others, head_mask=other_masks)
    np.testing.assert_allclose(together[2], beside[2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "mask,message",
    [
        (
            np.ones((2, 3)),
            r"head_mask must have shape \(L, H\) = \(2, 4\) or \(B, L, H\), got shape \(2, 3\)",
        ),
        (np.full((2, 4), 1.5), r"head_mask entries must be in \[0, 1\], got range \[1.5, 1.5\]"),
        (-np.ones((2, 4)), r"head_mask entries must be in \[0, 1\]"),
    ],
)
def test_bad_masks(small, mask, message):
    module, params, tokens = small
    with pytest.raises(ValueError, match=message):
        model_lib.apply_with_attention(module, params, tokens, mask)


@pytest.mark.float64
def test_gradient_importance_is_the_finite_difference(small):
    module, params, tokens = small
    params64 = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    examples = tasks.label("shift", tokens, 11, lag=2)
    got = np.asarray(pruning.gradient_importance(module, params64, examples))
    assert got.shape == (2, 4)
    step = 1e-5
    # One program for every bumped mask (run op by op, each operation compiles alone).
    losses = jax.jit(
        lambda m: pruning.sequence_losses(module, params64, examples.inputs, examples.targets, m)
    )
    for layer, head in [(0, 0), (1, 3)]:
        bump = np.zeros((2, 4))
        bump[layer, head] = step
        loss = lambda m: np.asarray(losses(m))
        diff = (loss(1 + bump) - loss(1 - bump)) / (2 * step)  # per sequence
        np.testing.assert_allclose(got[layer, head], np.mean(np.abs(diff)), rtol=1e-3)


def test_order_from_scores_normalises_per_layer_and_keeps_a_head():
    scores = np.array([[1.0, 2.0, 2.0], [10.0, 30.0, 40.0]])
    # Per layer L2: layer 0 -> (1, 2, 2) / 3; layer 1 -> (10, 30, 40) / 50.9...
    assert pruning.order_from_scores(scores) == [(1, 0), (0, 0), (1, 1), (0, 2)]
    masks = pruning.masks_along([(1, 0), (0, 0)], 2, 3)
    np.testing.assert_array_equal(masks[0], 1.0)
    np.testing.assert_array_equal(masks[2], [[0, 1, 1], [0, 1, 1]])


def test_greedy_sequences_record_the_fidelity_each_removal_loses(reference):
    """Each entry is the mean fidelity of the layer's learned mix of the heads alive
    before the removal minus that after it: losses are positive where fidelity drops and
    sum to the full mix's fidelity minus that of the head kept."""
    _, _, _, attn, weights = reference
    per_layer = pruning.greedy_sequences(attn, weights, horizon=HORIZON)

    def fidelity(layer, alive):
        mixed = graphs.combine_heads(attn[:, layer], weights[layer] * alive)
        return float(np.mean(metrics.minimax_fidelity(mixed, HORIZON)))

    for layer, sequence in enumerate(per_layer):
        alive = np.ones(4)
        for lost, at, head in sequence:
            before = fidelity(layer, alive)
            alive[head] = 0.0
            assert at == layer
            assert lost == pytest.approx(before - fidelity(layer, alive), abs=1e-5)
        total = sum(lost for lost, _, _ in sequence)
        whole = fidelity(layer, np.ones(4))
        assert total == pytest.approx(whole - fidelity(layer, alive), abs=1e-5)


def test_heads_left_without_importance_are_mixed_uniformly(reference):
    """Once the only head with importance is removed, the heads left have no learned
    weight: each later mix weighs the heads still alive equally, never a removed one."""
    _, _, _, attn, weights = reference
    attn, weights = attn[:, :1], weights[:1]  # one layer
    alone = [float(np.mean(metrics.minimax_fidelity(attn[:, 0, h], HORIZON))) for h in range(4)]
    weak = int(np.argmin(alone))
    importances = np.where(np.arange(4) == weak, weights, 0.0)
    (sequence,) = pruning.greedy_sequences(attn, importances, horizon=HORIZON)
    assert weak in [head for _, _, head in sequence]  # the uniform mixes are reached

    def fidelity(alive):
        w = importances[0] * alive
        mixed = graphs.combine_heads(attn[:, 0], w if w.sum() > 0 else alive)
        return float(np.mean(metrics.minimax_fidelity(mixed, HORIZON)))

    alive = np.ones(4)
    for lost, _, head in sequence:
        before = fidelity(alive)
        alive[head] = 0.0
        assert lost == pytest.approx(before - fidelity(alive), abs=1e-5)


def test_greedy_sequences_of_layers_split_over_devices_are_each_layer_alone(reference):
    """Four layers on the tests' four devices (one each) give every layer the sequence
    it has alone (one layer, on one device)."""
    _, _, _, attn, weights = reference
    together = pruning.greedy_sequences(attn, weights, horizon=HORIZON)
    for layer in range(4):
        alone = pruning.greedy_sequences(attn[:, [layer]], weights[[layer]], horizon=HORIZON)[0]
        assert [head for _, _, head in alone] == [head for _, _, head in together[layer]]
        lost_alone = [lost for lost, _, _ in alone]
        lost_together = [lost for lost, _, _ in together[layer]]
        np.testing.assert_allclose(lost_together, lost_alone, rtol=1e-5, atol=1e-7)


def test_greedy_fidelity_order_takes_the_cheapest_head_first(reference):
    module, params, examples, attn, weights = reference
    order = pruning.fidelity_order(attn, weights, horizon=HORIZON)
    assert len(order) == 4 * 3 and len(set(order)) == 12
    for layer in range(4):
        kept = [h for h in range(4) if (layer, h) not in order]
        assert len(kept) == 1
        first = next(h for l_, h in order if l_ == layer)
        candidates = []
        for drop in range(4):
            w = weights[layer] * (np.arange(4) != drop)
            mixed = graphs.combine_heads(attn[:, layer], w)
            candidates.append(float(np.mean(metrics.minimax_fidelity(mixed, HORIZON))))
        assert first == int(np.argmax(candidates))


def test_greedy_sequences_check_causality_once(reference, monkeypatch):
    """Every candidate is a mix of the checked heads: one pass over the attention tells
    they are causal, not one per round of candidates."""
    _, _, _, attn, weights = reference
    seen = []
    real = metrics.is_causal
    count = lambda c: seen.append(c.shape) or real(c)
    for where in (metrics, metrics.operators):  # the public name and the kernels' own
        monkeypatch.setattr(where, "is_causal", count)
    pruning.greedy_sequences(attn, weights, horizon=HORIZON)
    assert seen == [attn.shape]


@pytest.mark.parametrize("horizon", [0, -1, 2.5, True])
@pytest.mark.parametrize("order", [pruning.greedy_sequences, pruning.fidelity_order])
def test_greedy_orders_reject_a_horizon_that_is_not_a_positive_integer(order, horizon):
    """A fidelity within no step is 0 for every mix, so every removal would look free: a
    horizon that is not an integer >= 1 is an error naming it, not a zero-loss order."""
    heads = np.array([[[1, 0], [0.2, 0.8]], [[1, 0], [0.6, 0.4]]], np.float32)
    attn = heads[None, None]  # one sequence, one layer, two heads of two tokens
    with pytest.raises(ValueError, match=rf"horizon must be an integer >= 1, got {horizon!r}"):
        order(attn, np.ones((1, 2)), horizon=horizon)


@pytest.mark.parametrize("order", [pruning.greedy_sequences, pruning.fidelity_order])
def test_greedy_orders_name_attention_whose_rows_do_not_sum_to_one(order):
    heads = np.array([[[1, 0], [0.2, 0.8]], [[1, 0], [0.6, 0.6]]], np.float32)
    with pytest.raises(ValueError, match=r"^attn rows must sum to 1"):
        order(attn=heads[None, None], importances=np.ones((1, 2)), horizon=5)


def test_greedy_orders_default_to_a_horizon_of_100_steps():
    """Slowly mixing heads (strong self-attention) whose order within 10 steps differs
    from that within 100: both greedy functions look 100 steps ahead unless told."""
    rng = np.random.default_rng(5)  # two layers of two heads (a round of mixes each)
    heads = np.tril(rng.random((1, 2, 2, 12, 12)) ** 4) + 20.0 * np.eye(12)
    attn = (heads / heads.sum(-1, keepdims=True)).astype(np.float32)
    weights = rng.random((2, 2))
    within_100 = pruning.fidelity_order(attn, weights, horizon=100)
    assert within_100 != pruning.fidelity_order(attn, weights, horizon=10)
    assert pruning.fidelity_order(attn, weights) == within_100
    assert pruning.merge_sequences(pruning.greedy_sequences(attn, weights)) == within_100


def test_orders_rank_each_order_by_its_own_scores():
    projection = np.array([[3.0, 1.0, 2.0], [1.0, 4.0, 9.0]])
    gradient = np.array([[1.0, 2.0, 3.0], [6.0, 5.0, 1.0]])
    sequences = [[(0.2, 0, 1), (0.5, 0, 2)], [(0.1, 1, 0), (0.3, 1, 2)]]
    got = pruning.orders(projection, gradient, sequences, seed=3)
    assert got["projection"] == [(1, 0), (0, 1), (1, 1), (0, 2)]
    assert got["gradient"] == [(1, 2), (0, 0), (0, 1), (1, 1)]
    assert got["fidelity"] == [(1, 0), (0, 1), (1, 2), (0, 2)]
    random = got["random"]
    assert len(set(random)) == 4 and sorted(layer for layer, _ in random) == [0, 0, 1, 1]
    assert pruning.orders(projection, gradient, sequences, seed=3)["random"] == random


def test_masked_scores_count_accuracy_on_predictable_positions_only(small):
    module, params, tokens = small
    # Four masks (as `attention_necessity` scores): one program serves both tests.
    masks = np.ones((4, 2, 4))
    masks[1, 1] = 0.0
    masks[2, 0, 1:] = 0.0
    masks[3] = 0.0
    logits = np.asarray(module.apply({"params": params}, tokens), np.float64)
    targets = logits.argmax(-1)
    targets[0, 0] = (targets[0, 0] + 1) % 11  # the one wrong prediction
    predictable = np.zeros(tokens.shape, bool)
    predictable[:, 1::2] = True
    predictable[0, 0] = True
    examples = tasks.Examples(tokens, jnp.asarray(targets), jnp.asarray(predictable))
    loss, accuracy = pruning.masked_scores(module, params, examples, masks)
    assert loss.shape == accuracy.shape == (4,)
    count = predictable.sum()
    assert accuracy[0] == pytest.approx((count - 1) / count)
    log_p = np.asarray(jax.nn.log_softmax(logits))
    picked = np.take_along_axis(log_p, targets[..., None], axis=-1)
    assert loss[0] == pytest.approx(-picked.mean(), rel=1e-5)
    for k in (1, 2, 3):
        masked = np.asarray(module.apply({"params": params}, tokens, head_mask=masks[k]))
        correct = (masked.argmax(-1) == targets) & predictable
        assert accuracy[k] == pytest.approx(correct.sum() / count)


def test_area_integrates_over_the_share_of_heads_pruned():
    assert pruning.area([1.0, 1.0, 0.2], [0, 1, 2], 4) == pytest.approx(0.4)
    assert pruning.area([0.5, 0.5], [0, 6], 6) == pytest.approx(0.5)


def test_attention_necessity_scores_each_layer_masked_alone(small):
    """Accuracy with every head, with none, and with layer l's heads masked (the others
    kept), each against the masked model run directly; the targets are the full model's
    own predictions, so it scores 1 and each masking shows what it loses."""
    module, params, tokens = small
    targets = np.asarray(module.apply({"params": params}, tokens)).argmax(-1)
    examples = tasks.Examples(tokens, jnp.asarray(targets), jnp.ones(tokens.shape, bool))

    def accuracy(mask):
        logits = np.asarray(module.apply({"params": params}, tokens, head_mask=mask))
        return float(np.mean(logits.argmax(-1) == targets))

    found = pruning.attention_necessity(module, params, examples)
    assert found["accuracy"] == 1.0 and found["chance"] == 1 / 11
    assert found["accuracy_without_heads"] == pytest.approx(accuracy(np.zeros((2, 4))))
    without_layer = [
        accuracy(np.ones((2, 4)) * (np.arange(2) != layer)[:, None]) for layer in (0, 1)
    ]
    assert found["accuracy_without_layer"] == pytest.approx(without_layer)
    assert len(set(without_layer + [1.0])) == 3  # the three maskings tell apart
