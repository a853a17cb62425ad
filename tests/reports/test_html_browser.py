"""The report pages in a real browser (Chromium, driven by Playwright), opened from disk:
no console error and no failed request, the layer and head controls redraw the table with
the record's own numbers, the attention heatmap is drawn within 2 s (on the study's page,
each run's recorded attention), and the page is not blank. Skips, saying why, where
Chromium or Playwright is missing (CI installs both)."""

import dataclasses
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PIL_Image

from beyondpar import measure
from beyondpar.analysis import corpus as corpus_lib
from beyondpar.analysis import corpus_report, pages, text_report
from beyondpar.analysis import text as text_lib
from beyondpar.reports import html, packing
from beyondpar.study import evaluate, report, report_page, worked_example
from helpers import browser as browser_lib
from helpers.browser import embedded
from helpers.paths import DATA
from helpers.study_records import record, with_view

HF = DATA / "hf"
TEXT = DATA / "text" / "declaration.txt"
SPEC = measure.MeasureSpec(horizon=20, max_steps=20, pairwise=False)
FIRST_HEATMAP_MS = 2000

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
if browser_lib.missing():
    pytest.skip(browser_lib.missing(), allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        chromium = browser_lib.launch(p)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def corpus_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus-page")
    # One window a batch, and the loss game on the first window alone: the text page's
    # 24-token text (that window) then reuses the corpus's programs, its loss game too.
    cspec = corpus_lib.CorpusSpec(
        tokens=24, max_windows=4, batch_size=1, search_windows=1, coalition_windows=1
    )
    spec = dataclasses.replace(SPEC, optimal_weights=True, coalitions=True)
    summary, _ = corpus_lib.run(HF / "llama-tiny", TEXT, cspec, spec, out, progress=False)
    corpus_report.write(summary, out)
    return out


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("text-page")
    text = TEXT.read_text()[:30]  # 24 tokens: the corpus page's first window
    spec = dataclasses.replace(SPEC, coalitions=True)
    text_report.write(text_lib.text_record(HF / "llama-tiny", text, spec), out)
    return out


@pytest.fixture(scope="module")
def example2_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("example2-page")
    worked_example.write(out)
    return out


@pytest.fixture(scope="module")
def study_folder(one_epoch_run, tmp_path_factory):
    """The one-epoch smoke run evaluated (a copy: the run is shared) and reported."""
    root = tmp_path_factory.mktemp("study-page") / "runs"
    shutil.copytree(one_epoch_run, root / "copy-h2")
    evaluate.evaluate_tree(root, progress=False)
    records = evaluate.read_records(root / evaluate.RECORDS_FILE)
    report.write_report(records, root / "report", runs_root=root)
    return root / "report"


class Opened:
    """A page opened from disk, with every console error and failed request it met."""

    def __init__(self, browser, path: Path):
        self.problems = []
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda err: self.problems.append(f"page error: {err}"))
        self.page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url}"))
        self.page.on("request", self._request)
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready=true]", timeout=20000)

    def _console(self, message):
        if message.type == "error":
            self.problems.append(f"console: {message.text}")

    def _request(self, request):
        if not request.url.startswith(("file://", "data:", "about:")):
            self.problems.append(f"network: {request.url}")

    def cells(self, row: str) -> dict:
        """{field: mean} of the table row named `row`, at the precision the page holds."""
        found = self.page.eval_on_selector_all(
            f'#layer-table tr[data-row="{row}"] td[data-value]',
            "tds => tds.map(td => [td.dataset.field, td.dataset.value])",
        )
        return {field: float(value) for field, value in found}


def opened(browser, path):
    """A page loaded once for a module's tests (each page load parses the plotting library);
    every test chooses the layer and head it reads."""
    page = Opened(browser, path)
    yield page
    page.page.close()
    assert not page.problems, page.problems


def checked(page: Opened):
    """The shared page, with the console errors and failed requests of this test's steps."""
    yield page
    problems, page.problems[:] = list(page.problems), []
    assert not problems, problems


@pytest.fixture(scope="module")
def corpus_opened(browser, corpus_folder):
    for page in opened(browser, corpus_folder / html.FILE):
        # Freshly loaded, before any test chooses: the first layer's first head.
        assert (page.page.input_value("#layer"), page.page.input_value("#head")) == ("0", "0")
        yield page


@pytest.fixture(scope="module")
def text_opened(browser, text_folder):
    yield from opened(browser, text_folder / html.FILE)


