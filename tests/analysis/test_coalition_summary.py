"""The heads' coalitions in a real-model analysis, end to end: the corpus analysis with
coalitions (`launch/analyze.py --coalitions`) on a tiny model and corpus writes
per-window fidelity games, per-layer summaries of both games whose loss Shapley values
add up to what masking the layer costs, and a report whose rows are the summary's
values."""

import dataclasses
import json

import numpy as np
import pytest

from beyondpar import measure, pretrained, pruning
from beyondpar.analysis import coalition_summary, corpus_report, loss_pruning, windowing
from beyondpar.analysis import corpus as corpus_lib
from beyondpar.analysis import text as text_lib
from beyondpar.measure import record
from helpers.paths import DATA

MODEL = DATA / "hf" / "llama-tiny"
TEXT = DATA / "text" / "declaration.txt"


# The settings of every analysis here: the text test's walks and games are the programs
# the corpus analysis compiled (one 16-token window at a time, no pairwise synergy).
SPEC = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False, coalitions=True)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """What `launch/analyze.py --model=MODEL --corpus=TEXT --tokens=16 --max_windows=4
    --coalitions --coalition_windows=2 --horizon=20 --max_steps=20 --nopairwise
    --batch_size=1` runs (`analyse_corpus`), in this process; the command lines
    themselves are tests/analysis/test_corpus.py's."""
    out = tmp_path_factory.mktemp("coalitions")
    cspec = corpus_lib.CorpusSpec(tokens=16, max_windows=4, batch_size=1, coalition_windows=2)
    summary, _ = corpus_lib.run(MODEL, TEXT, cspec, SPEC, out, progress=False)
    corpus_report.write(summary, out)
    return out, json.loads((out / corpus_lib.SUMMARY_FILE).read_text())


def test_every_window_records_its_fidelity_game(analysed):
    out, summary = analysed
    lines = [json.loads(x) for x in (out / corpus_lib.WINDOWS_FILE).read_text().splitlines()]
    games = [r["layers"]["1"][record.COALITIONS] for r in lines]
    assert len(games) == 4 and set(games[0]) == {
        f for f in record.COALITION_FIELDS if f.endswith("_fidelity")
    }
    mean = np.mean([g["shapley_fidelity"] for g in games], 0)
    np.testing.assert_allclose(summary["coalitions"]["1"]["fidelity"]["shapley"]["mean"], mean)


def test_loss_shapley_adds_up_to_what_masking_the_layer_costs(analysed):
    _, summary = analysed
    module, params, tokenizer = pretrained.load(MODEL)
    docs = windowing.read_documents(TEXT)
    windows = windowing.make_windows(docs, tokenizer, 16, 4, module.config.max_len)
    batch = loss_pruning.next_token_batch(np.asarray(windows.tokens[:2]))
    loss = lambda m: pruning.sequence_losses(module, params, batch.inputs, batch.targets, m)
    for layer in (0, 1):
        masked = np.ones((2, 4), np.float32)
        masked[layer] = 0.0
        cost = np.mean(loss(masked) - loss(np.ones((2, 4), np.float32)))
        shapley = summary["coalitions"][str(layer)]["loss"]["shapley"]["mean"]
        assert sum(shapley) == pytest.approx(float(cost), abs=1e-4)


def test_report_rows_are_the_summarys_values(analysed):
    out, summary = analysed
    report = (out / "report.md").read_text().splitlines()
    head = "### Shapley values on the loss the coalition restores with the layer's other heads"
    start = next(i for i, line in enumerate(report) if line.startswith(head))
    row = report[start + 4]  # the heading, a blank line, the header, the rule: layer 1
    stat = summary["coalitions"]["0"]["loss"]["shapley"]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "1"
    columns = zip(stat["mean"], stat["low"], stat["high"], strict=True)
    want = [f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in columns]
    assert cells[1:] == want
    assert (out / "coalitions_interaction_loss.png").exists()
    assert "Fidelity games on all 4 windows, loss games on the first 2" in "\n".join(report)
    found = summary["coalition_intervals"]
    assert found["fidelity"]["windows"] == 4 and found["loss"]["windows"] == 2
    assert found["fidelity"]["text"] in "\n".join(report)


