"""Per-layer measures: the uniform-causal baseline field by field against an independent
float64 computation, mixes kept apart on the graph without the sink tokens, and the
optimum cross-fitted over the sequences of a layer."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import graphs, measure, metrics, pretrained, synergy
from beyondpar.analysis import text as text_lib
from beyondpar.measure import layer as layer_module
from helpers.paths import DATA

# One spec and one layer shape (B x H x T = 2 x 3 x 12) for the whole file, so that its
# tests share compiled kernels; horizon and step cap differ so that a mix-up shows.
SPEC = measure.MeasureSpec(horizon=17, max_steps=23, eps=0.3, pairwise=False)
SHAPE, T = (2, 3), 12
SINK_TOKENS = 2  # one number of sink tokens for the file: one graph without them, T - 2


def with_spec(**changes) -> measure.MeasureSpec:
    """The file's spec with some settings changed (sink tokens, weight search)."""
    return dataclasses.replace(SPEC, **changes)


@pytest.fixture(autouse=True)
def short_triangular(monkeypatch):
    """The triangular path (causal operators, by default only long ones) at T = 12 for every
    test: the test of every field checks the layer on it, and the other tests, whose numbers
    do not depend on the path, share its compiled kernels."""
    monkeypatch.setattr(metrics.fused, "TRIANGULAR_MIN_TOKENS", 8)
    monkeypatch.setattr(metrics.fused, "TRIANGULAR_SHARED_MIN_TOKENS", 8)


def numpy_node_fidelity(c, horizon: int) -> np.ndarray:
    """Node fidelity of operators `c` (... x T x T) in float64 by matrix powers: the most
    of token j that the sink's row of c^t holds over t = 1..horizon."""
    c = np.asarray(c, np.float64)
    power, best = np.broadcast_to(np.eye(c.shape[-1]), c.shape), np.zeros(c.shape[:-1])
    for _ in range(horizon):
        power = power @ c
        best = np.maximum(best, power[..., -1, :])
    return best


def numpy_fields(c, horizon: int, max_steps: int, eps: float) -> dict:
    """Every per-operator field of one operator `c` (T x T), in float64 from the
    definitions: matrix powers for fidelity, the two forward walks built column by column,
    the spectral radius from the eigenvalues of the walk without the sink."""
    c = np.asarray(c, np.float64)
    t = len(c)
    best = numpy_node_fidelity(c, horizon)
    mass = c.sum(0)
    walks = {"normalized": c.T / mass[:, None]}
    cum = np.minimum(1.0, np.cumsum(c, axis=0))  # reference: clipped column mass
    ref = np.diff(cum, axis=0, prepend=0.0).T
    ref[:, -1] += 1.0 - cum[-1]
    walks["reference"] = ref
    out = {
        "fidelity": best.min(),
        "fidelity_median": np.median(best),
        "fidelity_p10": np.percentile(best, 10),
    }
    for name, p in walks.items():
        q = p[:-1, :-1]
        survival, total, tv = np.ones(t - 1), 0.0, max_steps + 1
        for step in range(max_steps):
            total += survival.sum()
            survival = q @ survival
            if survival.max() <= eps and tv > max_steps:
                tv = step + 1
        # The reference walk never leaves token 0 of causal attention (rho = 1): its
        # spectral estimate is capped at max_steps.
        rho = np.abs(np.linalg.eigvals(q)).max()
        spectral = max_steps if rho >= 1 else np.log(1 / eps) / np.log(1 / rho)
        out[f"hitting_time_{name}"] = total / t
        out[f"tv_mixing_time_{name}"] = tv
        out[f"spectral_mixing_time_{name}"] = min(spectral, max_steps)
        out[f"spectral_radius_{name}"] = rho
    return out


def numpy_baseline(t: int, horizon: int, max_steps: int, eps: float) -> dict:
    """Every baseline field: `numpy_fields` of uniform causal attention."""
    c = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    return numpy_fields(c, horizon, max_steps, eps)


@pytest.mark.parametrize("t", [10, T])
def test_baseline_is_uniform_causal_attention_field_by_field(t):
    got = measure.baseline(t, SPEC)
    want = numpy_baseline(t, SPEC.horizon, SPEC.max_steps, SPEC.eps)
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-5, err_msg=name)
    np.testing.assert_allclose(got["fidelity"], 1 / t, rtol=1e-5)  # the sink's own share


