"""Cutting documents into windows of T tokens, and one window's record out of a batch:
counts and maps checked against hand-built documents and records."""

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from beyondpar import measure
from beyondpar.analysis import corpus, windowing


@dataclasses.dataclass
class _Encoding:
    ids: list[int]


class NumberTokenizer:
    """One token per whitespace-separated number, its id the number itself."""

    def encode(self, text):
        return _Encoding([int(w) for w in text.split()])


def _doc(name, first, length):
    return windowing.Document(name, " ".join(str(first + k) for k in range(length)))


def test_a_document_exactly_one_window_long_gives_a_window_and_is_not_short():
    """T = 4 over documents of 4, 5 and 3 tokens: the first two give one window each
    (the second drops 1 token), only the 3-token one is short (its 3 tokens dropped)."""
    docs = [_doc("a", 0, 4), _doc("b", 100, 5), _doc("c", 200, 3)]
    w = windowing.make_windows(docs, NumberTokenizer(), 4, None, 16)
    assert w.tokens.tolist() == [[0, 1, 2, 3], [100, 101, 102, 103]]
    assert w.document.tolist() == [0, 1]
    assert w.short_documents == 1
    assert w.dropped_tail_tokens == 1 + 3
    assert (w.total_windows, w.documents_used, w.num_documents) == (2, 2, 3)


def test_a_documents_windows_are_consecutive_and_do_not_overlap():
    """T = 4 over 13 tokens: windows 0-3, 4-7 and 8-11, each token in one window, in
    order, and the 13th token dropped."""
    w = windowing.make_windows([_doc("a", 0, 13)], NumberTokenizer(), 4, None, 16)
    assert w.tokens.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert w.document.tolist() == [0, 0, 0] and w.position.tolist() == [0, 1, 2]
    assert (w.dropped_tail_tokens, w.short_documents, w.total_windows) == (1, 0, 3)


@pytest.mark.parametrize("max_windows,used", [(1, 1), (2, 1), (3, 2), (4, 3), (9, 3)])
def test_documents_used_are_those_of_the_kept_windows(max_windows, used):
    """Documents of 8, 4 and 4 tokens at T = 4 give windows of documents 0, 0, 1, 2: the
    first `max_windows` of them use only the documents they come from, while the total
    and the dropped and short counts still describe the whole corpus."""
    docs = [_doc("a", 0, 8), _doc("b", 10, 4), _doc("c", 20, 4)]
    w = windowing.make_windows(docs, NumberTokenizer(), 4, max_windows, 16)
    kept = min(max_windows, 4)
    assert w.document.tolist() == [0, 0, 1, 2][:kept]
    assert w.position.tolist() == [0, 1, 0, 0][:kept]
    assert len(w.tokens) == kept and w.total_windows == 4
    assert w.documents_used == used
    assert (w.dropped_tail_tokens, w.short_documents) == (0, 0)


def test_a_windows_position_counts_its_documents_earlier_windows():
    """Windows come document by document, so a window's position is how many windows of
    its document come before it, whatever the documents' ids (a short one is skipped)."""
    assert windowing.positions([0, 0, 0, 2, 2, 5]).tolist() == [0, 1, 2, 0, 1, 0]
    assert windowing.positions([3]).tolist() == [0]
    assert windowing.positions([]).tolist() == []


def test_a_window_as_long_as_the_models_context_is_allowed():
    """T equal to the context fits the model; one token more is refused."""
    docs = [_doc("a", 0, 7)]
    w = windowing.make_windows(docs, NumberTokenizer(), 6, None, 6)
    assert w.tokens.tolist() == [[0, 1, 2, 3, 4, 5]] and w.dropped_tail_tokens == 1
    with pytest.raises(ValueError, match="--tokens=7 is longer than the model's context of 6"):
        windowing.make_windows(docs, NumberTokenizer(), 7, None, 6)


@pytest.mark.parametrize("max_windows", [0, -1, 2.5, "3", True])
def test_a_window_count_that_is_not_a_positive_integer_is_named(max_windows):
    """--max_windows takes a count: a fraction or a string fails with the flag's name and
    value before any document is tokenised, not with a TypeError from a slice."""
    docs = [_doc("a", 0, 8)]
    with pytest.raises(
        ValueError, match=f"--max_windows must be an integer >= 1, got {max_windows!r}"
    ):
        windowing.make_windows(docs, NumberTokenizer(), 4, max_windows, 16)


def _batch_record():
    """A batch of 3 windows with 2 heads: window b's head values are 10 b + head, its
    rollout sink shares over 4 tokens have their smallest value neither first nor last."""
    heads = np.arange(3)[:, None] * 10.0 + np.arange(2)
    graph = {
        "heads": {"fidelity": heads},
        "mixes": {"uniform": {"fidelity": heads[:, 0] + 0.5, "gain": heads[:, 1] - 0.5}},
        "best_head_fidelity": heads.max(1),
        "sink_mass": np.array([0.1, 0.2, 0.3]),
        "pairwise_synergy": np.ones((2, 2)),
        "optimal": {"folds": [1, 2]},
    }
    layer = {**graph, "without_sink": {**graph, "sink_mass": np.array([0.4, 0.5, 0.6])}}
    share = np.array([[0.9, 0.3, 0.5, 0.7], [0.2, 0.8, 0.1, 0.6], [0.5, 0.4, 0.45, 0.6]])
    return {"layers": {0: layer, 3: layer}, "rollout": {"sink_share": share}}


