"""The report page's assembly, without a browser: one file with everything inline (no
network), the data safe inside its script element, the attention bytes and flows the
page draws, and the layer rows it shows, read from a corpus summary and a text record."""

import json
import re

import numpy as np
import pytest

from beyondpar.analysis import coalition_summary, pages, views
from beyondpar.reports import html, packing
from helpers.browser import page_data


def test_a_page_is_one_file_with_its_scripts_and_data_inline(tmp_path):
    page = {"title": "a </script> title", "notes": ["<b>note</b>"], "layers": []}
    path = html.write(tmp_path, page)
    text = path.read_text()
    assert path.name == "index.html"
    assert "plotly.js (cartesian - minified) v3.7.0" in text
    assert page_data(text)["title"] == "a </script> title"
    assert page_data(text)["first_head"] == 1  # the page shows head index h as h + 1
    assert "&lt;b&gt;note&lt;/b&gt;" in text
    # Nothing is fetched: no script, style sheet or image comes from elsewhere.
    assert not re.search(r"<(script|link|img)[^>]*(src|href)=", text)
    for needed in ('id="layer"', 'id="head"', 'id="attention"', 'id="layer-table"'):
        assert needed in text


def test_the_page_data_cannot_close_its_script_element():
    text = html.inline_json({"label": "</script><script>alert(1)</script><!--"})
    assert "</" not in text and "<!--" not in text
    assert json.loads(text)["label"] == "</script><script>alert(1)</script><!--"
    assert json.loads(html.inline_json({"x": [float("nan"), 1.5]})) == {"x": [None, 1.5]}


def causal(heads: int, tokens: int, seed: int = 0) -> np.ndarray:
    a = np.tril(np.random.default_rng(seed).random((heads, tokens, tokens)) ** 4)
    return a / a.sum(-1, keepdims=True)


def test_attention_bytes_keep_the_causal_triangle_to_their_rounding():
    a = causal(3, 9)
    back = packing.decode(packing.encode(a), a.shape)
    rows, cols = np.triu_indices(9, 1)
    assert np.all(back[:, rows, cols] == 0)
    # One byte of the square root: an error below 1/255 of sqrt(p) + its square.
    assert np.all(np.abs(np.sqrt(back) - np.sqrt(a)) <= 0.5 / packing.LEVELS + 1e-12)