@pytest.fixture(scope="module")
def study_opened(browser, study_folder):
    yield from opened(browser, study_folder / html.FILE)


@pytest.fixture
def corpus_page(corpus_opened):
    yield from checked(corpus_opened)


@pytest.fixture
def text_page(text_opened):
    yield from checked(text_opened)


@pytest.fixture
def example2_page(browser, example2_folder):
    yield from opened(browser, example2_folder / html.FILE)


@pytest.fixture
def study_page(study_opened):
    yield from checked(study_opened)


def test_corpus_controls_show_the_summarys_numbers(corpus_page, corpus_folder):
    summary = json.loads((corpus_folder / "corpus.json").read_text())
    page = corpus_page.page
    page.select_option("#layer", "1")  # the second layer: key "1"
    page.select_option("#head", "2")  # index 2, shown as head 3
    layer = summary["layers"]["1"]
    got = corpus_page.cells("head 3")
    assert got["fidelity"] == layer["heads"]["fidelity"]["mean"][2]
    assert got["sink_mass"] == layer["sink_mass"]["mean"][2]
    assert got["hitting_time_normalized"] == layer["heads"]["hitting_time_normalized"]["mean"][2]
    low = page.get_attribute(
        '#layer-table tr[data-row="head 3"] td[data-field="fidelity"]', "data-low"
    )
    assert float(low) == layer["heads"]["fidelity"]["low"][2]
    for mix, row in (("learned",) * 2, ("uniform",) * 2, ("optimal", "optimal, held out")):
        cells = corpus_page.cells(f"mix: {row}")
        assert cells["fidelity"] == layer["mixes"][mix]["fidelity"]["mean"]
        assert cells["gain"] == layer["mixes"][mix]["gain"]["mean"]
    assert page.get_attribute("#layer-table tr.chosen", "data-row") == "head 3"
    page.wait_for_selector('#attention[data-drawn="1/2/0"]')
    assert "head 3, layer 2" in page.text_content("#attention .gtitle")


def test_keyboard_moves_the_head_and_the_flow_marks_the_worst_token(corpus_page, corpus_folder):
    views = json.loads((corpus_folder / "views.json").read_text())["views"]
    page = corpus_page.page
    page.select_option("#layer", "0")
    page.select_option("#head", "0")
    page.focus("#head")
    page.keyboard.press("ArrowDown")
    assert page.input_value("#head") == "1"
    assert page.get_attribute("#layer-table tr.chosen", "data-row") == "head 2"
    heads = views[0]["layers"]["0"]["heads"]
    strip = '#flow-tokens [data-operator="head"] span'
    worst = page.eval_on_selector_all(strip, "s => s.findIndex(x => x.className === 'worst')")
    assert worst == heads["worst_token"][1] // views[0]["pool"]
    shown = page.eval_on_selector_all(strip, "s => s.map(x => +x.dataset.value)")
    assert shown == heads["values"][1]
    mixes = views[0]["layers"]["0"]["mixes"]
    uniform = '#flow-tokens [data-operator="uniform"] span'
    shown = page.eval_on_selector_all(uniform, "s => s.map(x => +x.dataset.value)")
    assert shown == mixes["uniform"]["values"]


def test_text_page_shows_the_records_means(text_page, text_folder):
    record = json.loads((text_folder / "analysis.json").read_text())
    page = text_page.page
    page.select_option("#layer", "1")
    page.select_option("#head", "3")
    layer = record["layers"]["1"]
    got = text_page.cells("head 4")  # index 3
    assert got["fidelity"] == pytest.approx(np.mean(np.asarray(layer["heads"]["fidelity"])[:, 3]))
    learned = text_page.cells("mix: learned")
    assert learned["fidelity"] == pytest.approx(np.mean(layer["mixes"]["learned"]["fidelity"]))
    assert page.locator("#attention .heatmaplayer").count() == 1


def test_first_heatmap_is_drawn_quickly_and_the_page_is_not_blank(text_page):
    page = text_page.page
    drawn = page.evaluate("window.beyondparFirstHeatmapMs")
    assert drawn is not None and drawn < FIRST_HEATMAP_MS, f"first heatmap after {drawn} ms"
    image = np.asarray(PIL_Image.open(io.BytesIO(page.screenshot(full_page=True))))
    assert image.std() > 10, "the screenshot is (nearly) one colour"


