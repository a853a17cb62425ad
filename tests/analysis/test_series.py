"""The series summary: per-layer columns read from text records and corpus summaries, and
series.md ordered by checkpoint step and by layer number."""

import json

import numpy as np
import pytest

from beyondpar import measure
from beyondpar.analysis import corpus, corpus_report, series


def line(label: str, layers: dict, network: float = 1.0) -> dict:
    return {"model": label, "label": label, "layers": layers, "network_fidelity_pct": network}


def table(report: str, heading: str) -> list[list[str]]:
    rows = report[report.index(heading) :].split("\n\n")[1].splitlines()
    return [[c.strip() for c in r.split("|")[1:-1]] for r in rows]


def test_layer_columns_follow_layer_numbers_not_their_spelling():
    """Twelve layers: key 10 comes after key 9, not after key 1, and each cell is its own
    layer's value; a layer a model lacks is '-'. Key k is layer k + 1, as the top says."""
    first = {str(k): {"sink_mass": k / 100} for k in (11, 2, 10, 0, 1, 9, 3, 4, 5, 6, 7, 8)}
    second = {"10": {"sink_mass": 0.5}}
    report = series.markdown([line("a", first), line("b", second)])
    rows = table(report, "## mean sink mass over heads")
    assert rows[0][1:] == [f"layer {k}" for k in range(1, 13)]
    assert (
        "Layers are numbered from 1, as in the paper: layer k in this report is key k-1 in "
        "series.jsonl and each model's analysis.json." in report
    )
    assert "Heads are numbered" not in report  # the series shows no head
    assert rows[2][1:] == [f"{k / 100:.4g}" for k in range(12)]
    assert rows[3][1:] == ["-"] * 10 + ["0.5", "-"]


def layer_stats(scale: float) -> dict:
    """One layer of a corpus summary: every value {"mean", "low", "high"} over windows."""

    def stat(mean):
        return {"mean": mean, "low": mean / 2, "high": mean * 2}

    return {
        "mixes": {
            "uniform": {
                "fidelity": stat(0.04 * scale),
                "fidelity_median": stat(0.05 * scale),
                "hitting_time_normalized": stat(7.0 * scale),
            }
        },
        "best_head_fidelity": stat(0.03 * scale),
        "sink_mass": {"mean": [0.2 * scale, 0.4 * scale], "low": [0, 0], "high": [1, 1]},
        "head_diversity": stat(0.6 * scale),
    }


def test_a_corpus_summary_is_summarised_by_its_means_over_windows():
    """Fidelities in percent, hitting time in steps, sink mass averaged over heads: each the
    window mean, never an interval bound."""
    summary = {"layers": {"0": layer_stats(1.0), "5": layer_stats(0.5)}}
    out = series.summarize(summary)
    assert list(out) == ["0", "5"]
    assert out["0"] == pytest.approx(
        {
            "uniform_fidelity_pct": 4.0,
            "uniform_median_pct": 5.0,
            "best_head_fidelity_pct": 3.0,
            "hitting_time_steps": 7.0,
            "sink_mass": 0.3,
            "head_diversity": 0.6,
        }
    )
    assert out["5"]["uniform_fidelity_pct"] == pytest.approx(2.0)
    assert out["5"]["sink_mass"] == pytest.approx(0.15)


def test_a_text_record_is_summarised_by_its_means_over_sequences():
    """Arrays with a sequence axis (and a head axis for sink mass) average to one number."""
    layer = {
        "mixes": {
            "uniform": {
                "fidelity": np.array([0.1, 0.3]),
                "fidelity_median": np.array([0.2, 0.4]),
                "hitting_time_normalized": np.array([3.0, 5.0]),
            }
        },
        "best_head_fidelity": np.array([0.05, 0.15]),
        "sink_mass": np.array([[0.1, 0.3], [0.5, 0.7]]),
        "head_diversity": np.array([0.2, 0.2]),
    }
    row = series.summarize({"layers": {1: layer}})["1"]
    assert row["uniform_fidelity_pct"] == pytest.approx(20.0)
    assert row["uniform_median_pct"] == pytest.approx(30.0)
    assert row["best_head_fidelity_pct"] == pytest.approx(10.0)
    assert row["hitting_time_steps"] == pytest.approx(4.0)
    assert row["sink_mass"] == pytest.approx(0.4)