def test_pooled_attention_sums_keys_averages_queries_and_stays_causal():
    a = causal(2, 7)
    pooled = packing.pooled_attention(a, 3)
    assert pooled.shape == (2, 3, 3)
    np.testing.assert_allclose(pooled.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(pooled[:, 0, 0], a[:, :3, :3].sum(-1).mean(-1), rtol=1e-6)
    np.testing.assert_allclose(pooled[:, 2, 2], a[:, 6:, 6:].sum(-1).mean(-1), rtol=1e-6)
    assert np.all(pooled[:, 0, 1:] == 0)


def test_windows_are_pooled_only_beyond_the_byte_budget():
    assert packing.pool_size(270, 128, views.BUDGET_BYTES) == 1  # SmolLM2, one window
    pool = packing.pool_size(270, 1024, views.BUDGET_BYTES)
    assert 270 * packing.triangle(-(-1024 // pool)) <= views.BUDGET_BYTES
    assert 270 * packing.triangle(-(-1024 // (pool - 1))) > views.BUDGET_BYTES
    assert views.count(32, 30, 9, 128) == 1 and views.count(32, 2, 4, 24) == views.MAX_VIEWS
    assert packing.block_labels(["a", "b", "c"], 2) == ["0-1 'a'", "2-2 'c'"]


def test_a_flow_keeps_its_worst_token_exactly_and_each_blocks_worst():
    phi = np.array([[0.5, 0.123456, 0.9, 0.3333333], [0.2, 0.7, 0.01, 0.6]])
    got = packing.flow(phi, 1)
    assert got["worst_token"] == [1, 2] and got["worst_value"] == [0.123456, 0.01]
    assert got["values"][0] == [0.5, 0.123, 0.9, 0.333]
    assert packing.flow(phi, 2)["values"] == [[0.123, 0.333], [0.2, 0.01]]


def stat(mean):
    return {"mean": mean, "low": mean - 0.01, "high": mean + 0.02}


def heads(means):
    return {"mean": means, "low": [m - 0.01 for m in means], "high": [m + 0.02 for m in means]}


def corpus_layer(offset):
    mix = {"fidelity": stat(0.3 + offset), "gain": stat(0.05), "wins_share": 0.75}
    return {
        "mixes": {"learned": mix, "uniform": {**mix, "fidelity": stat(0.2)}},
        "heads": {
            "fidelity": heads([0.1, 0.2 + offset]),
            "hitting_time_normalized": heads([9.0, 8.0]),
        },
        "sink_mass": heads([0.4, 0.6]),
        "best_head": 1,
    }


def test_corpus_rows_are_the_summarys_numbers_in_layer_order():
    summary = {
        "source": "m",
        "corpus": "c",
        "num_windows": 3,
        "tokens_per_window": 8,
        "layers": {str(k): corpus_layer(k / 100) for k in (0, 10, 2)},  # JSON order
    }
    page = pages.corpus_page(summary)
    assert [entry["number"] for entry in page["layers"]] == [1, 3, 11]
    rows = {r["name"]: r for r in page["layers"][2]["rows"]}
    want = {"mean": 0.3, "low": 0.29, "high": 0.32}
    # Heads are shown from 1 (head index 1 is "head 2"), their index stays 0-based.
    assert rows["head 2"]["values"]["fidelity"] == pytest.approx(want)
    assert [rows[f"head {h}"]["head"] for h in (1, 2)] == [0, 1]
    assert rows["head 1"]["values"]["sink_mass"]["mean"] == 0.4
    assert rows["mix: learned"]["values"]["wins_share"] == {"mean": 0.75}
    fields = {f["name"]: f for f in page["fields"]}
    assert list(fields) == [
        "fidelity",
        "hitting_time_normalized",
        "gain",
        "wins_share",
        "sink_mass",
    ]
    assert (fields["fidelity"]["scale"], fields["fidelity"]["display_unit"]) == (100, "%")
    assert fields["hitting_time_normalized"]["display_unit"] == "steps"
    assert "coalitions" not in page["layers"][0]


def test_text_rows_are_means_over_sequences_and_coalitions_are_passed_on():
    layer = {
        "mixes": {"uniform": {"fidelity": [0.2, 0.4]}},
        "heads": {"fidelity": [[0.1, 0.3], [0.2, 0.5]]},
        "sink_mass": [[0.5, 0.5], [0.7, 0.3]],
        "coalitions": {
            "shapley_fidelity": [[0.1, 0.2], [0.3, 0.4]],
            "shapley_stderr_fidelity": [[0.0, 0.0], [0.0, 0.0]],
            "interaction_fidelity": [[[0, 1], [1, 0]], [[0, 3], [3, 0]]],
        },
    }
    games = coalition_summary.summarize(coalition_summary.batch_games({"0": layer}), {}, 0)
    record = {"source": "m", "num_sequences": 2, "seq_len": 4, "num_layers": 1, "num_heads": 2}
    record.update(layers={"0": layer}, coalitions=games)  # as analysis.json has them
    page = pages.text_page(record, views=[{"name": "text"}])
    rows = {r["name"]: r["values"] for r in page["layers"][0]["rows"]}
    assert rows["mix: uniform"]["fidelity"]["mean"] == pytest.approx(0.3)
    assert rows["head 2"]["fidelity"]["mean"] == pytest.approx(0.4)  # index 1
    assert rows["head 1"]["sink_mass"]["mean"] == pytest.approx(0.6)  # index 0
    assert "head 0" not in rows
    found = page["layers"][0]["coalitions"]
    assert found["shapley_fidelity"] == pytest.approx([0.2, 0.3])
    assert found["interaction_fidelity"] == [[0, 2], [2, 0]]
    assert page["views"] == [{"name": "text"}]
