"""The loss as the value of a coalition of one layer's heads: its ends against direct
masked losses, exact against sampled Shapley values, efficiency, and the record fields."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondpar import batches, coalitions, pretrained, pruning
from beyondpar import model as model_lib
from beyondpar.measure import record
from beyondpar.pretrained import layers
from beyondpar.pruning import coalition_loss, layer_slice
from helpers.hf_fixtures import HF, copy_checkpoint

SMALL = dict(vocab_size=11, embed_dim=16, num_layers=2, mlp_dim=24, max_len=12)
# Masked tokens per pass for the small model: 5 masks of 3 sequences, so that every game
# below (16 coalitions or a sample of them) runs the same programs, in passes (the last
# one padded).
MAX_TOKENS = 180
ORDERS = 40  # sampled orders of every sampled game below


@pytest.fixture(scope="module")
def small():
    """A 4-head, 2-layer model of the paper's family on 3 random sequences."""
    module = model_lib.Transformer(model_lib.ModelConfig(num_heads=4, **SMALL))
    params = model_lib.init_params(module, jax.random.PRNGKey(0))
    tokens = np.random.default_rng(1).integers(0, 11, (3, 12), dtype=np.int32)
    targets = np.roll(tokens, -1, axis=1)
    return module, params, batches.Batch(tokens, targets, np.ones(tokens.shape, bool))


_direct = jax.jit(pruning.sequence_losses, static_argnums=0)
SPEC = coalition_loss.LossGameSpec(max_tokens=MAX_TOKENS)


def direct_loss(small, mask_LxH):
    module, params, batch = small
    return np.asarray(_direct(module, params, batch.inputs, batch.targets, mask_LxH))


@pytest.mark.parametrize("layer", [0, 1])
def test_values_of_all_and_empty_are_the_direct_masked_losses(small, layer):
    module, params, batch = small
    values = coalition_loss.loss_values(module, params, batch, layer, MAX_TOKENS)
    masked = np.ones((2, 4), np.float32)
    masked[layer] = 0.0
    whole = direct_loss(small, np.ones((2, 4), np.float32))
    np.testing.assert_allclose(values[:, 0], 0.0, atol=1e-6)
    np.testing.assert_allclose(values[:, -1], direct_loss(small, masked) - whole, atol=1e-5)
    # Coalition 0b0101 keeps heads 0 and 2 of the layer.
    kept = masked.copy()
    kept[layer, [0, 2]] = 1.0
    expected = direct_loss(small, masked) - direct_loss(small, kept)
    np.testing.assert_allclose(values[:, 0b0101], expected, atol=1e-5)


def test_shapley_of_the_loss_sums_to_what_masking_the_layer_costs(small):
    module, params, batch = small
    fields = coalition_loss.layer_fields(module, params, batch, 1, SPEC)
    masked = np.ones((2, 4), np.float32)
    masked[1] = 0.0
    cost = direct_loss(small, masked) - direct_loss(small, np.ones((2, 4), np.float32))
    shapley = fields[record.coalition_field("shapley", "loss")]
    np.testing.assert_allclose(shapley.sum(-1), cost, atol=1e-5)
    assert set(fields) == {f for f in record.COALITION_FIELDS if f.endswith("_loss")}


def test_sampled_loss_shapley_is_the_exact_within_four_standard_errors(small):
    module, params, batch = small
    exact = coalition_loss.layer_fields(module, params, batch, 0, SPEC)
    sampled = coalition_loss.layer_fields(
        module, params, batch, 0, dataclasses.replace(SPEC, exact_heads=3, permutations=ORDERS)
    )
    assert set(sampled) == {"shapley_loss", "shapley_stderr_loss"}
    mean, stderr = sampled["shapley_loss"], sampled["shapley_stderr_loss"]
    assert (stderr > 0).all()
    assert (np.abs(mean - exact["shapley_loss"]) <= 4 * stderr).all()


def test_pair_dividends_are_the_harsanyi_transform_of_the_loss_values(small):
    module, params, batch = small
    values = coalition_loss.loss_values(module, params, batch, 1, MAX_TOKENS)
    fields = coalition_loss.layer_fields(module, params, batch, 1, SPEC)
    dividends = np.asarray(coalitions.harsanyi(values))
    pairs = record.coalition_members(4, 2)
    want = [dividends[:, (1 << i) | (1 << j)] for i, j in pairs]
    np.testing.assert_allclose(fields["pair_dividends_loss"], np.stack(want, -1), atol=1e-6)
    share = (np.stack(want, -1) < 0).mean(-1)
    np.testing.assert_allclose(fields["negative_pair_share_loss"], share)


def test_masks_of_another_head_count_are_refused(small):
    module, params, batch = small
    with pytest.raises(ValueError, match=r"masks_KxH must have shape \(K, 4\), got \(2, 3\)"):
        coalition_loss.masked_losses(module, params, batch, 0, np.ones((2, 3)))


def test_sampled_orders_are_seeded_by_the_seed_plus_the_layer(small):
    """Each layer draws its own permutations: layer 1 with seed 2 samples with key 3 (as
    many orders as the test above draws: one program draws both)."""
    module, params, batch = small
    spec = dataclasses.replace(SPEC, exact_heads=3, permutations=ORDERS, seed=2)
    fields = coalition_loss.layer_fields(module, params, batch, 1, spec)
    value_fn = coalition_loss.loss_value_fn(module, params, batch, 1, MAX_TOKENS)
    mean, stderr = coalitions.sampled_shapley(value_fn, 4, ORDERS, jax.random.PRNGKey(3))
    np.testing.assert_allclose(fields["shapley_loss"], mean, atol=1e-6)
    np.testing.assert_allclose(fields["shapley_stderr_loss"], stderr, atol=1e-6)