def test_checkpoints_are_labelled_and_ordered_by_step_number():
    """Steps compare as numbers (step 900 before step 10000); without a step in every label
    the order given is kept."""
    assert series.label("runs/ckpt-00900") == "step 900"
    assert series.label("runs/checkpoint_10000/") == "step 10000"
    records = [line(series.label(m), {}) for m in ("iter10000", "iter900", "step_2500")]
    assert [r["label"] for r in series._ordered(records)] == [
        "step 900",
        "step 2500",
        "step 10000",
    ]
    mixed = [line("final", {}), line("step 5", {})]
    assert series._ordered(mixed) == mixed


def test_a_rerun_shows_only_the_models_asked_for_and_analyses_only_new_ones(tmp_path):
    """series.jsonl keeps every model analysed into the folder; series.md and the returned
    records hold only the models of this call, in step order, and a model already
    recorded with the same settings is not analysed again."""
    analysed = []

    def analyse(model, folder):
        analysed.append(model)
        step = int(model.rsplit("-", 1)[1])
        return {"0": {"sink_mass": step / 1000}}, step / 10000

    wanted = {"spec": {"horizon": 20}}
    models = ["ckpt-300", "ckpt-100", "ckpt-200"]
    series._series(models, wanted, analyse, tmp_path, "one text", False)
    shown, written = series._series(
        ["ckpt-200", "ckpt-100", "ckpt-400"], wanted, analyse, tmp_path, "one text", False
    )
    assert analysed == [*models, "ckpt-400"]
    assert [r["label"] for r in shown] == ["step 100", "step 200", "step 400"]
    report = written.read_text()
    assert report.count("model(s)") == 1 and "3 model(s), one text" in report
    network = report.split("\n\n")[2].splitlines()[2:]
    assert [[c.strip() for c in r.split("|")[1:-1]] for r in network] == [
        ["step 100", "1.0000"],
        ["step 200", "2.0000"],
        ["step 400", "4.0000"],
    ]
    assert [r[1] for r in table(report, "## mean sink mass over heads")[2:]] == [
        "0.1",
        "0.2",
        "0.4",
    ]
    recorded = [json.loads(x)["model"] for x in (tmp_path / series.SERIES_FILE).open()]
    assert recorded == [*models, "ckpt-400"]


def test_models_sharing_a_folder_name_are_refused_before_anything_is_written(tmp_path):
    """Each model's report goes to OUT/<its folder name>: two models with one name are
    refused, naming both, with nothing analysed or written; so is a new model whose name
    is that of a model already recorded from elsewhere."""
    analysed = []

    def analyse(model, folder):
        analysed.append(model)
        return {"0": {"sink_mass": 0.5}}, 0.5

    wanted = {"spec": {"horizon": 20}}
    out = tmp_path / "out"
    with pytest.raises(ValueError) as err:
        series._series(["a/gpt2", "b/gpt2"], wanted, analyse, out, "one text", False)
    assert str(err.value) == (
        f"--model: a/gpt2 and b/gpt2 would share the report folder {out / 'gpt2'}; each "
        "model of a series needs its own folder name (rename one, or analyse them into "
        "separate --out folders)"
    )
    assert analysed == [] and not out.exists()
    series._series(["a/gpt2", "a/gpt2-untied"], wanted, analyse, out, "one text", False)
    with pytest.raises(ValueError, match=r"^--model: a/gpt2 and c/gpt2 would share"):
        series._series(["c/gpt2"], wanted, analyse, out, "one text", False)
    assert analysed == ["a/gpt2", "a/gpt2-untied"]


