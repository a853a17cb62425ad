"""The coalition workflow's documented conventions on tiny inputs: the loss game's value
v(S) = L(layer masked) - L(only S kept) and its masks, the exact/sampled threshold, the
record's fields, the per-layer summary (strongest dividends, negative shares, intervals),
the games' windows and documents, and the report's numbering from 1."""

from types import SimpleNamespace

import numpy as np
import pytest

from beyondpar.analysis import coalition_summary, corpus
from beyondpar.measure import coalition_game, record
from beyondpar.pruning import coalition_loss
from beyondpar.reports import coalitions as report

HEAD_GAIN = np.array([0.5, 0.2, -0.1])  # loss each head restores when kept
MASKED_LOSS = 3.0  # every head of the layer masked


def _fake_losses(module, params, batch, layer, masks_KxH, max_tokens=8192, bar=None):
    """(B, K) losses of an additive model: each kept head lowers the loss by its gain."""
    masks = np.asarray(masks_KxH, np.float64)
    loss = MASKED_LOSS - masks @ HEAD_GAIN
    return np.tile(loss, (np.shape(batch.inputs)[0], 1))


def _model(num_heads=3):
    return SimpleNamespace(config=SimpleNamespace(num_heads=num_heads, num_layers=4))


def _batch(b=2):
    return SimpleNamespace(inputs=np.zeros((b, 4), np.int32), targets=np.zeros((b, 4), np.int32))


def test_coalition_masks_keep_the_set_bits():
    masks = coalition_loss.coalition_masks(3)
    assert masks.shape == (8, 3)
    np.testing.assert_array_equal(masks[0], [0, 0, 0])
    np.testing.assert_array_equal(masks[1], [1, 0, 0])
    np.testing.assert_array_equal(masks[6], [0, 1, 1])
    np.testing.assert_array_equal(masks[7], [1, 1, 1])


def test_layer_masks_touch_only_the_layer():
    masks = np.array([[0, 1, 0], [1, 0, 1]], np.float32)
    out = coalition_loss.layer_masks(masks, 2, 4)
    np.testing.assert_array_equal(out[:, 2], masks)
    for other in (0, 1, 3):
        np.testing.assert_array_equal(out[:, other], np.ones((2, 3)))


def test_loss_values_are_restored_loss(monkeypatch):
    monkeypatch.setattr(coalition_loss, "masked_losses", _fake_losses)
    values = coalition_loss.loss_values(_model(), None, _batch(), layer=1)
    expected = coalition_loss.coalition_masks(3) @ HEAD_GAIN  # v(S) = sum of S's gains
    assert values.shape == (2, 8)
    np.testing.assert_allclose(values[0], expected, atol=1e-6)
    assert values[0, 0] == 0.0


def test_sampled_value_fn_is_restored_loss(monkeypatch):
    monkeypatch.setattr(coalition_loss, "masked_losses", _fake_losses)
    value_fn = coalition_loss.loss_value_fn(_model(), None, _batch(), layer=1)
    masks = np.array([[1, 0, 0], [0, 1, 1], [0, 0, 0]], np.float32)
    np.testing.assert_allclose(value_fn(masks)[0], [0.5, 0.1, 0.0], atol=1e-6)


def test_loss_game_exact_at_the_threshold(monkeypatch):
    monkeypatch.setattr(coalition_loss, "masked_losses", _fake_losses)
    spec = coalition_loss.LossGameSpec(exact_heads=3, permutations=2)
    fields = coalition_loss.layer_fields(_model(3), None, _batch(), 1, spec)
    assert record.coalition_field("pair_dividends", "loss") in fields
    np.testing.assert_allclose(fields["shapley_loss"][0], HEAD_GAIN, atol=1e-5)


def _attention(b=1, h=2, t=4, seed=0):
    x = np.random.default_rng(seed).normal(size=(b, h, t, t))
    x = np.where(np.tril(np.ones((t, t), bool)), x, -np.inf)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def test_fidelity_game_exact_at_the_threshold():
    fields = coalition_game.fidelity_fields(_attention(), None, 2, 2, 2, None)
    assert record.coalition_field("pair_dividends", "fidelity") in fields


