"""The language study's index.html from fabricated runs: the data it embeds are the
numbers of results.json, and in Chromium, opened from disk, its table shows them with no
console error."""

import json

import pytest

from beyondpar.study import lm_report
from beyondpar.study.lm_stats import BPB_KEY, LOSS_KEY, OPTIMAL_WINS
from helpers import browser as browser_lib
from helpers.browser import embedded
from helpers.lm_runs import write_runs


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    runs = write_runs(root / "runs", heads=(1, 2, 4), seeds=(0, 1))
    lm_report.write_report(runs, root / "report")
    return root / "report"


def test_write_report_writes_index_html(report_dir):
    assert (report_dir / "index.html").is_file()


def test_table_holds_the_cells_of_results_json(report_dir):
    saved = json.loads((report_dir / "results.json").read_text())
    (table,) = embedded(report_dir)["layers"]
    for row in table["rows"]:
        h = str(row["heads"])
        for metric, value in row["values"].items():
            cell = saved["cells"][metric][h]
            assert value["mean"] == cell["mean"]
            assert (value["low"], value["high"]) == (cell["low"], cell["high"])
    names = {metric for row in table["rows"] for metric in row["values"]}
    assert names == set(saved["cells"])


def test_charts_hold_the_steps_and_heads_of_results_json(report_dir):
    saved = json.loads((report_dir / "results.json").read_text())
    charts = embedded(report_dir)["study"]["charts"]
    by_metric = {c["metric"]: c for c in charts if "metric" in c}
    for metric in (BPB_KEY, OPTIMAL_WINS):
        lines = by_metric[metric]["lines"]
        want = saved["over_steps"][metric]
        assert {str(line["heads"]) for line in lines} == set(want) - (
            {"1"} if metric == OPTIMAL_WINS else set()
        )
        for line in lines:
            cells = want[str(line["heads"])]
            assert [str(x) for x in line["x"]] == list(cells)
            assert line["mean"] == [c["mean"] for c in cells.values()]
            assert line["low"] == [c["low"] for c in cells.values()]
    loss = next(c for c in charts if c["x"] == "heads" and c["y"] == "nats/token")
    assert loss["lines"][0]["mean"] == [
        saved["cells"][LOSS_KEY][h]["mean"] for h in ("1", "2", "4")
    ]


def test_page_opens_from_disk_and_its_table_shows_results_json(report_dir):
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    if browser_lib.missing():
        pytest.skip(browser_lib.missing())
    saved = json.loads((report_dir / "results.json").read_text())
    problems = []
    with sync_api.sync_playwright() as p:
        browser = browser_lib.launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: m.type == "error" and problems.append(m.text))
        page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
        page.goto((report_dir / "index.html").as_uri())
        page.wait_for_selector("body[data-ready=true]", timeout=20000)
        value = page.get_attribute(
            f'#layer-table tr[data-row="H=4"] td[data-field="{BPB_KEY}"]', "data-value"
        )
        charts = page.eval_on_selector_all(".study-chart .main-svg", "els => els.length")
        browser.close()
    assert not problems, problems
    assert float(value) == saved["cells"][BPB_KEY]["4"]["mean"]
    assert charts > 0
