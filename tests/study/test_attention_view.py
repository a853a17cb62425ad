"""The attention an evaluation record carries for the study's page: the model's own
attention on the first evaluation sequence, every layer and head, within the packing's
stated precision; rows that sum to 1 before packing; each head's and each mix's flow to
the sink the kernels' value on that sequence; and long sequences pooled to the budget."""

from pathlib import Path

import jax
import numpy as np
import pytest

from beyondpar import checkpoints, graphs
from beyondpar import model as model_lib
from beyondpar.measure import record as schema
from beyondpar.reports import packing
from beyondpar.study import attention_view, config_lib, evaluate
from beyondpar.study import workdir as workdir_lib

# The model's attention as one compiled program (op by op, a forward pass compiles each of
# its many small operations on its own).
apply_with_attention = jax.jit(model_lib.apply_with_attention, static_argnums=0)


@pytest.fixture(scope="module")
def evaluated(one_epoch_run):
    """The one-epoch smoke run's record, and its model's attention (1, L, H, T, T) and
    learned weights (L, H) on the first evaluation sequence."""
    run = Path(one_epoch_run)
    record = evaluate.evaluate_checkpoint(run)
    config = evaluate.read_config(run)
    _, state = checkpoints.load(run / workdir_lib.CHECKPOINT_DIR)
    module = model_lib.Transformer(config_lib.model_config(config))
    inputs = evaluate.eval_examples(config, evaluate.EvalSpec.from_config(config)).inputs
    _, attn = apply_with_attention(module, state["params"], inputs[:1])
    weights = model_lib.head_importances(module, state["params"])
    return record, np.asarray(attn, np.float64), np.asarray(weights), np.asarray(inputs[0])


def test_record_holds_the_models_attention_on_the_first_sequence(evaluated):
    record, attn, _, tokens = evaluated
    view = record[attention_view.KEY]
    num_layers, num_heads, seq_len = record["layers"], record["heads"], record["seq_len"]
    assert (view["sequence"], view["pool"]) == (0, 1)
    assert view["labels"] == [str(int(t)) for t in tokens]
    assert sorted(view["layers"]) == [str(layer) for layer in range(num_layers)]
    # Rows are probabilities before packing: each sums to 1, nothing above the diagonal.
    np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(attn[0], 1) == 0)
    for layer in range(num_layers):
        packed = view["layers"][str(layer)]
        assert packed["shape"] == [num_heads, seq_len, seq_len]
        drawn = packing.decode(packed["attention"], packed["shape"])
        want = attn[0, layer]
        assert np.all(np.abs(drawn - want) <= packing.max_error(want) + 1e-7), layer
        assert np.abs(drawn.sum(-1) - 1).max() <= packing.max_error(want).sum(-1).max()


def test_flows_are_the_kernels_on_that_sequence(evaluated):
    """Each head's and each mix's flow to the sink, against the brute force in float64 on
    the model's float32 attention."""
    record, attn, weights, _ = evaluated
    horizon = record["evaluation"]["horizon"]
    for layer, packed in record[attention_view.KEY]["layers"].items():
        a = attn[0, int(layer)].astype(np.float32).astype(np.float64)  # as the model gives it
        heads = np.stack([_phi64(h, horizon) for h in a])
        # 3 significant digits: within half a unit of the third.
        np.testing.assert_allclose(packed["heads"]["values"], heads, rtol=5e-3, atol=1e-9)
        np.testing.assert_array_equal(packed["heads"]["worst_token"], heads.argmin(-1))
        uniform = np.full(a.shape[0], 1 / a.shape[0])
        assert list(packed["mixes"]) == ["learned", "uniform"]  # no optimum searched
        for name, w in (("learned", weights[int(layer)]), ("uniform", uniform)):
            want = _phi64(np.einsum("h,hij->ij", w / w.sum(), a), horizon).min()
            assert packed["mixes"][name]["worst_value"] == pytest.approx(float(want), rel=1e-4)


def _causal(seed, shape):
    """Random causal row-stochastic attention of `shape` (..., T, T), float64."""
    rng = np.random.default_rng(seed)
    w = np.exp(rng.normal(size=shape))
    w = np.where(np.tril(np.ones(shape[-2:], bool)), w, 0.0)
    return w / w.sum(-1, keepdims=True)