@pytest.mark.parametrize("b", [0, 1, 2])
def test_a_window_record_is_its_row_of_the_batch(b):
    """Window b's record holds row b of every per-window field, in both graphs, keyed by
    the layer as a string; the rollout's network fidelity is the smallest sink share over
    the window's tokens and the first token's share is that of token 0."""
    line = corpus.window_record(_batch_record(), b)
    assert sorted(line["layers"]) == ["0", "3"]
    layer = line["layers"]["3"]
    assert layer["heads"]["fidelity"] == [10.0 * b, 10.0 * b + 1]
    assert layer["mixes"]["uniform"] == {"fidelity": 10.0 * b + 0.5, "gain": 10.0 * b + 0.5}
    assert layer["best_head_fidelity"] == 10.0 * b + 1
    assert layer["sink_mass"] == pytest.approx([0.1, 0.2, 0.3][b])
    assert layer["without_sink"]["sink_mass"] == pytest.approx([0.4, 0.5, 0.6][b])
    assert "pairwise_synergy" not in layer and "optimal" not in layer
    assert "pairwise_synergy" not in layer["without_sink"]
    fidelity, first = [(0.3, 0.9), (0.1, 0.2), (0.4, 0.5)][b]
    assert line["rollout"] == {
        "network_fidelity": pytest.approx(fidelity),
        "first_token_share": pytest.approx(first),
    }


@pytest.mark.parametrize("tokens", [1, 0, 4.0, True])
def test_a_window_length_that_is_not_an_integer_of_two_or_more_is_named(tokens):
    """A window needs a sink and at least one token before it: --tokens below 2, or not
    an integer, fails with the flag's name and value before any document is cut."""
    docs = [_doc("a", 0, 8)]
    with pytest.raises(
        ValueError, match=re.escape(f"--tokens must be an integer >= 2, got {tokens!r}")
    ):
        windowing.make_windows(docs, NumberTokenizer(), tokens, None, 16)


@pytest.mark.parametrize(
    "name", ["batch_size", "pruning_windows", "pruning_points", "search_windows"]
)
@pytest.mark.parametrize("value", [0, -2, 1.5, True])
def test_a_corpus_count_that_is_not_a_positive_integer_is_named(name, value):
    with pytest.raises(ValueError, match=rf"--{name} must be an integer >= 1, got {value!r}"):
        corpus.CorpusSpec(tokens=8, **{name: value})
    assert getattr(corpus.CorpusSpec(tokens=8, **{name: 1}), name) == 1


HF = Path(__file__).parents[1] / "data" / "hf"


def _settings(tmp_path, model=HF / "gpt2-tiny", **changes):
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("1 2 3 4\n")
    cspec = corpus.CorpusSpec(**{"tokens": 4, **changes})
    return corpus._settings(str(model), corpus_file, cspec, measure.MeasureSpec(), None)


def test_a_rerun_on_a_model_changed_in_place_is_refused(tmp_path):
    """The settings hold the model's fingerprint, not only its path: another model copied
    over the same folder is another run."""
    model = tmp_path / "model"
    shutil.copytree(HF / "gpt2-tiny", model)
    out = tmp_path / "out"
    out.mkdir()
    first = _settings(tmp_path, model)
    corpus._check_settings(out, first)
    corpus._check_settings(out, _settings(tmp_path, model))  # the same files: accepted
    shutil.rmtree(model)
    shutil.copytree(HF / "gpt2-untied", model)
    with pytest.raises(ValueError, match="other settings .model_sha256: '[0-9a-f]{64}' -> "):
        corpus._check_settings(out, _settings(tmp_path, model))
    assert json.loads((out / corpus.SETTINGS_FILE).read_text()) == first


def test_settings_saved_without_a_model_fingerprint_take_the_models(tmp_path):
    wanted = _settings(tmp_path)
    older = {k: v for k, v in wanted.items() if k != "model_sha256"}
    (tmp_path / corpus.SETTINGS_FILE).write_text(json.dumps(older))
    corpus._check_settings(tmp_path, wanted)
    kept = json.loads((tmp_path / corpus.SETTINGS_FILE).read_text())
    assert kept["model_sha256"] == wanted["model_sha256"]


@pytest.mark.parametrize(
    "field,value",
    [
        ("batch_size", 3),
        ("pruning", True),
        ("pruning_windows", 5),
        ("pruning_points", 7),
        ("max_windows", 2),
    ],
)
def test_a_rerun_may_change_what_does_not_change_a_windows_numbers(tmp_path, field, value):
    """Batching, the pruning curves and the window cap leave every recorded window as it
    is: a rerun that changes one of them is accepted and its settings are kept."""
    corpus._check_settings(tmp_path, _settings(tmp_path))
    changed = _settings(tmp_path, **{field: value})
    corpus._check_settings(tmp_path, changed)
    kept = json.loads((tmp_path / corpus.SETTINGS_FILE).read_text())
    assert kept["corpus_spec"][field] == value


@pytest.mark.parametrize("field,value", [("search_windows", 3), ("tokens", 6)])
def test_a_rerun_that_changes_a_windows_numbers_is_refused(tmp_path, field, value):
    """The optimum's search windows and the window length change the numbers already
    recorded: a rerun with another value is refused, naming the field and both values."""
    first = _settings(tmp_path)
    corpus._check_settings(tmp_path, first)
    old = first["corpus_spec"][field]
    changed = _settings(tmp_path, **{field: value})
    with pytest.raises(ValueError, match=rf"corpus_spec\.{field}: {old} -> {value}"):
        corpus._check_settings(tmp_path, changed)
    assert json.loads((tmp_path / corpus.SETTINGS_FILE).read_text()) == first