def test_sampled_fields_keep_the_standard_errors():
    stderr = np.array([[0.1, 0.2]])
    fields = coalition_game.sampled_fields(np.array([[1.0, 2.0]]), stderr, "loss")
    np.testing.assert_array_equal(fields["shapley_stderr_loss"], stderr)


def test_zero_dividends_are_not_negative():
    values = (coalition_loss.coalition_masks(3) @ np.array([1.0, 2.0, 4.0]))[None]
    fields = coalition_game.game_fields(values, "loss")
    np.testing.assert_array_equal(fields["negative_pair_share_loss"], [0.0])
    np.testing.assert_array_equal(fields["negative_triple_share_loss"], [0.0])


def _fields(num_heads, pair, triple):
    """Two sequences' loss fields with the given mean dividends."""
    pair, triple = np.asarray(pair, float), np.asarray(triple, float)
    return {
        "shapley_loss": np.zeros((2, num_heads)),
        "shapley_stderr_loss": np.zeros((2, num_heads)),
        "pair_dividends_loss": np.stack([pair - 0.01, pair + 0.01]),
        "triple_dividends_loss": np.stack([triple - 0.01, triple + 0.01]),
        "negative_pair_share_loss": np.mean(np.stack([pair, pair]) < 0, -1),
        "negative_triple_share_loss": np.mean(np.stack([triple, triple]) < 0, -1),
    }


def test_strongest_dividends_name_their_heads():
    pair = [0.1, -0.3, 0.0, 0.7, 0.2, -0.1]  # (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
    triple = [0.0, 0.4, -0.6, 0.1]  # (0,1,2) (0,1,3) (0,2,3) (1,2,3)
    out = coalition_game.summarize(
        _fields(4, pair, triple), "loss", coalition_game.normal_intervals
    )
    assert out["strongest_positive_pair"]["heads"] == [1, 2]
    assert out["strongest_positive_pair"]["mean"] == pytest.approx(0.7)
    assert out["strongest_negative_pair"]["heads"] == [0, 2]
    assert out["strongest_positive_triple"]["heads"] == [0, 1, 3]
    assert out["strongest_positive_triple"]["mean"] == pytest.approx(0.4)
    assert out["strongest_negative_triple"]["heads"] == [0, 2, 3]


def test_normal_intervals_are_ordered():
    out = coalition_game.normal_intervals({"x": np.array([[0.0, 1.0], [2.0, 5.0]])})["x"]
    assert all(lo < m < hi for lo, m, hi in zip(out["low"], out["mean"], out["high"], strict=True))


def test_game_intervals_use_the_first_windows_documents():
    blocks = {"x": np.array([1.0, 2.0, 3.0, 4.0])}
    documents = [0, 0, 1, 1, 2, 3, 4, 5]
    got = coalition_summary.intervals(0, documents)(blocks)
    want = coalition_summary.intervals(0, documents[:4])(blocks)
    assert got == want


def test_loss_game_plays_the_first_windows(monkeypatch):
    seen = {}

    def fake_games(module, params, tokens, layers, spec, progress=True):
        seen["windows"] = len(tokens)
        return {}

    monkeypatch.setattr(coalition_summary, "loss_games", fake_games)
    monkeypatch.setattr(coalition_summary, "summarize", lambda *a, **k: {})
    rows = {"coalitions": {"shapley_fidelity": [0.0, 0.0]}}
    records = [{"window": i, "layers": {"0": rows}} for i in range(5)]
    windows = SimpleNamespace(tokens=np.zeros((5, 4), np.int32))
    cspec = SimpleNamespace(coalition_windows=2, seed=0)
    corpus.coalitions(None, None, windows, records, cspec, None, progress=False)
    assert seen["windows"] == 2


def test_report_numbers_heads_and_intervals():
    assert report.members([0, 2]) == "1+3"
    assert report.interval({"mean": 1.0, "low": 0.5, "high": 2.0}) == "1.000 [0.500, 2.000]"
    stat = {"mean": [0.1, 0.2], "low": [0.0, 0.1], "high": [0.2, 0.3]}
    lines = report.section({"0": {"loss": {"shapley": stat}}})
    text = "\n".join(lines)
    assert "head 1" in text and "head 2" in text and "head 0" not in text