def test_a_sequence_beyond_the_budget_is_pooled_to_fit(monkeypatch):
    attn = _causal(0, (2, 3, 20, 20))  # L=2, H=3, T=20
    monkeypatch.setattr(attention_view, "BUDGET_BYTES", 6 * packing.triangle(7))
    weights = {"learned": np.full((2, 3), 1 / 3)}
    view = attention_view.sequence_view(attn, np.arange(20), weights, horizon=10)
    assert view["pool"] == 3  # 20 tokens in 7 blocks: 6 maps of 28 cells fit
    assert view["labels"][:2] == ["0-2 '0'", "3-5 '3'"]
    for layer, packed in view["layers"].items():
        assert packed["shape"] == [3, 7, 7]
        pooled = packing.pooled_attention(attn[int(layer)], 3)
        np.testing.assert_allclose(pooled.sum(-1), 1.0, atol=1e-6)
        drawn = packing.decode(packed["attention"], packed["shape"])
        assert np.all(np.abs(drawn - pooled) <= packing.max_error(pooled) + 1e-7)


def _phi64(c_TxT, horizon):
    """Node fidelity by brute force: max_{1<=t<=horizon} (e_sink^T C^t)[j], float64."""
    s, best = np.eye(c_TxT.shape[-1])[-1], np.full(c_TxT.shape[-1], -np.inf)
    for _ in range(horizon):
        s = s @ c_TxT
        best = np.maximum(best, s)
    return best


def test_first_sequence_shows_sequence_0_each_layer_with_its_own_mix_weights():
    n, layers, heads, tokens, horizon = 2, 2, 3, 5, 3
    attn = _causal(11, (n, layers, heads, tokens, tokens))
    inputs = np.array([[5, 9, 2, 7, 4], [1, 1, 1, 1, 1]])
    rng = np.random.default_rng(2)
    learned = rng.dirichlet(np.ones(heads), size=(n, layers))
    optimal = rng.dirichlet(np.ones(heads), size=(n, layers))
    mixes = {schema.LEARNED: learned, schema.OPTIMAL: optimal}
    view = attention_view.first_sequence(attn, inputs, mixes, horizon)
    assert view["sequence"] == 0 and view["pool"] == 1
    assert view["labels"] == ["5", "9", "2", "7", "4"]
    assert sorted(view["layers"]) == ["0", "1"]
    for layer in range(layers):
        got = view["layers"][str(layer)]
        a = attn[0, layer]
        assert got["shape"] == [heads, tokens, tokens]
        decoded = packing.decode(got["attention"], got["shape"])
        assert np.all(np.abs(decoded - a) <= packing.max_error(a) + 1e-7)
        heads_phi = np.stack([_phi64(h, horizon) for h in a])
        np.testing.assert_allclose(got["heads"]["worst_value"], heads_phi.min(-1), atol=1e-5)
        np.testing.assert_allclose(got["heads"]["values"], heads_phi, rtol=1e-2)  # 3 digits
        weights = {
            schema.LEARNED: learned[0, layer],
            schema.UNIFORM: np.full(heads, 1 / heads),
            schema.OPTIMAL: optimal[0, layer],
        }
        assert list(got["mixes"]) == list(weights)
        for name, w in weights.items():
            phi = _phi64(np.einsum("h,hij->ij", w, a), horizon)
            np.testing.assert_allclose(got["mixes"][name]["worst_value"], phi.min(), atol=1e-5)
            assert got["mixes"][name]["worst_token"] == int(phi.argmin())


def test_sequence_view_pools_the_papers_shapes_as_documented():
    # BUDGET_BYTES: 16 heads in 4 layers show 256 tokens in blocks of 3.
    layers, heads, tokens, pool = 4, 16, 256, 3
    uniform = np.asarray(graphs.uniform_causal(tokens))
    attn = np.broadcast_to(uniform, (layers, heads, tokens, tokens))
    view = attention_view.sequence_view(attn, np.arange(tokens), {}, horizon=2)
    assert view["pool"] == pool
    blocks = -(-tokens // pool)
    assert layers * heads * packing.triangle(blocks) <= attention_view.BUDGET_BYTES
    assert all(v["shape"] == [heads, blocks, blocks] for v in view["layers"].values())
    assert len(view["labels"]) == blocks
