"""The analysis options off their defaults: the sink-token bound at its edge, per-sequence
and per-layer fixed mixes, mixes of the graph without the sink tokens, the number of
folds, the cross-head share of the learned mix, each layer's own greedy pruning order and
the shape fields of attention saved elsewhere."""

import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import graphs, measure, metrics, pretrained, pruning, synergy
from beyondpar.analysis import loss_pruning
from beyondpar.analysis import text as text_lib
from helpers.paths import DATA

HF = DATA / "hf"
SHORT = "Multi-head attention lets every head of a layer read the earlier tokens"
# Per (sequence, layer) head picked by the fixed mix "x": different off the diagonal, so a
# mix read from the sequence axis instead of the layer axis lands on another head.
FULL_HEADS = [[0, 1], [2, 3]]
INNER_HEADS = [[3, 2], [1, 0]]


def one_hot_mixes(heads_BxL, num_heads: int) -> np.ndarray:
    """(B, L, H) weights that put all of (sequence b, layer l) on head heads_BxL[b][l]."""
    return np.eye(num_heads, dtype=np.float32)[np.asarray(heads_BxL)]


@pytest.fixture(scope="module")
def gpt2_tiny():
    """(module, params, tokens): SHORT and SHORT reversed, two sequences of one length."""
    module, params, tokenizer = pretrained.load(HF / "gpt2-tiny")
    ids = tokenizer.encode(SHORT).ids
    return module, params, np.asarray([ids, ids[::-1]])


@pytest.fixture(scope="module")
def tiny_record(gpt2_tiny):
    module, params, tokens = gpt2_tiny
    h = module.config.num_heads
    spec = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False, sink_tokens=1)
    record = text_lib.analyze_tokens(
        module,
        params,
        tokens,
        spec,
        extra={"x": one_hot_mixes(FULL_HEADS, h)},
        extra_without_sink={"x": one_hot_mixes(INNER_HEADS, h)},
    )
    return record


def test_sink_tokens_may_leave_exactly_two_tokens():
    """k sink tokens of a T-token window leave T - k tokens: T - k = 2 is the smallest
    graph the analysis accepts, T - k = 1 is refused with the window named."""
    spec = measure.MeasureSpec(sink_tokens=3)
    spec.check_length(5)  # two tokens remain
    with pytest.raises(ValueError, match=r"less than the window minus 1 \(3\), got 3"):
        spec.check_length(4)
    with pytest.raises(ValueError, match=r"less than the window minus 1 \(3\), got 3"):
        measure.baselines(4, spec)


def test_per_sequence_mixes_of_each_layer_pick_their_own_head(tiny_record):
    """A one-hot mix of (sequence b, layer l) is that sequence's head at that layer: its
    fidelity is exactly that head's."""
    for layer in (0, 1):
        got = tiny_record["layers"][layer]
        for b in (0, 1):
            head = FULL_HEADS[b][layer]
            assert got["mixes"]["x"]["fidelity"][b] == pytest.approx(
                got["heads"]["fidelity"][b, head], rel=1e-5
            ), (layer, b)


def test_mixes_without_the_sink_use_their_own_weights_per_layer(tiny_record):
    """The graph without the sink tokens is mixed with the weights given for it, never the
    full graph's: a one-hot mix there scores exactly its own head on that graph."""
    for layer in (0, 1):
        inner = tiny_record["layers"][layer]["without_sink"]
        for b in (0, 1):
            head = INNER_HEADS[b][layer]
            assert inner["mixes"]["x"]["fidelity"][b] == pytest.approx(
                inner["heads"]["fidelity"][b, head], rel=1e-5
            ), (layer, b)
    # The sink-free graph of T - 1 tokens has its own baseline, 1 / (T - 1) for its sink.
    t = tiny_record["rollout"]["sink_share"].shape[-1]
    assert tiny_record["baseline_without_sink"]["fidelity"] == pytest.approx(1 / (t - 1), rel=1e-5)