def test_without_sink_mixes_use_their_own_weights():
    attn = graphs.random_causal(3, SHAPE, T)  # B x H x T x T
    spec = with_spec(sink_tokens=SINK_TOKENS)
    one_hot = lambda h: np.eye(3, dtype=np.float32)[h]
    out = measure.measure_layer(
        attn, None, spec, extra={"x": one_hot(0)}, extra_without_sink={"x": one_hot(2)}
    )
    np.testing.assert_allclose(out["mixes"]["x"]["fidelity"], out["heads"]["fidelity"][:, 0])
    inner = out["without_sink"]
    np.testing.assert_allclose(inner["mixes"]["x"]["fidelity"], inner["heads"]["fidelity"][:, 2])
    # Learned weights beside "x": the mixes of the call above, in number and shape.
    alone = measure.measure_layer(attn, np.ones(3), spec, extra={"x": one_hot(0)})
    assert list(alone["without_sink"]["mixes"]) == ["learned", "uniform"]


@pytest.mark.parametrize("sink_tokens", [0, SINK_TOKENS])
def test_sink_mass_is_the_attention_on_the_dropped_tokens(sink_tokens):
    """Uniform causal attention puts min(k, i + 1) / (i + 1) of query i on the first k keys:
    the sink mass is its mean over queries, k the tokens dropped (the first token when
    none are)."""
    t = T
    attn = np.broadcast_to(graphs.uniform_causal(t), (*SHAPE, t, t))
    # Two mixes (learned and uniform), as in the other tests: the same compiled kernels.
    out = measure.measure_layer(attn, np.ones(3), with_spec(sink_tokens=sink_tokens))
    k = max(sink_tokens, 1)
    want = np.mean([min(k, i + 1) / (i + 1) for i in range(t)])
    np.testing.assert_allclose(out["sink_mass"], np.full(SHAPE, want), rtol=1e-6)


def test_per_sequence_mixes_weigh_each_sequence_with_its_own_weights():
    attn = graphs.random_causal(4, SHAPE, T)
    w = np.asarray([[1, 0, 0], [0, 0.5, 0.5]], np.float32)  # B x H
    out = measure.measure_layer(attn, None, SPEC, extra={"w": w})
    mixed = np.einsum("bh,bhij->bij", w, np.float64(attn))  # on the host: no program
    np.testing.assert_allclose(
        out["mixes"]["w"]["fidelity"], numpy_node_fidelity(mixed, SPEC.horizon).min(-1), rtol=1e-5
    )


def test_the_optimum_of_several_sequences_is_held_out():
    """Two sequences, two folds: each sequence's mix is searched on the other one alone
    (the file's layer shape, whose kernels the other tests compiled)."""
    attn = graphs.random_causal(8, SHAPE, T)
    out = measure.measure_layer(attn, np.ones(3), with_spec(optimal_weights=True))
    o = out["optimal"]
    assert o["held_out"] and o["fold"].tolist() == [0, 1]
    assert o["search_sets"] == [[1], [0]]
    assert not np.allclose(o["fold_weights"][0], o["fold_weights"][1], atol=1e-3)
    per_sequence = np.asarray(o["fold_weights"])[o["fold"]]
    # The references in float64 on the host, from the definition.
    fidelity = lambda c: numpy_node_fidelity(c, SPEC.horizon).min(-1)
    mixed = np.einsum("bh,bhij->bij", per_sequence, np.float64(attn))
    np.testing.assert_allclose(out["mixes"]["optimal"]["fidelity"], fidelity(mixed), rtol=1e-5)
    # In sample: each fold's weights on its own search set.
    sets = np.concatenate(o["search_sets"])
    own = np.einsum("bh,bhij->bij", np.asarray(o["fold_weights"]), np.float64(attn)[sets])
    np.testing.assert_allclose(o["in_sample"], fidelity(own), rtol=1e-5)
    best_head = out["heads"]["fidelity"][sets].max(-1)
    assert np.all(o["in_sample"] >= best_head - 1e-7)  # never worse than a head where searched


def test_one_sequence_has_nothing_to_hold_out():
    spec = with_spec(optimal_weights=True)
    out = measure.measure_layer(graphs.random_causal(2, (1, 3), T), None, spec)
    assert not out["optimal"]["held_out"]
    np.testing.assert_allclose(
        out["mixes"]["optimal"]["fidelity"], out["optimal"]["in_sample"], rtol=1e-5
    )


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(folds=0), "--folds must be an integer >= 1, got 0"),
        (dict(sink_tokens=-1), "--sink_tokens must be an integer >= 0, got -1"),
        (dict(residual=1.5), r"^--residual must be a number in \[0, 1\], got 1.5$"),
        (dict(residual=-0.1), r"^--residual must be a number in \[0, 1\], got -0.1$"),
        (dict(residual=float("nan")), r"^--residual must be a number in \[0, 1\], got nan$"),
    ],
)
def test_bad_spec_names_the_flag(bad, message):
    with pytest.raises(ValueError, match=message):
        measure.MeasureSpec(**bad)


