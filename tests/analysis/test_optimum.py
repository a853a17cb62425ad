"""The corpus optimum's plan: which windows each fold holds and is searched on, kept with
the weights so that a resumed run measures the rest with the same mixes."""

import json
import types

import numpy as np
import pytest

from beyondpar import measure
from beyondpar.analysis import corpus, optimum


def test_a_single_window_is_not_held_out():
    found = optimum.plan(1, 2, 8, [0, 1])
    assert found["folds"] == [[0, 1]] and found["search_windows"] == [[0]]
    assert found["held_out"] is False
    assert optimum.plan(2, 2, 8, [0])["held_out"] is True


def stub_model(num_windows: int, num_layers: int):
    """What `corpus_optimum` reads before a search: the layer count and the windows."""
    module = types.SimpleNamespace(config=types.SimpleNamespace(num_layers=num_layers))
    return module, types.SimpleNamespace(tokens=np.zeros((num_windows, 8), np.int32))


def test_weights_searched_on_other_windows_of_the_same_folds_are_refused(tmp_path):
    module, corpus_windows = stub_model(6, 2)
    spec = measure.MeasureSpec(optimal_weights=True, folds=2)
    stored = optimum.plan(6, 2, 3, [0, 1])  # three search windows per fold
    (tmp_path / optimum.OPTIMAL_FILE).write_text(json.dumps(stored))
    fewer = corpus.CorpusSpec(tokens=8, search_windows=2)
    assert optimum.plan(6, 2, 2, [0, 1])["folds"] == stored["folds"]
    listed = r"\(search_windows: \[\[3, 4, 5\], \[0, 1, 2\]\] -> \[\[3, 5\], \[0, 2\]\]\); "
    with pytest.raises(ValueError, match=f"other folds {listed}--max_windows"):
        optimum.corpus_optimum(module, None, corpus_windows, spec, fewer, tmp_path)
    same = corpus.CorpusSpec(tokens=8, search_windows=3)
    assert optimum.corpus_optimum(module, None, corpus_windows, spec, same, tmp_path) == stored


def test_a_damaged_weights_file_is_named(tmp_path):
    module, corpus_windows = stub_model(6, 2)
    spec = measure.MeasureSpec(optimal_weights=True, folds=2)
    path = tmp_path / optimum.OPTIMAL_FILE
    path.write_text(json.dumps(optimum.plan(6, 2, 3, [0, 1]))[:50])
    cspec = corpus.CorpusSpec(tokens=8, search_windows=3)
    with pytest.raises(ValueError, match=f"^{path} is not valid JSON"):
        optimum.corpus_optimum(module, None, corpus_windows, spec, cspec, tmp_path)


def test_each_window_is_measured_with_the_weights_of_its_own_folds_search():
    """Cross-fitting: the windows of fold f take fold f's weights (searched on windows
    outside f), layers never searched get uniform weights, and a plan that does not
    cover every window is refused."""
    found = {
        "folds": [[0, 2], [2, 5], [5, 6]],
        "layers": [1, 3],
        # F x L' x H: fold f, searched layer l -> weights marked by (f, l)
        "weights": [
            [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]],
            [[0.0, 1.0, 0.0], [0.0, 0.5, 0.5]],
            [[0.0, 0.0, 1.0], [0.5, 0.0, 0.5]],
        ],
    }
    got = optimum.per_window(found, "weights", 6, 4)
    assert got.shape == (6, 4, 3)
    want_fold = [0, 0, 1, 1, 1, 2]
    searched = np.asarray(found["weights"], np.float32)
    for window, fold in enumerate(want_fold):
        np.testing.assert_array_equal(got[window, [1, 3]], searched[fold])
        np.testing.assert_allclose(got[window, [0, 2]], np.full((2, 3), 1 / 3), rtol=1e-6)
    with pytest.raises(ValueError, match="must cover 7 windows, got 6"):
        optimum.per_window(found, "weights", 7, 4)


def test_the_corpus_search_scores_its_mix_at_the_analysis_horizon(tmp_path, monkeypatch):
    """A chain 0 -> 1 -> 2 with self-loops: token 0 reaches the sink's state only at step
    2 (share 1/4) and at step 3 holds 1/2, so the minimax fidelity of any mix of two
    copies of this head is 1/4 at horizon 2 and 1/2 at the default horizon of 100. The
    search must use the analysis' horizon, not the default."""
    chain = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]], np.float32)
    attn = np.broadcast_to(chain, (4, 2, 3, 3))  # B x H x T x T, both heads alike

    def layer_by_layer(module, params, tokens):
        yield 0, attn[: len(tokens)]

    monkeypatch.setattr(optimum.pretrained, "layer_by_layer", layer_by_layer)
    monkeypatch.setattr(optimum.pretrained, "place_tokens", lambda params, tokens: tokens)
    monkeypatch.setattr(
        optimum.pretrained, "head_importances", lambda module, params: np.ones((1, 2))
    )
    module, corpus_windows = stub_model(4, 1)
    cspec = corpus.CorpusSpec(tokens=3, search_windows=2)
    for horizon, want in ((2, 0.25), (100, 0.5)):
        spec = measure.MeasureSpec(horizon=horizon, optimal_weights=True, folds=2)
        out = tmp_path / str(horizon)
        out.mkdir()
        found = optimum.corpus_optimum(module, None, corpus_windows, spec, cspec, out, False)
        np.testing.assert_allclose(found["in_sample"], [[want], [want]], rtol=1e-5)


def test_the_summary_gives_each_layer_its_folds_values_and_weights():
    """Two folds and two searched layers (a square F x L' that a wrong axis would not
    trip over): per layer the in-sample mean over folds, each fold's value in fold order,
    and each fold's weights."""
    found = {
        "folds": [[0, 3], [3, 6]],
        "search_windows": [[3, 5], [0, 2]],
        "held_out": True,
        "layers": [1, 3],
        "in_sample": [[0.1, 0.2], [0.3, 0.6]],  # F x L'
        "weights": [[[1.0, 0.0], [0.25, 0.75]], [[0.0, 1.0], [0.5, 0.5]]],  # F x L' x H
    }
    got = optimum.summary(found)
    assert got["folds"] == [[0, 3], [3, 6]] and got["held_out"] is True
    assert got["in_sample"] == pytest.approx({"1": 0.2, "3": 0.4})
    assert got["in_sample_by_fold"] == {"1": [0.1, 0.3], "3": [0.2, 0.6]}
    assert got["weights"] == {"1": [[1.0, 0.0], [0.0, 1.0]], "3": [[0.25, 0.75], [0.5, 0.5]]}
    assert "in_sample_without_sink" not in got