def test_intervals_resample_documents_not_windows():
    """Windows of one document alike, documents differing: resampling documents gives a
    wider interval than treating the windows as independent."""
    documents = np.repeat(np.arange(6), 4)  # 6 documents of 4 windows each
    shapley = np.stack([documents * 0.1, -documents * 0.1], axis=1)  # (W, H)
    fields = {
        record.coalition_field("shapley", "fidelity"): shapley,
        record.coalition_field("shapley_stderr", "fidelity"): np.zeros_like(shapley),
    }
    records = [{"document": int(d), "position": i % 4} for i, d in enumerate(documents)]
    by_document = coalition_summary.summarize({0: fields}, {}, 0, records)
    by_window = coalition_summary.summarize({0: fields}, {}, 0)
    width = lambda s: np.subtract(s["high"], s["low"])
    clustered = by_document["0"]["fidelity"]["shapley"]
    alone = by_window["0"]["fidelity"]["shapley"]
    np.testing.assert_allclose(clustered["mean"], alone["mean"])
    assert (width(clustered) > 1.5 * width(alone)).all()
    assert coalition_summary.resampling(records, 8)["units"] == 2  # the first 2 documents


def test_a_folder_written_before_coalitions_existed_reads_as_without_them(tmp_path):
    wanted = {
        "model": "m",
        "model_sha256": "x",
        "corpus": "c",
        "corpus_sha256": "y",
        "corpus_spec": dataclasses.asdict(corpus_lib.CorpusSpec(tokens=16)),
        "spec": dataclasses.asdict(measure.MeasureSpec()),
        "dtype": None,
        "record_format": record.FORMAT,
    }
    old = json.loads(json.dumps(wanted))
    for name in ("coalitions", "exact_coalition_heads", "permutations", "coalition_seed"):
        del old["spec"][name]
    del old["corpus_spec"]["coalition_windows"]
    (tmp_path / corpus_lib.SETTINGS_FILE).write_text(json.dumps(old))
    corpus_lib._check_settings(tmp_path, wanted)  # the same analysis: accepted
    (tmp_path / corpus_lib.SETTINGS_FILE).write_text(json.dumps(old))
    asked = {**wanted, "spec": dataclasses.asdict(measure.MeasureSpec(coalitions=True))}
    with pytest.raises(ValueError, match="spec.coalitions"):
        corpus_lib._check_settings(tmp_path, asked)


def test_one_text_plays_both_games_and_attention_alone_only_fidelity(tmp_path):
    spec = SPEC
    text = "The heads of a layer read text."  # 16 tokens, as long as the CLI's windows
    found = text_lib.text_record(MODEL, text, spec)
    assert len(found["tokens"]) == 16
    module, params, _ = pretrained.load(MODEL)
    # The text twice: the batch of two 16-token windows the loss check above compiled for.
    batch = loss_pruning.next_token_batch(np.asarray([found["tokens"]] * 2))
    loss = lambda m: pruning.sequence_losses(module, params, batch.inputs, batch.targets, m)
    masked = np.asarray([[0.0] * 4, [1.0] * 4], np.float32)
    cost = float(loss(masked)[0] - loss(np.ones((2, 4), np.float32))[0])
    assert sum(found["coalitions"]["0"]["loss"]["shapley"]["mean"]) == pytest.approx(cost, abs=1e-4)
    # One sequence of 16 tokens, the text's shape: the text's metric programs serve it.
    attn = np.load(MODEL / "expected.npz")["attention"][:1, ..., :16, :16]
    np.savez(tmp_path / "attn.npz", attention=attn / attn.sum(-1, keepdims=True))
    alone = text_lib.attention_record(tmp_path / "attn.npz", spec)
    assert set(alone["coalitions"]["0"]) == {"fidelity"}
