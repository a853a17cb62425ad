"""The heads' coalitions in the per-layer measurement: the fidelity game of the learned
mix, exact against sampled Shapley values, and the per-layer summary's picks."""

import dataclasses

import numpy as np
import pytest

from beyondpar import coalitions, measure
from beyondpar.measure import coalition_game, record

# Every measurement below on the same horizon and step count: each is a program.
SPEC = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False, coalitions=True)
# Two fixed mixes beside the learned and the uniform one: four mixes, measured by the
# program that measures the four heads.
EXTRA = {"first_pair": np.float32([1, 1, 0, 0]), "last_pair": np.float32([0, 0, 1, 1])}


@pytest.fixture(scope="module")
def layer(reference):
    """Layer 0 of the released 4-head copy model on 3 sequences (of 40 tokens)."""
    _, _, _, attn, weights = reference
    return attn[:3, 0, :, :48, :48].astype(np.float32), weights[0]


@pytest.fixture(scope="module")
def measured(layer):
    """The layer's measurement with its exact coalition game."""
    return measure.measure_layer(*layer, SPEC, extra=EXTRA)


def test_the_fidelity_game_is_the_learned_mix_of_every_coalition(layer, measured):
    attn, weights = layer
    found = measured
    games = found[record.COALITIONS]
    values = coalitions.values(attn, weights, objective="fidelity", horizon=20)
    np.testing.assert_allclose(
        games["shapley_fidelity"], coalitions.shapley(values), rtol=1e-5, atol=1e-6
    )
    # Efficiency: the Shapley values add up to the learned mix's fidelity (v(empty) = 0).
    learned = found["mixes"][record.LEARNED]["fidelity"]
    np.testing.assert_allclose(games["shapley_fidelity"].sum(-1), learned, rtol=1e-4, atol=1e-5)
    assert set(games) == {f for f in record.COALITION_FIELDS if f.endswith("_fidelity")}
    assert games["pair_dividends_fidelity"].shape == (3, 6)
    assert games["triple_dividends_fidelity"].shape == (3, 4)


def test_sampled_fidelity_shapley_is_the_exact_within_four_standard_errors(layer, measured):
    attn, weights = layer
    exact = measured[record.COALITIONS]
    sampled_spec = dataclasses.replace(SPEC, exact_coalition_heads=3, permutations=30)
    sampled = measure.measure_layer(attn, weights, sampled_spec, extra=EXTRA)[record.COALITIONS]
    assert set(sampled) == {"shapley_fidelity", "shapley_stderr_fidelity"}
    gap = np.abs(sampled["shapley_fidelity"] - exact["shapley_fidelity"])
    assert (gap <= 4 * sampled["shapley_stderr_fidelity"] + 1e-6).all()


def test_no_coalitions_unless_asked_and_none_of_one_head(layer):
    attn, weights = layer
    plain = dataclasses.replace(SPEC, coalitions=False)
    assert record.COALITIONS not in measure.measure_layer(attn, weights, plain, extra=EXTRA)
    assert record.COALITIONS not in measure.measure_layer(attn[:, :1], None, SPEC)


def test_summary_picks_the_strongest_dividends_by_their_mean():
    pairs = np.asarray([[0.1, -0.3, 0.5], [0.3, -0.1, 0.1]])  # pairs (0,1), (0,2), (1,2)
    fields = {
        "shapley_loss": np.asarray([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]),
        "shapley_stderr_loss": np.zeros((2, 3)),
        "interaction_loss": np.zeros((2, 3, 3)),
        "pair_dividends_loss": pairs,
        "negative_pair_share_loss": np.asarray([1 / 3, 1 / 3]),
        "triple_dividends_loss": np.asarray([[-0.2], [-0.4]]),
        "negative_triple_share_loss": np.asarray([1.0, 1.0]),
    }
    out = coalition_game.summarize(fields, "loss", coalition_game.normal_intervals)
    assert out["shapley"]["mean"] == [2.0, 2.0, 2.0]
    half = 1.96 * np.std([1.0, 3.0], ddof=1) / np.sqrt(2)
    assert out["shapley"]["low"][0] == pytest.approx(2.0 - half)
    assert out["strongest_positive_pair"]["heads"] == [1, 2]
    assert out["strongest_positive_pair"]["mean"] == pytest.approx(0.3)
    assert out["strongest_negative_pair"]["heads"] == [0, 2]
    assert out["strongest_negative_pair"]["mean"] == pytest.approx(-0.2)
    assert out["strongest_negative_triple"]["heads"] == [0, 1, 2]
    assert out["strongest_negative_triple"]["mean"] == pytest.approx(-0.3)
    assert out["negative_triple_share"]["mean"] == 1.0