def test_gain_is_over_the_best_head_and_cross_head_share_is_the_learned_mix():
    attn = graphs.random_causal(6, SHAPE, T)  # B x H x T x T
    learned = np.asarray([0.7, 0.2, 0.1], np.float32)
    best = np.argmax(numpy_node_fidelity(attn, SPEC.horizon).min(-1), -1)
    one_hot = np.eye(3, dtype=np.float32)[best]  # each sequence's best head as a mix
    out = measure.measure_layer(attn, learned, SPEC, extra={"best": one_hot})
    heads = out["heads"]["fidelity"]
    np.testing.assert_allclose(out["mixes"]["best"]["gain"], 0.0, atol=1e-6)
    for mix in out["mixes"].values():
        np.testing.assert_allclose(mix["gain"], mix["fidelity"] - heads.max(-1), atol=1e-7)
    share = synergy.cross_head_share(jnp.asarray(attn), jnp.asarray(learned), SPEC.horizon)
    np.testing.assert_allclose(out["cross_head_share_mean"], np.mean(share, -1), rtol=1e-5)


def test_cross_head_share_minimax_is_at_the_first_mixs_worst_served_token():
    """The minimax share is the cross-head share of the token the learned mix serves worst
    (least node fidelity), the token that sets its minimax fidelity."""
    attn = graphs.random_causal(7, SHAPE, T)
    learned = np.asarray([0.5, 0.3, 0.2], np.float32)
    out = measure.measure_layer(attn, learned, SPEC)
    k = SPEC.horizon
    share = np.asarray(synergy.cross_head_share(jnp.asarray(attn), jnp.asarray(learned), k))
    node = numpy_node_fidelity(np.einsum("h,bhij->bij", learned, attn), k)
    worst = np.argmin(node, -1)
    want = share[np.arange(len(worst)), worst]
    np.testing.assert_allclose(out["cross_head_share_minimax"], want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out["mixes"]["learned"]["fidelity"], node.min(-1), rtol=1e-5)


@pytest.mark.parametrize("sink_tokens", [0, SINK_TOKENS])
def test_baselines_are_uniform_causal_attention_of_each_windows_length(sink_tokens):
    """The baseline without the sink tokens is uniform causal attention over the T - k
    tokens left: its minimax fidelity is the sink's own share, 1 / (T - k)."""
    t = T  # and T - 2 without the sink tokens: the lengths of the field-by-field test
    spec = with_spec(sink_tokens=sink_tokens)
    got = measure.baselines(t, spec)
    np.testing.assert_allclose(got["baseline"]["fidelity"], 1 / t, rtol=1e-5)
    assert ("baseline_without_sink" in got) == (sink_tokens > 0)
    if sink_tokens:
        inner = got["baseline_without_sink"]
        np.testing.assert_allclose(inner["fidelity"], 1 / (t - sink_tokens), rtol=1e-5)
        assert inner == measure.baseline(t - sink_tokens, spec)


def test_every_field_is_the_definition_on_the_operator_it_names(monkeypatch):
    """Heads and mixes go through the kernels in separate calls; each field must still be
    its definition on its own head, its own mix, and on the graph without the sink
    tokens; the layer's causality is checked once for all of them (on the causal path)."""
    attn = graphs.random_causal(9, SHAPE, T)
    learned = np.asarray([0.5, 0.3, 0.2], np.float32)
    spec = with_spec(sink_tokens=SINK_TOKENS)
    checks = []
    real = metrics.is_causal
    for where in (metrics, metrics.operators):  # the public name and the kernels' own
        monkeypatch.setattr(where, "is_causal", lambda c: checks.append(1) or real(c))
    out = measure.measure_layer(attn, learned, spec)
    assert len(checks) == 1
    for where in (metrics, metrics.operators):
        monkeypatch.setattr(where, "is_causal", real)
    mixes = {"learned": learned, "uniform": np.full(3, 1 / 3, np.float32)}
    assert_fields_are_the_definitions(out, attn, mixes, spec)