def test_cross_head_share_is_measured_on_the_learned_mix():
    """The cross-head share is measured on the learned mix (the first), not on the uniform
    one: with unequal weights the two differ, and the record matches the learned one."""
    # The attention, horizon and walks of the folds test below: its per-head and mixed
    # sweeps are the programs compiled here.
    attn = graphs.random_causal(11, (6, 2), 6)
    weights = np.asarray([0.8, 0.2], np.float32)
    spec = measure.MeasureSpec(horizon=15, max_steps=15, pairwise=False)
    out = measure.measure_layer(attn, weights, spec)
    learned = np.asarray(synergy.cross_head_share(attn, weights, 15)).mean(-1)
    uniform = np.asarray(synergy.cross_head_share(attn, np.full(2, 0.5, np.float32), 15)).mean(-1)
    assert np.max(np.abs(learned - uniform)) > 1e-3  # the check below can tell them apart
    np.testing.assert_allclose(out["cross_head_share_mean"], learned, rtol=1e-4, atol=1e-7)


def test_optimum_is_cross_fitted_over_the_folds_asked_for():
    """Six sequences in three contiguous folds: every fold searched on the other four, one
    weight vector and one in-sample value per fold, each sequence mixed with its fold's."""
    attn = graphs.random_causal(11, (6, 2), 6)
    spec = measure.MeasureSpec(
        horizon=15, max_steps=15, pairwise=False, optimal_weights=True, folds=3
    )
    out = measure.measure_layer(attn, None, spec)
    o = out["optimal"]
    assert o["held_out"]
    assert o["fold"].tolist() == [0, 0, 1, 1, 2, 2]
    assert sorted(map(sorted, o["search_sets"])) == [[0, 1, 2, 3], [0, 1, 4, 5], [2, 3, 4, 5]]
    assert o["fold_weights"].shape == (3, 2) and o["in_sample"].shape == (3,)
    mixed = jnp.einsum("bh,bhij->bij", o["fold_weights"][o["fold"]], jnp.asarray(attn))
    np.testing.assert_allclose(
        out["mixes"]["optimal"]["fidelity"], metrics.minimax_fidelity(mixed, 15), rtol=1e-5
    )


def test_each_layers_greedy_order_uses_that_layers_importances(gpt2_tiny):
    """Layer by layer, the greedy fidelity order is the one found on all layers' attention
    at once with every layer's own projection norms as the starting weights."""
    module, params, tokens = gpt2_tiny  # `tiny_record`'s forward pass, compiled once
    imp = np.asarray(pretrained.head_importances(module, params))
    assert not np.allclose(imp[0], imp[1])  # layers differ: a swapped layer would show
    got = loss_pruning.fidelity_sequences(module, params, tokens, imp, 20)
    # The whole forward, not `layer_by_layer`, which `fidelity_sequences` itself runs.
    _, attn = pretrained.apply_with_attention(module, params, tokens)
    want = pruning.greedy_sequences(attn, imp, 20)
    assert len(got) == len(want) == module.config.num_layers
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        assert [(lay, head) for _, lay, head in g] == [(lay, head) for _, lay, head in w]
        assert all(lay == layer for _, lay, _ in g)
        np.testing.assert_allclose([x[0] for x in g], [x[0] for x in w], rtol=1e-4, atol=1e-6)


def test_attention_of_one_sequence_records_its_shape(tmp_path):
    """L x H x T x T attention saved elsewhere is one sequence: the record's layer, head
    and token counts are read from the right axes (here all different)."""
    attn = np.broadcast_to(graphs.uniform_causal(5), (2, 3, 5, 5)).astype(np.float32)
    path = tmp_path / "attn.npz"
    np.savez(path, attention=attn)
    spec = measure.MeasureSpec(horizon=10, max_steps=10, pairwise=False)
    record = text_lib.attention_record(path, spec)
    assert (record["num_layers"], record["num_heads"]) == (2, 3)
    assert (record["num_sequences"], record["seq_len"]) == (1, 5)
    # Every head is uniform causal: each layer scores the baseline of five tokens.
    np.testing.assert_allclose(
        record["layers"][1]["heads"]["fidelity"], np.full((1, 3), 1 / 5), rtol=1e-5
    )