def test_example2_page_shows_each_operators_fidelity_and_worst_node(example2_page, example2_folder):
    result = json.loads((example2_folder / "example2.json").read_text())
    page = example2_page.page
    page.select_option("#head", "1")
    assert example2_page.cells("head 2")["fidelity"] == result["head2"]["minimax_fidelity"]
    assert example2_page.cells("mix: 0.5 / 0.5")["fidelity"] == result["mixed"]["minimax_fidelity"]
    page.wait_for_selector('#attention[data-drawn="0/1/0"]')
    # Head 2 loses most of u: 25% of it reaches tau.
    assert page.text_content('#flow-tokens [data-operator="head"] span.worst') == "u"


def test_study_page_shows_each_runs_layers_and_its_loss(study_page, study_folder):
    results = json.loads((study_folder / "results.json").read_text())
    page = study_page.page
    layers = page.eval_on_selector_all("#layer option", "os => os.map(o => o.textContent)")
    assert layers[:2] == ["copy-h2, layer 1", "copy-h2, layer 2"]
    page.select_option("#layer", "1")
    page.select_option("#head", "1")  # the smoke config has 2 heads
    row = next(r for r in results if r["layer"] == 2)
    learned = study_page.cells("mix: learned")
    assert learned["fidelity"] == row["fidelity_fraction_mean"]
    assert learned["hitting_time"] == row["hitting_time_steps_mean"]
    assert study_page.cells("head 2")["fidelity"] > 0  # index 1
    assert page.text_content("#layer-title") == "copy-h2, layer 2, head 2"
    assert page.locator("#study-heads .scatterlayer .trace").count() > 0
    assert page.locator("#study-loss .scatterlayer .trace").count() == 1


def drawn_attention(page) -> np.ndarray:
    """The probabilities the heatmap draws (its hover data), NaN above the diagonal."""
    raw = page.evaluate("document.getElementById('attention').data[0].customdata")
    return np.array([[np.nan if p is None else p for p in row] for row in raw])


def assert_drawn_is(page, packed: dict, head: int):
    """The heatmap shows head `head` of a payload's packed layer, cell for cell."""
    want = packing.decode(packed["attention"], packed["shape"])[head]
    drawn = drawn_attention(page)
    below = np.tril(np.ones(want.shape, bool))
    np.testing.assert_allclose(drawn[below], want[below], rtol=1e-12, atol=0)
    assert np.isnan(drawn[~below]).all()


def test_study_page_draws_the_chosen_heads_attention_from_its_payload(study_page, study_folder):
    (view,) = embedded(study_folder)["views"]
    page = study_page.page
    assert page.is_hidden("#view-control")  # a study's view follows the chosen run
    page.select_option("#layer", "1")
    page.select_option("#head", "1")  # index 1, shown as head 2
    page.wait_for_selector('#attention[data-drawn="copy-h2/1/1/0"]')
    packed = view["layers"]["copy-h2/1"]
    assert_drawn_is(page, packed, 1)
    lines = page.eval_on_selector_all(
        "#attention .gtitle tspan.line", "els => els.map((e) => e.textContent)"
    )  # two lines: the layer's name, then the view's (one line outgrew the heatmap)
    assert lines == [
        "head 2, copy-h2, layer 2",
        "attention of the first evaluation sequence of copy-h2",
    ]
    strip = '#flow-tokens [data-operator="head"] span'
    shown = page.eval_on_selector_all(strip, "s => s.map(x => +x.dataset.value)")
    assert shown == packed["heads"]["values"][1]
    learned = '#flow-tokens [data-operator="learned"] span'
    shown = page.eval_on_selector_all(learned, "s => s.map(x => +x.dataset.value)")
    assert shown == packed["mixes"]["learned"]["values"]


def test_study_page_shows_the_view_of_the_run_chosen(browser, tmp_path):
    """Two runs with attention and one whose record has none (written before it was kept)."""
    (h1, _), (h4, _) = (
        with_view(record("h1-s0", 1, 0, 0.2), 1),
        with_view(record("h4-s0", 4, 0, 0.4), 2),
    )
    runs = report.latest([h1, h4, record("h4-s1", 4, 1, 0.6)])
    payload = report_page.page(runs, report.aggregate(runs), runs)
    opened_page = Opened(browser, html.write(tmp_path, payload))
    page = opened_page.page
    page.select_option("#layer", "3")  # h4-s0, layer 2
    page.select_option("#head", "2")
    page.wait_for_selector('#attention[data-drawn="h4-s0/1/2/1"]')
    assert_drawn_is(page, payload["views"][1]["layers"]["h4-s0/1"], 2)
    page.select_option("#layer", "4")  # h4-s1: no attention recorded
    assert page.is_hidden("#view-section")
    assert page.text_content("#layer-title") == "h4-s1, layer 1, head 3"
    page.select_option("#layer", "0")
    page.wait_for_selector('#attention[data-drawn="h1-s0/0/0/0"]')
    assert page.is_visible("#view-section")
    assert_drawn_is(page, payload["views"][0]["layers"]["h1-s0/0"], 0)
    page.close()
    assert not opened_page.problems, opened_page.problems