def test_a_corpus_series_refuses_a_rerun_with_another_window_count(tmp_path, monkeypatch):
    """The number of windows decides which windows the means are over, so a corpus series
    recorded over 3 windows refuses a rerun over 5 (naming the field) instead of mixing
    the two in one series.md; the same settings resume without analysing anything."""
    analysed = []

    def fake_run(model, corpus_path, cspec, spec, folder, *args):
        analysed.append((model, cspec.max_windows))
        return {
            "layers": {"0": layer_stats(1.0)},
            "rollout": {"network_fidelity": {"mean": 0.25}},
        }, None

    monkeypatch.setattr(corpus, "run", fake_run)
    monkeypatch.setattr(corpus_report, "write", lambda summary, folder: [])
    monkeypatch.setattr(series.pretrained, "fingerprint", lambda model: f"sha of {model}")
    text = tmp_path / "corpus.txt"
    text.write_text("one two three four five six seven eight nine ten\n")
    spec = measure.MeasureSpec(horizon=30, max_steps=40)
    out = tmp_path / "out"
    three = corpus.CorpusSpec(tokens=16, max_windows=3, batch_size=2)
    shown, _ = series.run_corpus(["ckpt-7"], text, three, spec, out, progress=False)
    assert analysed == [("ckpt-7", 3)]
    assert shown[0]["network_fidelity_pct"] == pytest.approx(25.0)
    line = json.loads((out / series.SERIES_FILE).read_text())
    assert line["model_sha256"] == "sha of ckpt-7"
    recorded = line["settings"]
    assert (recorded["tokens"], recorded["max_windows"]) == (16, 3)
    series.run_corpus(["ckpt-7"], text, three, spec, out, progress=False)
    assert analysed == [("ckpt-7", 3)]
    five = corpus.CorpusSpec(tokens=16, max_windows=5, batch_size=2)
    with pytest.raises(ValueError, match=r"other settings \(max_windows: 3 -> 5\)"):
        series.run_corpus(["ckpt-7", "ckpt-9"], text, five, spec, out, progress=False)
    assert analysed == [("ckpt-7", 3)]


def test_a_recorded_model_whose_files_changed_is_refused_not_skipped(tmp_path):
    """Each model is recorded with its fingerprint: a rerun skips it while it is the same
    and refuses it, naming it, once another model's files are under its name; records
    written without a fingerprint are skipped as before."""
    analysed, prints = [], {"ckpt-1": "a", "ckpt-2": "b"}

    def analyse(model, folder):
        analysed.append(model)
        return {"0": {"sink_mass": 0.5}}, 0.5

    wanted = {"spec": {"horizon": 20}}
    run = lambda models: series._series(  # noqa: E731
        models, wanted, analyse, tmp_path, "one text", False, prints.get
    )
    run(["ckpt-1", "ckpt-2"])
    lines = [json.loads(x) for x in (tmp_path / series.SERIES_FILE).open()]
    assert [x["model_sha256"] for x in lines] == ["a", "b"]
    run(["ckpt-1", "ckpt-2"])
    assert analysed == ["ckpt-1", "ckpt-2"]
    prints["ckpt-2"] = "c"
    with pytest.raises(ValueError, match="^--model ckpt-2 changed since .*series.jsonl recorded"):
        run(["ckpt-2"])
    run(["ckpt-1"])  # the changed model is not asked for: nothing to refuse
    del lines[1]["model_sha256"]
    (tmp_path / series.SERIES_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    run(["ckpt-2"])
    assert analysed == ["ckpt-1", "ckpt-2"]


def test_a_model_spelled_another_way_is_the_same_model(tmp_path, monkeypatch):
    """`a/`, `./a` and the absolute path of `a` are one model: a rerun so spelled skips
    it, rather than refusing it as another model with the same folder name."""
    (tmp_path / "models" / "a").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    analysed = []

    def analyse(model, folder):
        analysed.append(model)
        return {"0": {"sink_mass": 0.5}}, 0.5

    out = tmp_path / "out"
    wanted = {"spec": {"horizon": 20}}
    series._series(["models/a"], wanted, analyse, out, "one text", False)
    for spelling in ["models/a/", "./models/a", str(tmp_path / "models" / "a")]:
        shown, _ = series._series([spelling], wanted, analyse, out, "one text", False)
        assert [r["model"] for r in shown] == ["models/a"]
    assert analysed == ["models/a"]
    (tmp_path / "other" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="^--model: models/a and other/a would share"):
        series._series(["other/a"], wanted, analyse, out, "one text", False)
