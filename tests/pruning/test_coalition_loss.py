"""The loss as the value of a coalition of one layer's heads: its ends against direct
masked losses, exact against sampled Shapley values, efficiency, and the record fields."""

import jax
import numpy as np
import pytest

from beyondpar import batches, coalitions, pruning
from beyondpar import model as model_lib
from beyondpar.measure import record
from beyondpar.pruning import coalition_loss

SMALL = dict(vocab_size=11, embed_dim=16, num_layers=2, mlp_dim=24, max_len=12)


@pytest.fixture(scope="module")
def small():
    """A 4-head, 2-layer model of the paper's family on 3 random sequences."""
    module = model_lib.Transformer(model_lib.ModelConfig(num_heads=4, **SMALL))
    params = model_lib.init_params(module, jax.random.PRNGKey(0))
    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (3, 12), 0, 11))
    targets = np.roll(tokens, -1, axis=1)
    return module, params, batches.Batch(tokens, targets, np.ones(tokens.shape, bool))


def direct_loss(small, mask_LxH):
    module, params, batch = small
    return np.asarray(
        pruning.sequence_losses(module, params, batch.inputs, batch.targets, mask_LxH)
    )


@pytest.mark.parametrize("layer", [0, 1])
def test_values_of_all_and_empty_are_the_direct_masked_losses(small, layer):
    module, params, batch = small
    values = coalition_loss.loss_values(module, params, batch, layer, max_tokens=180)
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
    fields = coalition_loss.layer_fields(module, params, batch, 1, coalition_loss.LossGameSpec())
    masked = np.ones((2, 4), np.float32)
    masked[1] = 0.0
    cost = direct_loss(small, masked) - direct_loss(small, np.ones((2, 4), np.float32))
    shapley = fields[record.coalition_field("shapley", "loss")]
    np.testing.assert_allclose(shapley.sum(-1), cost, atol=1e-5)
    assert set(fields) == {f for f in record.COALITION_FIELDS if f.endswith("_loss")}


def test_sampled_loss_shapley_is_the_exact_within_four_standard_errors(small):
    module, params, batch = small
    exact = coalition_loss.layer_fields(module, params, batch, 0, coalition_loss.LossGameSpec())
    sampled = coalition_loss.layer_fields(
        module, params, batch, 0, coalition_loss.LossGameSpec(exact_heads=3, permutations=40)
    )
    assert set(sampled) == {"shapley_loss", "shapley_stderr_loss"}
    mean, stderr = sampled["shapley_loss"], sampled["shapley_stderr_loss"]
    assert (stderr > 0).all()
    assert (np.abs(mean - exact["shapley_loss"]) <= 4 * stderr).all()


def test_pair_dividends_are_the_harsanyi_transform_of_the_loss_values(small):
    module, params, batch = small
    values = coalition_loss.loss_values(module, params, batch, 1)
    fields = coalition_loss.layer_fields(module, params, batch, 1, coalition_loss.LossGameSpec())
    dividends = np.asarray(coalitions.harsanyi(values))
    pairs = record.coalition_members(4, 2)
    want = [dividends[:, (1 << i) | (1 << j)] for i, j in pairs]
    np.testing.assert_allclose(fields["pair_dividends_loss"], np.stack(want, -1), atol=1e-6)
    share = (np.stack(want, -1) < 0).mean(-1)
    np.testing.assert_allclose(fields["negative_pair_share_loss"], share)