def coalition_page(folder: Path) -> Path:
    """A page of one 3-head layer whose record carries coalition values, and no views."""
    layer = {"heads": {"fidelity": [[0.1, 0.2, 0.3]]}, "mixes": {"uniform": {"fidelity": [0.4]}}}
    interaction = [[0.0, 0.02, -0.01], [0.02, 0.0, 0.03], [-0.01, 0.03, 0.0]]
    shapley = {"mean": [0.05, 0.1, 0.25], "low": [0.0, 0.05, 0.2], "high": [0.1, 0.15, 0.3]}
    games = {"0": {"fidelity": {"shapley": shapley, "interaction": interaction}}}
    record = {"source": "s", "num_sequences": 1, "seq_len": 4, "num_layers": 1, "num_heads": 3}
    page = pages.text_page({**record, "layers": {"0": layer}, "coalitions": games})
    return html.write(folder, page)


def shown_shapley(page) -> list[float]:
    """The Shapley values the page's bar chart draws (in the record's units)."""
    drawn = page.evaluate("document.getElementById('coalitions-shapley').data[0].y")
    return [v / 100 for v in drawn]


def test_coalition_values_are_drawn_when_the_record_has_them(browser, tmp_path):
    opened_page = Opened(browser, coalition_page(tmp_path))
    page = opened_page.page
    assert page.is_visible("#coalitions-section") and page.is_hidden("#view-section")
    bars = page.locator("#coalitions-shapley .bars .point")
    assert bars.count() == 3
    assert page.locator("#coalitions-interaction .heatmaplayer").count() == 1
    assert opened_page.cells("head 3")["fidelity"] == 0.3  # index 2
    assert shown_shapley(page) == pytest.approx([0.05, 0.1, 0.25])
    # Heads read 1, 2, 3 on the Shapley bars and on both axes of the interaction map.
    assert page.evaluate("document.getElementById('coalitions-shapley').data[0].x") == [1, 2, 3]
    shapley_ticks = "#coalitions-shapley .xtick text"
    assert page.eval_on_selector_all(shapley_ticks, "ts => ts.map(t => t.textContent)") == [
        "1",
        "2",
        "3",
    ]
    for axis in ("x", "y"):
        drawn = page.evaluate(f"document.getElementById('coalitions-interaction').data[0].{axis}")
        assert drawn == [1, 2, 3]
        ticks = f"#coalitions-interaction .{axis}tick text"
        shown = page.eval_on_selector_all(ticks, "ts => ts.map(t => t.textContent)")
        assert sorted(shown) == ["1", "2", "3"]  # the y axis runs top to bottom
    page.close()
    assert not opened_page.problems, opened_page.problems


def test_corpus_page_draws_the_summarys_coalitions(corpus_page, corpus_folder):
    summary = json.loads((corpus_folder / "corpus.json").read_text())
    page = corpus_page.page
    for layer in ("0", "1"):
        page.select_option("#layer", layer)
        assert page.is_visible("#coalitions-section")
        want = summary["coalitions"][layer]["fidelity"]["shapley"]["mean"]
        assert shown_shapley(page) == pytest.approx(want, rel=1e-6, abs=1e-9)
        assert page.locator("#coalitions-interaction .heatmaplayer").count() == 1


def test_text_page_draws_the_records_coalitions(text_page, text_folder):
    record = json.loads((text_folder / "analysis.json").read_text())
    page = text_page.page
    page.select_option("#layer", "1")
    assert page.is_visible("#coalitions-section")
    want = record["coalitions"]["1"]["fidelity"]["shapley"]["mean"]
    assert shown_shapley(page) == pytest.approx(want, rel=1e-6, abs=1e-9)
    raw = record["layers"]["1"]["coalitions"]["shapley_fidelity"]
    assert shown_shapley(page) == pytest.approx(np.mean(raw, 0), rel=1e-5, abs=1e-7)
