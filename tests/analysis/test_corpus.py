"""Corpus analysis: documents and windows in a stated order, per-window records that
resume, bootstrap intervals, the loss-pruning curves, and one line for every bad input."""

import dataclasses
import json
import shutil
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from beyondpar import measure, pretrained, pruning
from beyondpar.analysis import corpus as corpus_lib
from beyondpar.analysis import (
    corpus_report,
    loss_pruning,
    optimum,
    series,
    statistics,
    windowing,
)
from beyondpar.analysis import text as text_lib
from beyondpar.base import files, parallel
from beyondpar.measure import record as measure_record
from helpers.launchers import launch_many
from helpers.paths import DATA

HF = DATA / "hf"
ROOT = Path(__file__).resolve().parents[2]
TEXT = DATA / "text" / "declaration.txt"
SPEC = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False)
# SPEC and batches of two windows as analyze.py flags: a command line measures what the
# tests in this process measure, with the programs they compiled (the compilation cache).
SPEC_FLAGS = ["--horizon=20", "--max_steps=20", "--nopairwise", "--batch_size=2"]


class WordTokenizer:
    """One token per whitespace-separated word: window counts in closed form."""

    class _Encoding:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, text):
        return self._Encoding([len(w) for w in text.split()])


def test_documents_of_each_corpus_kind(tmp_path):
    txt = tmp_path / "c.txt"
    txt.write_text("one two three\n\nfour five\n  \n\nsix\n")
    assert [d.text.strip() for d in windowing.read_documents(txt)] == [
        "one two three",
        "four five",
        "six",
    ]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(
        json.dumps({"text": "a b"}) + "\n\n" + json.dumps({"text": "c", "id": 2}) + "\n"
    )
    docs = windowing.read_documents(jsonl)
    assert [d.text for d in docs] == ["a b", "c"] and docs[1].source == f"{jsonl}:3"
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "b.txt").write_text("second\n\nstill second")
    (folder / "a.txt").write_text("first")
    (folder / "skip.md").write_text("not a txt file")
    assert [d.text for d in windowing.read_documents(folder)] == ["first", "second\n\nstill second"]


def test_windows_are_consecutive_counted_and_cut_in_order():
    docs = [
        windowing.Document("a", "w " * 10),
        windowing.Document("b", "w " * 3),
        windowing.Document("c", "w " * 8),
    ]
    w = windowing.make_windows(docs, WordTokenizer(), 4, None, 100)
    assert w.tokens.shape == (4, 4) and w.document.tolist() == [0, 0, 2, 2]
    assert (w.dropped_tail_tokens, w.short_documents, w.total_windows) == (2 + 3 + 0, 1, 4)
    first = windowing.make_windows(docs, WordTokenizer(), 4, 3, 100)
    assert first.document.tolist() == [0, 0, 2] and first.total_windows == 4
    assert first.documents_used == 2 and first.num_documents == 3
    with pytest.raises(ValueError, match="no document of the corpus is as long as --tokens=11"):
        windowing.make_windows(docs, WordTokenizer(), 11, None, 100)
    with pytest.raises(ValueError, match="--tokens=64 is longer than the model's context of 32"):
        windowing.make_windows(docs, WordTokenizer(), 64, None, 32)
    with pytest.raises(ValueError, match="--max_windows must be an integer >= 1, got 0"):
        windowing.make_windows(docs, WordTokenizer(), 4, 0, 100)


def test_a_line_of_only_spaces_or_tabs_separates_documents(tmp_path):
    """A blank line is one with nothing but spaces or tabs on it: each such line between
    two paragraphs of a .txt corpus ends a document, so three paragraphs are three
    documents, each window of them owned by its own paragraph."""
    txt = tmp_path / "c.txt"
    txt.write_text("1 2 3 4\n \n5 6 7 8\n\t \n9 10 11 12\nstill third\n")
    docs = windowing.read_documents(txt)
    assert [d.text for d in docs] == ["1 2 3 4", "5 6 7 8", "9 10 11 12\nstill third\n"]
    assert {d.source for d in docs} == {str(txt)}
    w = windowing.make_windows(docs, WordTokenizer(), 4, None, 100)
    assert w.document.tolist() == [0, 1, 2] and w.num_documents == 3
    assert (w.dropped_tail_tokens, w.short_documents) == (2, 0)


def test_a_folders_fingerprint_changes_with_its_file_names_and_boundaries(tmp_path):
    """A folder's documents are its files: renaming a file, or moving text from one file
    into the other (the same bytes in all, cut elsewhere), gives other documents and so
    another fingerprint; the same files elsewhere, or a file that is not .txt beside
    them, give the same one."""

    def folder(name, files_text):
        path = tmp_path / name
        path.mkdir()
        for file_name, text in files_text.items():
            (path / file_name).write_text(text)
        return windowing.fingerprint(path)

    base = folder("base", {"a.txt": "one two", "b.txt": "three four"})
    assert folder("copy", {"a.txt": "one two", "b.txt": "three four"}) == base
    assert folder("extra", {"a.txt": "one two", "b.txt": "three four", "n.md": "x"}) == base
    assert folder("renamed", {"a.txt": "one two", "c.txt": "three four"}) != base
    assert folder("moved", {"a.txt": "one twothree", "b.txt": " four"}) != base
    assert folder("moved_back", {"a.txt": "one", "b.txt": " twothree four"}) != base
    single = tmp_path / "single"
    single.mkdir()
    (single / "a.txt").write_text("one two")
    (single / "b.txt").write_text("one two")
    assert windowing.fingerprint(single / "a.txt") != windowing.fingerprint(single / "b.txt")