def assert_fields_are_the_definitions(out, attn, mixes, spec):
    """Every field of `measure_layer`'s record, on the layer (and on the graph without its
    sink tokens, when measured), against `numpy_fields` of each head and each mix alone."""
    graphs_measured = [(out, attn)]
    if "without_sink" in out:
        dropped = graphs.drop_sink_tokens(attn, spec.sink_tokens)
        graphs_measured.append((out["without_sink"], dropped))
    for graph, a in graphs_measured:
        a32, a = np.asarray(a), np.asarray(a, np.float64)
        mixed = {m: np.einsum("h,bhij->bij", w / w.sum(), a) for m, w in mixes.items()}
        fields = lambda c: numpy_fields(c, spec.horizon, spec.max_steps, spec.eps)
        for b in range(a.shape[0]):
            for h in range(a.shape[1]):
                for name, want in fields(a[b, h]).items():
                    got = graph["heads"][name][b, h]
                    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"head {h} {name}")
            for mix, c in mixed.items():
                for name, want in fields(c[b]).items():
                    got = graph["mixes"][mix][name][b]
                    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{mix} {name}")
        np.testing.assert_allclose(graph["head_diversity"], synergy.head_diversity(a32), rtol=1e-5)
        np.testing.assert_array_equal(graph["best_head"], np.argmax(graph["heads"]["fidelity"], -1))


def test_a_layer_with_a_head_that_reads_later_tokens_is_not_causal():
    """Causality is a property of the whole layer: one head that reads later tokens
    (beside a causal first head) sends every head and mix down the general path, and
    each field is that of its head or mix measured alone, without a hint."""
    attn = graphs.random_causal(4, SHAPE, T)
    dense = np.random.default_rng(4).random((2, T, T)) ** 3
    attn[:, 1] = dense / dense.sum(-1, keepdims=True)
    assert metrics.is_causal(attn[:, 0]) and not metrics.is_causal(attn)
    learned = np.asarray([0.2, 0.5, 0.3], np.float32)
    spec = SPEC
    out = measure.measure_layer(attn, learned, spec)
    weights = np.stack([learned, np.full(3, 1 / 3, np.float32)])
    # With the sink signals, as the layer asks: the same programs, run without a hint.
    fields = lambda c: layer_module._operator_sweep(jnp.asarray(c), spec, signal=True)[0]
    mixed = fields(np.einsum("mh,bhij->bmij", weights, attn))
    for name, want in fields(attn).items():
        np.testing.assert_allclose(out["heads"][name], want, rtol=1e-5, err_msg=name)
        for i, mix in enumerate(("learned", "uniform")):
            got = out["mixes"][mix][name]
            np.testing.assert_allclose(got, mixed[name][:, i], rtol=1e-5, err_msg=f"{mix} {name}")
    np.testing.assert_allclose(out["head_diversity"], synergy.head_diversity(attn), rtol=1e-5)


def test_bad_mix_weights_are_named_by_their_argument():
    """A mix's weights that cannot be normalised name where they came from."""
    attn = graphs.random_causal(3, SHAPE, T)
    with pytest.raises(ValueError, match=r"weights_H must not be all zero"):
        measure.measure_layer(attn, np.zeros(3), SPEC)
    with pytest.raises(ValueError, match=r"extra\['mine'\] must be non-negative, got minimum -1"):
        measure.measure_layer(attn, None, SPEC, extra={"mine": [1.0, -1.0, 1.0]})


def test_rollout_of_a_model_weighs_the_residual_and_multiplies_later_layers_on_the_left():
    """The rollout kept while a model runs layer by layer is R = A~_L ... A~_1 with
    A~_l = r I + (1 - r) C_l (C_l the layer's learned mix): checked in float64 against
    the sink's row of that product, at r = 0.2, where swapping r and 1 - r shows."""
    model = DATA / "hf" / "gpt2-tiny"
    module, params, _ = pretrained.load(model)
    ids = np.asarray([[5, 17, 3, 42, 8, 11, 29, 2, 7, 13, 21, 34]])  # T tokens: the baseline's
    residual = 0.2
    spec = with_spec(layers=(), residual=residual)  # the rollout alone: no layer measured
    record = text_lib.analyze_tokens(module, params, ids, spec)
    assert record["layers"] == {}
    # Each layer's attention as the analysis reads it (the model's forward: test_model).
    layers = pretrained.layer_by_layer(module, params, ids)
    attn = np.stack([np.asarray(a, np.float64)[0] for _, a in layers])  # L x H x T x T
    t = ids.shape[-1]
    product = np.eye(t)
    for layer in range(module.config.num_layers):
        kernel = np.asarray(params[f"h_{layer}"]["c_proj"]["kernel"])
        w = np.asarray(graphs.head_importance(kernel, module.config.num_heads), np.float64)
        mixed = np.einsum("h,hij->ij", w / w.sum(), attn[layer])
        product = (residual * np.eye(t) + (1 - residual) * mixed) @ product
    want = product[-1]
    np.testing.assert_allclose(want.sum(), 1.0, rtol=1e-6)
    got = record["rollout"]["sink_share"][0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(record["rollout"]["network_fidelity"][0], want.min(), rtol=1e-4)