def test_coalition_masks_keep_the_heads_of_the_set_bits_in_the_given_layer_only():
    masks = coalition_loss.coalition_masks(3)
    np.testing.assert_array_equal(
        masks[[0, 1, 4, 6, 7]], [[0, 0, 0], [1, 0, 0], [0, 0, 1], [0, 1, 1], [1, 1, 1]]
    )
    out = coalition_loss.layer_masks(masks[[1, 6]], 0, 3)
    want = np.ones((2, 3, 3), np.float32)
    want[:, 0] = [[1, 0, 0], [0, 1, 1]]
    np.testing.assert_array_equal(out, want)


def test_the_sampled_games_value_fn_is_the_exact_games_values(small):
    """v(empty) = 0 and v(S) as `loss_values` gives it, whatever the coalitions asked."""
    module, params, batch = small
    exact = coalition_loss.loss_values(module, params, batch, 0, MAX_TOKENS)
    asked = [0, 5, 6, 11, 15]
    masks = coalition_loss.coalition_masks(4)[asked]
    got = coalition_loss.loss_value_fn(module, params, batch, 0, MAX_TOKENS)(masks)
    np.testing.assert_allclose(got[:, 0], 0.0, atol=1e-6)
    np.testing.assert_allclose(got, exact[:, asked], atol=1e-6)


# Equality with the whole model under each mask, in float64: the stream entering the layer
# computed once, then that layer and the later ones, must give the losses of the whole
# forward (`head_masking.sequence_losses`) for the first, a middle and the last layer.


def _deeper(name, tmp_path, prefix):
    """A three-layer copy of a two-layer fixture: layer 2 is layer 0 with every tensor
    times 0.8, so that a layer run twice, skipped or read from its neighbour shows."""

    def add_layer(weights):
        first = f"{prefix}.layers.0."
        extra = {
            k.replace(first, f"{prefix}.layers.2."): 0.8 * v
            for k, v in weights.items()
            if k.startswith(first)
        }
        return {**weights, **extra}

    return copy_checkpoint(name, tmp_path, {"num_hidden_layers": 3}, add_layer)


def _every_mask_directly(module, params, tokens, targets, layer):
    """(B, 2^H) losses of the whole forward under each coalition mask of `layer`."""
    masks = coalition_loss.layer_masks(
        coalition_loss.coalition_masks(module.config.num_heads), layer, module.config.num_layers
    )
    k, b = len(masks), len(tokens)
    losses = _direct(
        module, params, np.tile(tokens, (k, 1)), np.tile(targets, (k, 1)), np.repeat(masks, b, 0)
    )
    return np.asarray(losses).reshape(k, b).T


class _Float64Numpy:
    """`jax.numpy` whose float32 is float64: the families' attention and norms, float32
    whatever the parameters' dtype (as transformers' eager code), in float64. Their
    float32 products round by ~4e-8 in the loss, differently in programs of other shapes
    (the whole forward differs from itself as much between batch sizes)."""

    float32 = jnp.float64

    def __getattr__(self, name):
        return getattr(jnp, name)


@pytest.fixture
def float64_families(monkeypatch):
    """The families' layers wholly in float64 in this test: programs traced before or
    during it are dropped (they are cached by argument types, not by this switch)."""
    jax.clear_caches()
    monkeypatch.setattr(layers, "jnp", _Float64Numpy())
    yield
    jax.clear_caches()


def _check_every_layer(module, params, monkeypatch):
    tokens = np.random.default_rng(3).integers(0, 11, (3, 10))
    targets = np.roll(tokens, -1, axis=1)
    batch = batches.Batch(tokens, targets, np.ones(tokens.shape, bool))
    # Blocks of 7 logits' tokens (the last padded) and passes of 5 masks (the last padded).
    monkeypatch.setattr(layer_slice, "LOGITS_PER_BLOCK", 7 * module.config.vocab_size)
    for layer in range(module.config.num_layers):
        got = coalition_loss.masked_losses(
            module, params, batch, layer, coalition_loss.coalition_masks(4), max_tokens=150
        )
        want = _every_mask_directly(module, params, tokens, targets, layer)
        assert got.dtype == np.float64 and got.shape == want.shape == (3, 16)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10, err_msg=f"layer {layer}")


@pytest.mark.float64
def test_masked_losses_are_the_whole_models_in_float64_paper_model(small, monkeypatch):
    """Three layers: the small model's two and a third, layer 0 times 0.8 (as `_deeper`)."""
    module = model_lib.Transformer(model_lib.ModelConfig(num_heads=4, **{**SMALL, "num_layers": 3}))
    params = {**small[1], "layers_2": jax.tree.map(lambda p: 0.8 * p, small[1]["layers_0"])}
    params = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
    _check_every_layer(module, params, monkeypatch)


@pytest.mark.float64
@pytest.mark.parametrize(
    "name,prefix",
    [("llama-tiny", "model"), ("neox-tiny", "gpt_neox"), ("gemma2-pattern", None)],
)
def test_masked_losses_are_the_whole_models_in_float64_pretrained(
    name, prefix, tmp_path, monkeypatch, float64_families
):
    """Llama; GPT-NeoX's parallel residual; Gemma 2's scaled embeddings, soft-capped
    scores and logits, and alternating windows (three layers of its own)."""
    folder = HF / name if prefix is None else _deeper(name, tmp_path, prefix)
    module, params, _ = pretrained.load(folder, jnp.float64, progress=False)
    assert module.config.num_layers == 3 and module.config.num_heads == 4
    _check_every_layer(module, params, monkeypatch)
