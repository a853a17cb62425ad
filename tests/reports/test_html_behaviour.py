"""The report page's documented behaviour on small made-up records: the attention bytes
(one per causal cell, the square root of the probability on 255 levels, gzipped, in
base64), the flow's worst token and blocks, the layer numbering, the intervals, the
escaping of token texts, and, in Chromium, what the page's script draws for a chosen
layer and head, read back from the DOM and compared with the data it was given."""

import base64
import gzip
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from beyondpar.analysis import pages, views
from beyondpar.reports import html, packing
from beyondpar.study import report_page

HEADS, TOKENS, POOL = 3, 6, 2
LABELS = ["<s>", "</script>", "<b>bold</b>", " a", " b", " c"]


def causal(heads: int, tokens: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.tril(rng.random((heads, tokens, tokens)) ** 3)
    return a / a.sum(-1, keepdims=True)


def raw_bytes(text: str) -> bytes:
    packed = base64.b64decode(text)
    assert packed[:2] == b"\x1f\x8b"  # gzip
    return gzip.decompress(packed)


# Packing, in numpy.


def test_attention_bytes_are_the_square_root_on_255_levels_with_the_diagonal():
    assert html.LEVELS == packing.LEVELS == 255
    a = np.zeros((2, 3, 3))
    a[:, :, 0] = 1.0  # every query reads the first token
    a[1, 2] = [0.0, 0.75, 0.25]
    got = np.frombuffer(raw_bytes(packing.encode(a)), np.uint8)
    # Row by row (cells on and below the diagonal), head after head.
    assert got.tolist() == [255, 255, 0, 255, 0, 0] + [255, 255, 0, 0, 221, 128]
    assert packing.decode(packing.encode(a), a.shape) == pytest.approx(a, abs=2 / 255)


def test_attention_round_trip_keeps_the_diagonal_and_every_head():
    a = causal(HEADS, 7, seed=1)
    back = packing.decode(packing.encode(a), a.shape)
    assert np.sqrt(back) == pytest.approx(np.sqrt(a), abs=0.5 / 255 + 1e-9)
    assert np.diagonal(back, axis1=1, axis2=2) == pytest.approx(
        np.diagonal(a, axis1=1, axis2=2), abs=0.01
    )


def test_pooling_averages_queries_over_a_shorter_last_block():
    a = causal(1, 5, seed=2)
    pooled = packing.pooled_attention(a, 2)
    assert pooled.shape == (1, 3, 3)
    assert pooled.sum(-1) == pytest.approx(np.ones((1, 3)), abs=1e-6)
    assert pooled[0, 2, 2] == pytest.approx(a[0, 4, 4])  # the last block: one token


def test_the_byte_budget_pools_only_what_does_not_fit():
    assert packing.pool_size(4, 10, packing.triangle(10) * 4) == 1
    pool = packing.pool_size(4, 10, packing.triangle(10) * 4 - 1)
    assert pool == 2
    per_window = 2 * 3 * packing.triangle(100)
    assert views.count(10, 2, 3, 100) == min(views.MAX_VIEWS, views.BUDGET_BYTES // per_window)
    assert views.count(100, 10, 8, 1000) == 1


def test_a_flow_marks_the_least_served_token_and_each_blocks_worst():
    phi = np.array([[0.5, 0.2, 0.9, 0.01, 0.3], [0.1, 0.4, 0.05, 0.6, 0.7]])
    f = packing.flow(phi, 2)
    assert f["worst_token"] == [3, 2]
    assert f["worst_value"] == [0.01, 0.05]
    assert f["values"] == [[0.2, 0.01, 0.3], [0.1, 0.05, 0.7]]


def test_block_labels_name_each_blocks_first_and_last_token():
    assert packing.block_labels(["a", "b", "c", "d", "e"], 2) == ["0-1 'a'", "2-3 'c'", "4-4 'e'"]


# The page's data.


def test_a_token_text_cannot_end_the_data_script_and_nan_is_null():
    page = {"title": "t", "views": [{"labels": LABELS}], "x": [float("nan"), math.inf, 1.0]}
    text = html.page_html(page)
    start = text.index('<script id="page-data" type="application/json">')
    data = text[start:].split(">", 1)[1].split("</script>", 1)[0]
    assert "<" not in data
    back = json.loads(data)
    assert back["views"][0]["labels"] == LABELS
    assert back["x"] == [None, None, 1.0]


def interval(mean, spread=0.01):
    return {"mean": mean, "low": mean - spread, "high": mean + 2 * spread}


def per_head(means):
    return {
        "mean": list(means),
        "low": [m - 0.01 for m in means],
        "high": [m + 0.02 for m in means],
    }


def corpus_layer(offset: float) -> dict:
    heads = [0.1 + offset, 0.2 + offset, 0.3 + offset][:HEADS]
    mixes = {
        name: {"fidelity": interval(0.4 + offset + 0.1 * i), "gain": interval(0.05 * (i + 1))}
        for i, name in enumerate(("learned", "uniform", "optimal"))
    }
    return {
        "mixes": mixes,
        "heads": {"fidelity": per_head(heads)},
        "sink_mass": per_head([0.5, 0.6, 0.7]),
    }


SUMMARY = {
    "corpus": "c",
    "source": "m",
    "num_windows": 2,
    "tokens_per_window": TOKENS,
    "layers": {"10": corpus_layer(0.3), "0": corpus_layer(0.0), "2": corpus_layer(0.1)},
}


def test_corpus_layers_are_numbered_from_one_with_intervals_in_order():
    page = pages.corpus_page(SUMMARY)
    assert [(entry["key"], entry["number"]) for entry in page["layers"]] == [
        ("0", 1),
        ("2", 3),
        ("10", 11),
    ]
    rows = {row["name"]: row for row in page["layers"][1]["rows"]}
    assert (rows["head 3"]["head"], "head 0" in rows) == (2, False)  # index 2, shown from 1
    assert rows["head 3"]["values"]["fidelity"] == pytest.approx(
        {"mean": 0.4, "low": 0.39, "high": 0.42}
    )
    assert rows["mix: uniform"]["values"]["fidelity"] == pytest.approx(
        {"mean": 0.6, "low": 0.59, "high": 0.62}
    )


def test_text_rows_take_each_heads_column():
    fid = np.array([[0.1, 0.2, 0.3], [0.3, 0.4, 0.5]])  # (sequences, heads)
    layer = {"mixes": {"learned": {"fidelity": [0.5, 0.7]}}, "heads": {"fidelity": fid.tolist()}}
    rows = {row["name"]: row["values"] for row in pages.text_rows(layer)}
    assert [rows[f"head {h}"]["fidelity"]["mean"] for h in (1, 2, 3)] == pytest.approx(
        [0.2, 0.3, 0.4]
    )


def test_study_rows_show_each_mixs_own_column_and_layers_from_one():
    metrics = {
        name: {"mean": [value, value + 0.1]}
        for name, value in (("fidelity", 0.2), ("fidelity_uniform", 0.5), ("hitting_time", 3.0))
    }
    run = {"run": "r", "layers": 2, "heads": 2, "metrics": metrics}
    entries = report_page.run_layers(run)
    assert [e["label"] for e in entries] == ["r, layer 1", "r, layer 2"]
    rows = {row["name"]: row["values"] for row in entries[1]["rows"]}
    assert rows["mix: learned"]["fidelity"]["mean"] == pytest.approx(0.3)
    assert rows["mix: uniform"]["fidelity"]["mean"] == pytest.approx(0.6)


# The page in a browser.

CHROMIUM = Path(os.environ.get("BEYONDPAR_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
ATTENTION = {key: causal(HEADS, TOKENS, seed=10 + int(key)) for key in SUMMARY["layers"]}


def head_flow(key: str) -> np.ndarray:
    phi = np.random.default_rng(20 + int(key)).uniform(1e-3, 0.9, (HEADS, TOKENS))
    phi[0, 0], phi[1, 4], phi[2, 3] = 1.0, 1e-5, 2e-5  # the brightest and the worst tokens
    return phi


def made_views() -> list[dict]:
    out = []
    for name, pool in (("text", 1), ("pooled", POOL)):
        layers = {
            key: packing.layer(a, head_flow(key), {"uniform": head_flow(key)[1]}, pool)
            for key, a in ATTENTION.items()
        }
        labels = packing.block_labels(LABELS, pool)
        out.append({"name": name, "labels": labels, "pool": pool, "layers": layers})
    return out


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    if shutil.which(str(CHROMIUM)) is None:
        pytest.skip(f"no Chromium at {CHROMIUM}")
    data = pages.corpus_page(SUMMARY, made_views())
    path = html.write(tmp_path_factory.mktemp("page"), data)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.goto(path.as_uri())
        page.wait_for_selector("body[data-ready=true]", timeout=20000)
        yield page, data
        browser.close()
    assert not errors, errors


def choose(page, layer: int, head: int, view: int = 0):
    page.select_option("#view", str(view))
    page.select_option("#layer", str(layer))
    page.select_option("#head", str(head))
    key = ["0", "2", "10"][layer]
    page.wait_for_selector(f'#attention[data-drawn="{key}/{head}/{view}"]')
    return key


def plotted(page, div: str, what: str):
    return page.evaluate(f"document.getElementById('{div}').{what}")


def test_page_cells_show_the_mean_and_its_interval_in_percent(shown):
    page, _ = shown
    choose(page, 1, 2)
    assert page.eval_on_selector("#layer", "s => s.selectedOptions[0].textContent") == "layer 3"
    cell = '#layer-table tr[data-row="head 3"] td[data-field="fidelity"]'  # index 2
    assert page.text_content(cell) == "40.000 [39.000, 42.000]"
    assert page.text_content("#layer-title") == "layer 3, head 3"


def tick_texts(page, selector: str) -> list[str]:
    return page.eval_on_selector_all(selector, "ts => ts.map(t => t.textContent)")


def test_page_shows_heads_from_one_and_keeps_their_indices_inside(shown):
    """Head index h reads h + 1 in the head control, the heads' bar charts and the overview
    heatmap (its data, its tick labels and its hover), while the control's values and the
    drawn attention stay 0-based; a click on the overview's head 3 chooses index 2."""
    page, _ = shown
    choose(page, 0, 0)
    options = page.eval_on_selector_all(
        "#head option", "os => os.map(o => [o.value, o.textContent])"
    )
    assert options == [["0", "head 1"], ["1", "head 2"], ["2", "head 3"]]
    numbers = [1, 2, 3]
    assert plotted(page, "heads", "data[0].x") == numbers
    assert tick_texts(page, "#heads .xtick text") == ["1", "2", "3"]
    assert plotted(page, "overview", "data[0].x") == numbers
    assert tick_texts(page, "#overview .xtick text") == ["1", "2", "3"]
    page.evaluate(
        "document.getElementById('overview').emit('plotly_click', {points: [{x: 3, y: 1}]})"
    )
    page.wait_for_selector('#attention[data-drawn="2/2/0"]')  # layer key 2, head index 2
    assert page.input_value("#head") == "2"
    assert page.text_content("#layer-title") == "layer 3, head 3"
    title = page.eval_on_selector_all(
        "#attention .gtitle tspan.line", "els => els.map((e) => e.textContent)"
    )
    assert title == ["head 3, layer 3", "attention of text"]
    page.locator("#overview").scroll_into_view_if_needed()
    box = page.eval_on_selector(
        "#overview",
        "gd => { const r = gd.getBoundingClientRect(), x = gd._fullLayout.xaxis,"
        " y = gd._fullLayout.yaxis;"
        " return [r.left + x._offset + x.l2p(3), r.top + y._offset + y.l2p(1)]; }",
    )
    page.mouse.move(*box)  # over the cell of head 3 in layer 3
    assert page.text_content("#overview .hovertext").startswith("layer 3, head 3: ")


def test_page_heatmap_is_the_chosen_layers_and_heads_attention(shown):
    page, data = shown
    for layer, head in ((1, 2), (2, 1), (0, 0)):
        key = choose(page, layer, head)
        z = np.array(plotted(page, "attention", "data[0].customdata"), dtype=float)
        lower = np.tril_indices(TOKENS)
        assert z[lower] == pytest.approx(ATTENTION[key][head][lower], abs=2 / 255)
        assert np.isnan(z[np.triu_indices(TOKENS, 1)]).all()
        ticks = plotted(page, "attention", "layout.xaxis.tickvals")
        assert ticks == list(range(TOKENS))


def test_page_flow_and_token_strip_are_the_chosen_heads(shown):
    page, data = shown
    key = choose(page, 2, 1)
    heads = data["views"][0]["layers"][key]["heads"]
    line = plotted(page, "flow", "data[0].y")
    assert line == pytest.approx([100 * v for v in heads["values"][1]])
    strip = '#flow-tokens [data-operator="head"] span'
    assert (
        page.eval_on_selector_all(strip, "s => s.map(x => +x.dataset.value)") == heads["values"][1]
    )
    texts = page.eval_on_selector_all(strip, "s => s.map(x => x.textContent)")
    assert texts == LABELS  # '</script>' and '<b>' as text, not markup
    worst = page.eval_on_selector_all(strip, "s => s.findIndex(x => x.className === 'worst')")
    assert worst == 4


def test_page_colours_from_dark_at_the_floor_to_yellow_at_one(shown):
    page, _ = shown
    choose(page, 0, 0)
    colours = page.eval_on_selector_all(
        '#flow-tokens [data-operator="head"] span', "s => s.map(x => x.style.background)"
    )
    assert colours[0] == "rgb(253, 231, 37)"  # 100% reaches the last position
    choose(page, 0, 1)
    colours = page.eval_on_selector_all(
        '#flow-tokens [data-operator="head"] span', "s => s.map(x => x.style.background)"
    )
    assert colours[4] == "rgb(68, 1, 84)"  # below 0.01%


def test_pooled_view_marks_the_block_holding_the_worst_token(shown):
    page, data = shown
    key = choose(page, 1, 2, view=1)
    heads = data["views"][1]["layers"][key]["heads"]
    assert heads["worst_token"][2] == 3
    strip = '#flow-tokens [data-operator="head"] span'
    worst = page.eval_on_selector_all(strip, "s => s.findIndex(x => x.className === 'worst')")
    assert worst == 3 // POOL
    z = np.array(plotted(page, "attention", "data[0].customdata"), dtype=float)
    pooled = packing.pooled_attention(ATTENTION[key], POOL)[2]
    lower = np.tril_indices(len(pooled))
    assert z[lower] == pytest.approx(pooled[lower], abs=2 / 255)


def test_page_axis_labels_show_token_texts_as_text(shown):
    page, _ = shown
    choose(page, 0, 0)
    for div in ("attention", "flow"):
        ticks = page.eval_on_selector_all(f"#{div} .xtick text", "s => s.map(x => x.textContent)")
        assert ticks == LABELS  # '<s>' and '<b>' are not read as Plotly's markup