def test_a_fingerprint_keeps_each_file_name_apart_from_its_bytes(tmp_path):
    """A file's name and its bytes are hashed with a separator between them, so a folder
    holding `a.txt` with "b.txt one" and one holding `a.txtb.txt` with " one" (the same
    characters in all, cut elsewhere) are different corpora with different fingerprints;
    so are the single files `x.txt` holding "y" and `x.tx` holding "ty"."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "a.txt").write_text("b.txt one")
    (second / "a.txtb.txt").write_text(" one")
    assert [d.text for d in windowing.read_documents(first)] == ["b.txt one"]
    assert [d.text for d in windowing.read_documents(second)] == [" one"]
    assert windowing.fingerprint(first) != windowing.fingerprint(second)
    (tmp_path / "x.txt").write_text("y")
    (tmp_path / "x.tx").write_text("ty")
    assert windowing.fingerprint(tmp_path / "x.txt") != windowing.fingerprint(tmp_path / "x.tx")


def test_a_folder_named_like_a_text_file_is_not_a_document(tmp_path):
    """A subfolder `sub.txt/` of a corpus folder is neither read nor fingerprinted: the
    corpus is the same as without it (its fingerprint once read the folder as a file)."""
    alone, beside = tmp_path / "alone", tmp_path / "beside"
    for folder in (alone, beside):
        folder.mkdir()
        (folder / "a.txt").write_text("one two three")
    (beside / "sub.txt").mkdir()
    (beside / "sub.txt" / "b.txt").write_text("four")
    assert [d.text for d in windowing.read_documents(beside)] == ["one two three"]
    assert windowing.fingerprint(beside) == windowing.fingerprint(alone)


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("empty.txt", b"\n\n  \n", "holds no document"),
        ("bad.jsonl", b'{"text": "ok"}\n{"text": \n', r"bad.jsonl:2 is not JSON"),
        ("notext.jsonl", b'{"text": "ok"}\n{"body": "x"}\n', r"notext.jsonl:2 must be an object"),
        ("blob.txt", b"GGUF\x00\x01\x02", r"--corpus .*blob.txt must be text, got binary"),
        ("latin.txt", "caf\xe9".encode("latin-1"), "must be UTF-8 text, got byte 0xe9 at offset 3"),
        ("data.csv", b"a,b\n", "must be a .txt file, a .jsonl file or a folder"),
    ],
)
def test_bad_corpora_are_named(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        windowing.read_documents(path)


@pytest.fixture(scope="module")
def baseline_calls():
    """The arguments of every uniform-baseline measurement during `corpus_run`."""
    return []


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory, baseline_calls):
    out = tmp_path_factory.mktemp("corpus")
    # Batches of 2 and 1: the shapes the mesh run, the in-sample values (3 search
    # windows, as 2 and 1) and the single windows below measure, compiled once for all.
    cspec = corpus_lib.CorpusSpec(
        tokens=24, max_windows=7, batch_size=2, pruning=True, pruning_windows=3, pruning_points=3
    )
    spec = measure.MeasureSpec(
        horizon=20, max_steps=20, pairwise=False, sink_tokens=1, optimal_weights=True
    )
    real = measure.baselines
    counted = lambda *args: baseline_calls.append(args) or real(*args)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(text_lib, "baselines", counted)
        patch.setattr(corpus_lib.measure, "baselines", counted)
        summary, windows = corpus_lib.run(HF / "llama-tiny", TEXT, cspec, spec, out, progress=False)
    corpus_report.write(summary, out)
    return out, summary, windows, cspec, spec


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def single_windows(corpus_run):
    """Windows 1 (fold 0) and 5 (fold 1) of the corpus run, each analysed alone with the
    plain spec and its fold's optimal weights as the fixed mix "o" (with and without the
    sink): {window: record}. The weights come from optimal_weights.json."""
    out, _, windows, _, _ = corpus_run
    found = json.loads((out / optimum.OPTIMAL_FILE).read_text())
    module, params, _ = pretrained.load(HF / "llama-tiny")
    plain = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False, sink_tokens=1)
    alone = {}
    for window, fold in ((1, 0), (5, 1)):
        alone[window] = text_lib.analyze_tokens(
            module,
            params,
            windows.tokens[window : window + 1],
            plain,
            extra={"o": np.asarray(found["weights"][fold])},  # L x H
            extra_without_sink={"o": np.asarray(found["weights_without_sink"][fold])},
        )
    return alone


def test_window_records_are_the_single_window_analysis(corpus_run, single_windows):
    out, summary, windows, _, spec = corpus_run
    records = lines(out / corpus_lib.WINDOWS_FILE)
    assert sorted(r["window"] for r in records) == list(range(7))
    alone = single_windows[5]
    rec = next(r for r in records if r["window"] == 5)
    for layer in ("0", "1"):
        got = rec["layers"][layer]["mixes"]["uniform"]["fidelity"]
        want = alone["layers"][int(layer)]["mixes"]["uniform"]["fidelity"][0]
        assert got == pytest.approx(float(want), rel=1e-5)
        got_heads = rec["layers"][layer]["without_sink"]["heads"]["fidelity_median"]
        want_heads = alone["layers"][int(layer)]["without_sink"]["heads"]["fidelity_median"][0]
        np.testing.assert_allclose(got_heads, want_heads, rtol=1e-5)
    share = np.asarray(alone["rollout"]["sink_share"][0])
    assert rec["rollout"]["first_token_share"] == pytest.approx(float(share[0]), rel=1e-5)


def test_summary_means_wins_and_description(corpus_run):
    out, summary, windows, _, _ = corpus_run
    records = sorted(lines(out / corpus_lib.WINDOWS_FILE), key=lambda r: r["window"])
    layer = summary["layers"]["1"]
    gains = np.array([r["layers"]["1"]["mixes"]["learned"]["gain"] for r in records])
    assert layer["mixes"]["learned"]["gain"]["mean"] == pytest.approx(gains.mean(), rel=1e-9)
    assert layer["mixes"]["learned"]["wins_share"] == pytest.approx(np.mean(gains > 0))
    fid = np.array([r["layers"]["1"]["heads"]["fidelity"] for r in records])
    np.testing.assert_allclose(layer["heads"]["fidelity"]["mean"], fid.mean(0), rtol=1e-9)
    assert layer["best_head"] == int(np.argmax(fid.mean(0)))
    assert (summary["num_windows"], summary["tokens_per_window"]) == (7, 24)
    assert summary["baseline"]["baseline"]["fidelity"] == pytest.approx(1 / 24, rel=1e-5)
    report = (out / "corpus.json").read_text()
    assert json.loads(report)["num_windows"] == 7


def test_records_place_each_window_and_the_intervals_resample_their_documents(corpus_run):
    """Every line names its window's document and position there; corpus.json and
    report.md say which bootstrap the intervals used, over how many units."""
    out, summary, windows, _, _ = corpus_run
    records = sorted(lines(out / corpus_lib.WINDOWS_FILE), key=lambda r: r["window"])
    assert [r["document"] for r in records] == windows.document.tolist()
    assert [r["position"] for r in records] == windows.position.tolist()
    saved = json.loads((out / corpus_lib.SUMMARY_FILE).read_text())["intervals"]
    documents = len(set(windows.document.tolist()))
    assert saved == statistics.resampling(7, windows.document, windows.position).as_dict()
    assert saved["windows"] == 7 and saved["documents"] == documents
    assert saved["method"] == (statistics.CLUSTER if documents > 1 else statistics.BLOCK)
    assert f"95% intervals: {saved['text']}" in (out / "report.md").read_text()


def test_windows_recorded_without_positions_take_them_from_the_corpus(corpus_run, tmp_path):
    """Lines written before positions were recorded are summarised as if they had them:
    the same summary, nothing measured again or rewritten."""
    out, summary, _, cspec, spec = corpus_run
    for name in (corpus_lib.SETTINGS_FILE, optimum.OPTIMAL_FILE):
        shutil.copy(out / name, tmp_path / name)
    old = [{k: v for k, v in r.items() if k != "position"} for r in lines(out / "windows.jsonl")]
    (tmp_path / corpus_lib.WINDOWS_FILE).write_text("".join(json.dumps(r) + "\n" for r in old))
    before = (tmp_path / corpus_lib.WINDOWS_FILE).read_text()
    quick = dataclasses.replace(cspec, pruning=False)
    again, _ = corpus_lib.run(HF / "llama-tiny", TEXT, quick, spec, tmp_path, progress=False)
    assert (tmp_path / corpus_lib.WINDOWS_FILE).read_text() == before
    assert again["intervals"] == summary["intervals"]
    assert again["layers"] == summary["layers"] and again["rollout"] == summary["rollout"]


def test_a_damaged_settings_file_is_named(tmp_path):
    path = tmp_path / corpus_lib.SETTINGS_FILE
    path.write_text('{"corpus": "c.txt", "spec": {"hor')
    cspec = corpus_lib.CorpusSpec(tokens=24, max_windows=2)
    with pytest.raises(ValueError, match=f"^{path} is not valid JSON"):
        corpus_lib.run(HF / "llama-tiny", TEXT, cspec, SPEC, tmp_path, progress=False)


@pytest.mark.parametrize("found", [None, 1, 3])
def test_windows_of_another_record_format_are_refused(corpus_run, tmp_path, found):
    """Windows measured before the record gained fields (settings without a format) or
    by a newer version are refused in one line, and nothing there is rewritten."""
    out, _, _, cspec, spec = corpus_run
    for name in (corpus_lib.SETTINGS_FILE, corpus_lib.WINDOWS_FILE):
        shutil.copy(out / name, tmp_path / name)
    settings = json.loads((tmp_path / corpus_lib.SETTINGS_FILE).read_text())
    assert settings.pop("record_format") == measure_record.FORMAT
    if found is not None:
        settings["record_format"] = found
    (tmp_path / corpus_lib.SETTINGS_FILE).write_text(json.dumps(settings))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    message = f"record format {found or 1}, this version writes format {measure_record.FORMAT}"
    with pytest.raises(ValueError, match=message) as err:
        corpus_lib.run(HF / "llama-tiny", TEXT, cspec, spec, tmp_path, progress=False)
    assert "\n" not in str(err.value)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != ".lock"}
    assert after == before


def test_a_corpus_run_computes_its_baselines_once(corpus_run, baseline_calls):
    """Uniform causal attention is the same for every batch: measured for the summary
    only, never per batch of windows (`corpus_run`: four batches, of 2, 2, 2 and 1)."""
    _, summary, _, cspec, spec = corpus_run
    assert len(baseline_calls) == 1
    assert baseline_calls[0] == (cspec.tokens, spec)
    assert summary["baseline"]["baseline"]["fidelity"] == pytest.approx(1 / 24, rel=1e-5)


def test_rerun_skips_done_windows_and_finishes_an_interrupted_one(corpus_run, tmp_path):
    out, _, _, cspec, spec = corpus_run
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in (corpus_lib.SETTINGS_FILE, corpus_lib.WINDOWS_FILE):
        (copy / name).write_text((out / name).read_text())
    kept = (copy / corpus_lib.WINDOWS_FILE).read_text().splitlines()[:3]
    (copy / corpus_lib.WINDOWS_FILE).write_text("\n".join(kept) + '\n{"window": 3, "lay')
    other_batch = corpus_lib.CorpusSpec(tokens=24, max_windows=7, batch_size=1)
    summary, _ = corpus_lib.run(HF / "llama-tiny", TEXT, other_batch, spec, copy, progress=False)
    records = lines_skipping_torn(copy / corpus_lib.WINDOWS_FILE)
    assert sorted(r["window"] for r in records) == list(range(7))
    done = {r["window"]: r for r in lines(out / corpus_lib.WINDOWS_FILE)}
    for r in records:  # batch 1 = batch 3, window by window
        a = r["layers"]["1"]["heads"]["fidelity"]
        np.testing.assert_allclose(
            a, done[r["window"]]["layers"]["1"]["heads"]["fidelity"], rtol=1e-5
        )
    before = (copy / corpus_lib.WINDOWS_FILE).read_text()
    corpus_lib.run(HF / "llama-tiny", TEXT, other_batch, spec, copy, progress=False)
    assert (copy / corpus_lib.WINDOWS_FILE).read_text() == before
    with pytest.raises(ValueError, match=r"other settings \(corpus_spec.tokens: 24 -> 16"):
        corpus_lib.run(
            HF / "llama-tiny",
            TEXT,
            corpus_lib.CorpusSpec(tokens=16),
            spec,
            copy,
            progress=False,
        )
    assert (copy / corpus_lib.WINDOWS_FILE).read_text() == before


def test_windows_on_a_data_x_model_mesh_are_the_same_records(corpus_run, tmp_path):
    """The weights split over two devices along model (GQA: 4 heads on 2 kv heads), each
    batch of two over two along data (the last, of one, whole on both): every window's
    numbers as on one device."""
    out, _, _, cspec, spec = corpus_run
    mesh = parallel.model_mesh(2, 2)
    # The curves are not per window; batches of the shared run's two (its programs).
    records_only = dataclasses.replace(cspec, pruning=False)
    corpus_lib.run(HF / "llama-tiny", TEXT, records_only, spec, tmp_path, mesh=mesh, progress=False)
    done = {r["window"]: r for r in lines(out / corpus_lib.WINDOWS_FILE)}
    sharded = lines(tmp_path / corpus_lib.WINDOWS_FILE)
    assert sorted(r["window"] for r in sharded) == list(range(7))
    for r in sharded:
        for layer in ("0", "1"):
            for field in ("fidelity", "fidelity_median", "hitting_time_normalized"):
                np.testing.assert_allclose(
                    r["layers"][layer]["heads"][field],
                    done[r["window"]]["layers"][layer]["heads"][field],
                    rtol=1e-4,
                    atol=1e-6,
                )
        np.testing.assert_allclose(
            r["layers"]["1"]["sink_mass"], done[r["window"]]["layers"]["1"]["sink_mass"], rtol=1e-5
        )
        want = done[r["window"]]["rollout"]["network_fidelity"]
        assert r["rollout"]["network_fidelity"] == pytest.approx(want, rel=1e-4, abs=1e-7)


def lines_skipping_torn(path):
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def test_loss_pruning_curves_start_at_the_models_loss():
    module, params, tokenizer = pretrained.load(HF / "llama-tiny")
    docs = windowing.read_documents(TEXT)
    # Three windows of 24 tokens: the pruning windows of the corpus run, compiled once.
    windows = windowing.make_windows(docs, tokenizer, 24, 3, module.config.max_len)
    cspec = corpus_lib.CorpusSpec(tokens=24, pruning=True, pruning_windows=3, pruning_points=4)
    curves = loss_pruning.corpus_curves(module, params, windows, cspec, SPEC)
    logits, _ = pretrained.apply_with_attention(module, params, windows.tokens)
    logits = np.asarray(logits[:, :-1], np.float64)
    targets = windows.tokens[:, 1:]
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, targets[..., None], -1).mean()
    for name in ("projection", "gradient", "fidelity", "random"):
        c = curves[name]
        assert c["heads_pruned"] == [0, 2, 4, 6]  # 2 layers x 3 prunable heads, 4 points
        assert c["loss"][0] == pytest.approx(loss, rel=1e-4)
        assert len(c["order"]) == 6 and len({tuple(p) for p in c["order"]}) == 6
        fraction = np.array(c["heads_pruned"]) / 6
        assert c["loss_auc"] == pytest.approx(np.trapezoid(c["loss"], fraction))
        np.testing.assert_allclose(c["perplexity"], np.exp(c["loss"]), rtol=1e-6)
    mask = np.ones((2, 4), np.float32)
    for layer, head in curves["projection"]["order"][:6]:
        mask[layer, head] = 0
    examples = loss_pruning.next_token_batch(windows.tokens)
    # Jitted: one program, not one per operation of the model run eagerly.
    losses = jax.jit(pruning.sequence_losses, static_argnums=0)
    last = losses(module, params, examples.inputs, examples.targets, mask)
    assert curves["projection"]["loss"][-1] == pytest.approx(float(np.mean(last)), rel=1e-5)


def test_pruning_points_are_the_nearest_heads_to_even_spacing(monkeypatch):
    """Two layers of 5 heads leave 8 prunable heads; 4 points evenly spaced over 0..8
    fall at 0, 2.67, 5.33 and 8 heads, measured at the nearest counts 0, 3, 5, 8. With a
    loss that counts the removed heads (each worth its layer + 1) every point's loss and
    accuracy is that of the order's first heads, and the areas are over the share of the
    8 heads removed."""
    module = types.SimpleNamespace(config=types.SimpleNamespace(num_layers=2, num_heads=5))
    order = [(0, 0), (1, 4), (1, 1), (0, 2), (1, 3), (0, 3), (0, 1), (1, 0)]
    seen = {}

    def fake_orders(module_, params, tokens, horizon, seed, progress):
        seen.update(tokens=np.asarray(tokens), horizon=horizon, seed=seed)
        return {name: order[::-1] if name == "random" else order for name in pruning.ORDERS}

    def fake_scores(module_, params, examples, masks):
        assert masks.shape == (1, 2, 5)
        seen.setdefault("inputs", []).append(np.asarray(examples.inputs))
        removed = (1 - masks[0]) * np.array([[1.0], [2.0]])
        return np.array([1.0 + removed.sum()]), np.array([1.0 - (1 - masks[0]).sum() / 10])

    monkeypatch.setattr(loss_pruning, "orders", fake_orders)
    monkeypatch.setattr(pruning, "masked_scores", fake_scores)
    tokens = np.arange(5 * 6).reshape(5, 6)
    windows = types.SimpleNamespace(tokens=tokens)
    cspec = corpus_lib.CorpusSpec(tokens=6, pruning_windows=3, pruning_points=4, seed=5)
    spec = measure.MeasureSpec(horizon=7)
    curves = loss_pruning.corpus_curves(module, None, windows, cspec, spec, progress=False)
    assert curves["windows"] == 3
    np.testing.assert_array_equal(seen["tokens"], tokens[:3])
    assert (seen["horizon"], seen["seed"]) == (7, 5)
    assert len(seen["inputs"]) == 1 + 4 * 3  # all heads once, then 3 points per order
    for inputs in seen["inputs"]:
        np.testing.assert_array_equal(inputs, tokens[:3, :-1])
    # order's layers 0, 1, 1, 0, 1, 0, 0, 1 cost 1, 2, 2, 1, 2, 1, 1, 2
    c = curves["projection"]
    assert c["heads_pruned"] == [0, 3, 5, 8]
    assert c["order"] == [list(p) for p in order]
    np.testing.assert_allclose(c["loss"], [1.0, 6.0, 9.0, 13.0])
    np.testing.assert_allclose(c["accuracy"], [1.0, 0.7, 0.5, 0.2])
    np.testing.assert_allclose(c["perplexity"], np.exp([1.0, 6.0, 9.0, 13.0]), rtol=1e-6)
    share = np.array([0, 3, 5, 8]) / 8
    assert c["loss_auc"] == pytest.approx(np.trapezoid([1.0, 6.0, 9.0, 13.0], share))
    assert c["accuracy_auc"] == pytest.approx(0.6)  # a line from 1 to 0.2
    # the reversed order removes heads costing 2, 1, 1, 2, 1, 2, 2, 1
    r = curves["random"]
    assert r["heads_pruned"] == [0, 3, 5, 8]
    np.testing.assert_allclose(r["loss"], [1.0, 5.0, 8.0, 13.0])


BAD_CORPUS_CASES = [
    (["--corpus={empty}", "--tokens=8"], "holds no document"),
    (["--corpus={bad}", "--tokens=8"], "{bad}:2 is not JSON"),
    ([f"--corpus={TEXT}", "--tokens=100"], "longer than the model's context of 64"),
    ([f"--corpus={TEXT}", "--tokens=16", "--sink_tokens=15"], "--sink_tokens must be less"),
    ([f"--corpus={TEXT}", "--tokens=16", "--batch_size=0"], "--batch_size must be an integer"),
]
SERIES_MODELS = [str(HF / "llama-tiny"), str(HF / "qwen3-tiny")]


@pytest.fixture(scope="module")
def corpus_command_lines(tmp_path_factory):
    """The command lines of the CLI tests below, all from one interpreter (`launch_many`):
    (the folder they wrote in, the bad inputs' cases with their results, the series run's
    result)."""
    tmp_path = tmp_path_factory.mktemp("cli")
    paths = {"empty": tmp_path / "empty.txt", "bad": tmp_path / "bad.jsonl"}
    paths["empty"].write_text("")
    paths["bad"].write_text('{"text": "fine"}\nnot json\n')
    cases = [
        ([flag.format(**paths) for flag in flags], message.format(**paths))
        for flags, message in BAD_CORPUS_CASES
    ]
    model = f"--model={HF / 'llama-tiny'}"
    command_lines = [
        [model, *flags, f"--out={tmp_path / f'out{i}'}"] for i, (flags, _) in enumerate(cases)
    ]
    # Two windows of 24 tokens a model: one batch of SPEC_FLAGS' two, the shape of the
    # series test's and `corpus_run`'s batches (their programs). The good command line
    # beside the bad ones (one model's corpus analysis is wired to the command line as
    # tests/test_launchers.py checks, and run in process by test_coalition_summary.py).
    series_run = [f"--model={','.join(SERIES_MODELS)}", f"--corpus={TEXT}", "--tokens=24"]
    series_run += ["--max_windows=2", f"--out={tmp_path / 'series'}", *SPEC_FLAGS]
    *runs, series_done = launch_many(
        [("analyze.py", flags) for flags in [*command_lines, series_run]]
    )
    return tmp_path, list(zip(cases, runs, strict=True)), series_done


def test_corpus_cli_bad_input_is_one_line_and_writes_nothing(corpus_command_lines):
    tmp_path, refusals, done = corpus_command_lines
    for i, ((flags, message), refused) in enumerate(refusals):
        assert refused.returncode == 2, (flags, refused.stderr[-1500:])
        assert refused.stderr.strip().count("\n") == 0 and message in refused.stderr, refused.stderr
        assert not (tmp_path / f"out{i}").exists()
    assert done.returncode == 0, done.stderr[-2000:]
    report = (tmp_path / "series" / "llama-tiny" / "report.md").read_text()
    assert "2 windows of 24 tokens" in report and "baseline: uniform causal" in report


def test_corpus_series_summarises_each_models_corpus_analysis(tmp_path, corpus_command_lines):
    models = SERIES_MODELS
    # Batches of two and one a model: the shapes of `corpus_run`'s windows.
    cspec = corpus_lib.CorpusSpec(tokens=24, max_windows=3, batch_size=2)
    out = tmp_path / "series"
    records, written = series.run_corpus(models, TEXT, cspec, SPEC, out, progress=False)
    assert [r["model"] for r in records] == models
    for record, model in zip(records, models, strict=True):
        summary = json.loads((out / Path(model).name / "corpus.json").read_text())
        assert summary["num_windows"] == 3 and summary["source"] == model
        for layer, row in record["layers"].items():
            d = summary["layers"][layer]
            uniform = d["mixes"]["uniform"]["fidelity"]["mean"]
            assert row["uniform_fidelity_pct"] == pytest.approx(100 * uniform)
            assert row["sink_mass"] == pytest.approx(np.mean(d["sink_mass"]["mean"]))
        network = summary["rollout"]["network_fidelity"]["mean"]
        assert record["network_fidelity_pct"] == pytest.approx(100 * network)
    assert "2 model(s), one corpus" in written.read_text() and "over windows" in written.read_text()
    windows = out / "llama-tiny" / "windows.jsonl"
    before = (windows.stat().st_mtime_ns, (out / "series.jsonl").read_text())
    series.run_corpus(models, TEXT, cspec, SPEC, out, progress=False)
    assert (windows.stat().st_mtime_ns, (out / "series.jsonl").read_text()) == before
    other = corpus_lib.CorpusSpec(tokens=12, max_windows=3)
    with pytest.raises(ValueError, match="other settings.*tokens: 24 -> 12"):
        series.run_corpus(models, TEXT, other, SPEC, out, progress=False)
    # The same series from the command line (`corpus_command_lines`).
    cli, _, done = corpus_command_lines
    assert done.returncode == 0, done.stderr[-2000:]
    assert (cli / "series" / "qwen3-tiny" / "report.md").is_file()
    assert len((cli / "series" / "series.jsonl").read_text().splitlines()) == 2


# ---------------------------------------------------------------- the optimum, held out


def test_every_window_is_measured_with_weights_searched_without_its_fold(
    corpus_run, single_windows
):
    out, summary, windows, _, spec = corpus_run
    found = json.loads((out / optimum.OPTIMAL_FILE).read_text())
    assert found["folds"] == [[0, 4], [4, 7]] and found["held_out"]
    assert found["search_windows"] == [[4, 5, 6], [0, 2, 3]]  # outside the fold, 3 each
    assert summary["optimal"]["search_windows"] == found["search_windows"]
    records = {r["window"]: r for r in lines(out / corpus_lib.WINDOWS_FILE)}
    for window, alone in single_windows.items():
        for layer in ("0", "1"):
            got = records[window]["layers"][layer]
            want = alone["layers"][int(layer)]
            assert got["mixes"]["optimal"]["fidelity"] == pytest.approx(
                float(want["mixes"]["o"]["fidelity"][0]), rel=1e-5
            )
            assert got["without_sink"]["mixes"]["optimal"]["fidelity"] == pytest.approx(
                float(want["without_sink"]["mixes"]["o"]["fidelity"][0]), rel=1e-5
            )


def test_in_sample_values_are_each_searchs_own_windows_and_beat_every_head(corpus_run):
    out, summary, windows, _, spec = corpus_run
    found = json.loads((out / optimum.OPTIMAL_FILE).read_text())
    module, params, _ = pretrained.load(HF / "llama-tiny")
    plain = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False, sink_tokens=1)
    for fold, searched in enumerate(found["search_windows"]):
        extra = {"o": np.asarray(found["weights"][fold])}
        inner = {"o": np.asarray(found["weights_without_sink"][fold])}
        # The search's 3 windows as 2 and 1: the batches of `corpus_run`.
        recs = [
            text_lib.analyze_tokens(module, params, windows.tokens[part], plain, None, extra, inner)
            for part in (searched[:2], searched[2:])
        ]
        for layer in (0, 1):
            for pick, suffix in ((lambda g: g, ""), (lambda g: g["without_sink"], "_without_sink")):
                graphs = [pick(rec["layers"][layer]) for rec in recs]
                mixed = np.concatenate([g["mixes"]["o"]["fidelity"] for g in graphs])
                heads = np.concatenate([g["heads"]["fidelity"] for g in graphs])
                value = found[f"in_sample{suffix}"][fold][layer]
                assert value == pytest.approx(float(np.mean(mixed)), rel=1e-5)
                best_head = np.max(np.mean(heads, axis=0))
                assert value >= best_head - 1e-7, (fold, layer, suffix)  # its own optimum
    in_sample = summary["optimal"]["in_sample"]["1"]
    assert in_sample == pytest.approx(np.mean([f[1] for f in found["in_sample"]]))


def test_a_changed_window_count_is_refused_when_the_optimum_is_held_out(corpus_run, tmp_path):
    out, _, _, _, spec = corpus_run
    for name in (corpus_lib.SETTINGS_FILE, corpus_lib.WINDOWS_FILE, optimum.OPTIMAL_FILE):
        (tmp_path / name).write_text((out / name).read_text())
    fewer = corpus_lib.CorpusSpec(tokens=24, max_windows=6, batch_size=4)
    with pytest.raises(ValueError, match=r"other folds .*--max_windows"):
        corpus_lib.run(HF / "llama-tiny", TEXT, fewer, spec, tmp_path, progress=False)


def cells(report: str, heading: str) -> dict[str, list[str]]:
    """The rows of the first table after `heading`, by their first cell."""
    lines = report[report.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        parts = [c.strip() for c in line.strip("|").split("|")]
        rows[parts[0]] = parts[1:]
    return rows


def ci(stat: dict) -> str:
    return f"{100 * stat['mean']:.3f} [{100 * stat['low']:.3f}, {100 * stat['high']:.3f}]"


def test_report_cells_are_the_summarys_values_with_intervals(corpus_run):
    out, _, _, _, _ = corpus_run
    summary = json.loads((out / "corpus.json").read_text())
    report = (out / "report.md").read_text()
    for heading, pick in (
        ("## Layers\n", lambda d: d),
        ("## Layers without", lambda d: d["without_sink"]),
    ):
        rows = cells(report, heading)
        for layer, full in summary["layers"].items():
            d = pick(full)
            row = rows[str(int(layer) + 1)]  # layer k of the report is key k-1
            assert row[1] == ci(d["best_head_fidelity"])
            mixes = ["learned", "uniform", "optimal"]  # the report's order
            assert set(d["mixes"]) == set(mixes)
            for i, mix in enumerate(mixes):
                assert row[2 + 3 * i] == ci(d["mixes"][mix]["fidelity"]), (layer, mix)
                assert row[3 + 3 * i] == ci(d["mixes"][mix]["gain"])
                assert row[4 + 3 * i] == f"{100 * d['mixes'][mix]['wins_share']:.0f}%"
            suffix = "" if pick(full) is full else "_without_sink"
            in_sample = summary["optimal"][f"in_sample{suffix}"][layer]
            assert row[11] == f"{100 * in_sample:.3f}"
    header = report[report.index("## Layers\n") :].splitlines()[2]
    assert "optimal, held out (%)" in header and "optimal in sample (%)" in header
    assert "fold 0 (windows 0-3) searched on windows 4, 5, 6" in report
    pruned = cells(report, "## Pruning heads")
    for name in ("projection", "gradient", "fidelity", "random"):
        c = summary["pruning"][name]
        assert (
            pruned[name][3] == f"{c['loss_auc']:.3f}"
            and pruned[name][4] == f"{c['accuracy_auc']:.3f}"
        )
    assert (out / "pruning.png").is_file() and (out / "fidelity_layers.png").is_file()


def test_an_edited_corpus_is_refused_on_a_rerun(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT.read_text())
    # Batches of two and one: the series test's shapes and spec.
    cspec = corpus_lib.CorpusSpec(tokens=24, max_windows=3, batch_size=2)
    out = tmp_path / "out"
    corpus_lib.run(HF / "llama-tiny", folder, cspec, SPEC, out, progress=False)
    before = (out / corpus_lib.WINDOWS_FILE).read_text()
    (folder / "a.txt").write_text(TEXT.read_text().replace("Nature", "Reason"))  # same name
    with pytest.raises(ValueError, match=r"other settings \(corpus_sha256: "):
        corpus_lib.run(HF / "llama-tiny", folder, cspec, SPEC, out, progress=False)
    assert (out / corpus_lib.WINDOWS_FILE).read_text() == before


def test_layer_plot_is_log_scaled_with_plain_labels_and_every_series(corpus_run):
    _, summary, _, _, _ = corpus_run
    plt = files.pyplot()
    fig = corpus_report.plot_layers(summary, plt)
    try:
        full, without = fig.axes
        for ax in (full, without):
            assert ax.get_yscale() == "log"
            labels = [ax.yaxis.get_major_formatter()(v, 0) for v in (0.02, 0.5, 2.0)]
            assert labels == ["0.02", "0.5", "2"]
            names = ax.get_legend_handles_labels()[1]
            assert names == [
                "uniform causal attention",
                "learned",
                "uniform",
                "optimal, held out",
                "best head",
            ]
        base = 100 * summary["baseline"]["baseline"]["fidelity"]
        baseline = next(x for x in full.get_lines() if x.get_label() == "uniform causal attention")
        assert baseline.get_ydata()[0] == pytest.approx(base)
        assert "without the first 1 token(s)" in without.get_title()
    finally:
        plt.close(fig)


def test_each_record_names_its_windows_document_and_position():
    """Six windows of two documents, two per batch: the last batch holds the second
    document's fourth and fifth windows, at positions 3 and 4 of their document, not 0
    and 1 of their batch."""
    module, params, _ = pretrained.load(HF / "llama-tiny")
    tokens = np.arange(6 * 24).reshape(6, 24) % 50 + 1  # batches of the series test's shape
    picked = types.SimpleNamespace(tokens=tokens, document=np.asarray([0, 1, 1, 1, 1, 1]))
    got = {}
    corpus_lib.analyze_windows(
        module, params, picked, list(range(6)), SPEC, 2, got.__setitem__, progress=False
    )
    assert {i: line["document"] for i, line in got.items()} == {0: 0, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1}
    assert {i: line["position"] for i, line in got.items()} == {0: 0, 1: 0, 2: 1, 3: 2, 4: 3, 5: 4}


def test_report_tables_are_rectangular_and_pruning_rows_are_the_curves_ends(corpus_run):
    out, summary, _, _, _ = corpus_run
    report = (out / "report.md").read_text()
    for heading in ("## Layers\n", "## Layers without", "### Layer 1", "## Pruning heads"):
        table = report[report.index(heading) :].split("\n\n")[1].splitlines()
        if not table[0].startswith("|"):  # a paragraph before the table
            table = report[report.index(heading) :].split("\n\n")[2].splitlines()
        widths = {line.count("|") for line in table}
        assert len(widths) == 1, (heading, table)
    pruned = cells(report, "## Pruning heads")
    for name in ("projection", "gradient", "fidelity", "random"):
        c = summary["pruning"][name]
        assert pruned[name][:3] == [
            f"{c['loss'][0]:.3f}",
            f"{c['loss'][-1]:.3f}",
            f"{c['perplexity'][-1]:.1f}",
        ]


def _batch_record():
    """A batch of two windows' measurements: per-window fields, a pairwise matrix that is
    not per window, and the same again for the graph without the sink."""
    layer = {
        "fidelity": {"uniform": np.array([0.1, 0.2])},
        "pairwise_synergy": np.zeros((3, 3)),
        measure_record.WITHOUT_SINK: {
            "fidelity": {"uniform": np.array([0.3, 0.4])},
            "pairwise_synergy": np.ones((3, 3)),
        },
    }
    shares = np.array([[0.5, 0.2, 0.3], [0.1, 0.6, 0.3]])
    rollout = {"sink_share": shares, "network_fidelity": shares.min(-1)}
    return {"layers": {0: layer}, "rollout": rollout}


def test_window_record_takes_one_window_and_its_network_fidelity():
    """Window b's record: its network fidelity (the rollout's, the smallest share) and the
    first token's share, per layer its own entries."""
    measured = _batch_record()
    for b in range(2):
        got = corpus_lib.window_record(measured, b)
        assert got["rollout"] == pytest.approx(
            {
                "network_fidelity": float(measured["rollout"]["network_fidelity"][b]),
                "first_token_share": float(measured["rollout"]["sink_share"][b][0]),
            }
        )
        assert got["layers"]["0"]["fidelity"]["uniform"] == pytest.approx([0.1, 0.2][b])


def test_window_record_leaves_out_entries_not_per_window_also_without_sink():
    """Entries that are not one number per window (pairwise synergy) are left out of a
    window's record, in the graph without the sink as in the full one."""
    got = corpus_lib.window_record(_batch_record(), 1)["layers"]["0"]
    assert got == {
        "fidelity": {"uniform": pytest.approx(0.2)},
        measure_record.WITHOUT_SINK: {"fidelity": {"uniform": pytest.approx(0.4)}},
    }
