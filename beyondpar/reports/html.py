"""index.html: one self-contained page beside a report.md, with the same numbers, that a
browser opens from disk (file://) with no network: the data, plotly.js (vendored, see
static/README.md) and the page's own script are all inline.

A page is drawn from one JSON-able dict (`page`) that each workflow builds from its own
record; this module knows nothing of records. Its keys, all optional but `title`:

    title, notes         the heading and paragraphs under it
    fields               [{name, label, unit, scale, display_unit}]: the layer table's
                         columns (`scale` 100 shows a fraction in percent)
    row_label            the layer table's first column heading ("operator" unless given)
    layers               [{key, number, label?, rows, coalitions?}]: rows are
                         {name, kind: "mix" | "head", head?, values: {field: stat}},
                         head the 0-based index (the page shows it from 1, as
                         `numbering.head_number` does; name as `numbering.head_name`),
                         a stat {mean, low?, high?} in the record's own units;
                         coalitions {shapley_fidelity (H,), interaction_fidelity (H, H)}
    views                [{name, labels, pool, layers: {key: layer view}}]: a text's or
                         window's attention and flow to the sink (`analysis.views`,
                         `study.attention_view`), under the keys of `layers`; a view
                         lacking the chosen layer gives way to the first that has it
                         (a study's views hold a run each and follow the layer chosen)
    study                {head_counts, series: [{name, unit, heads, mean, std}],
                          curves: [{name, step, loss}],
                          charts?: [{title, x: "heads" | "step", y, scale,
                                     lines: [{name, x, mean, low, high}]}]}

`page_html` adds `levels` (the attention bytes' scale) and `first_head`
(`numbering.FIRST_HEAD`: the number the page shows for head index 0).
"""

from __future__ import annotations

import html
import json
import math
import os
from importlib import resources
from pathlib import Path

from beyondpar.base import files
from beyondpar.reports import numbering

FILE = "index.html"
PLOTLY = "plotly-cartesian.min.js"
SCRIPT = "page.js"
FIDELITY = "fidelity"  # the field the overview and the heads' charts draw
LEVELS = 255  # attention bytes: probability = (byte / LEVELS)^2 (see `packing`)

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px;
  padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
#controls { position: sticky; top: 0; background: #fff; padding: .5em 0; z-index: 10;
  border-bottom: 1px solid #ddd; }
#controls label { margin-right: 1.2em; } select { font-size: 1em; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
tr.chosen { background: #fde2e2; } tr[data-kind="mix"] { background: #eef4fb; }
#flow-tokens { line-height: 1.9; font-family: ui-monospace, monospace; }
#flow-tokens span { display: inline-block; padding: 0 2px; margin: 1px; white-space: pre;
  border-radius: 2px; }
#flow-tokens span.worst { outline: 3px solid #d62728; }
#flow-tokens .strip { margin: .4em 0; } #flow-tokens b { margin-right: .6em; }
.note { color: #555; }
"""

BODY = """
<h1>{title}</h1>
{notes}
<div id="controls">
  <label>Layer <select id="layer" aria-label="layer"></select></label>
  <label>Head <select id="head" aria-label="head"></select></label>
  <label id="view-control">Text <select id="view" aria-label="text or window"></select></label>
</div>
<section id="view-section" hidden>
  <h2>Attention and flow to the sink</h2>
  <div id="attention"></div>
  <p id="attention-note" class="note"></p>
  <div id="flow"></div>
  <p id="flow-scale" class="note"></p>
  <div id="flow-tokens"></div>
</section>
<section id="layers-section">
  <h2 id="layer-title">Layer</h2>
  <table id="layer-table"></table>
  <div id="heads"></div>
  <div id="overview"></div>
  <div id="mixes"></div>
</section>
<!-- Coalitions: drawn when a layer carries Shapley values and pair interactions. -->
<section id="coalitions-section" hidden>
  <h2>Coalitions of heads</h2>
  <div id="coalitions-shapley"></div>
  <div id="coalitions-interaction"></div>
</section>
<section id="study-section">{study}</section>
"""


def asset(name: str) -> str:
    """A file of `static/` (installed with the package)."""
    return resources.files("beyondpar.reports").joinpath("static", name).read_text("utf-8")


def inline_json(obj) -> str:
    """JSON safe inside a <script> element: every `<` escaped, so no `</script>` or `<!--`
    in a label can end it early."""
    text = json.dumps(finite(obj), separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c")


def finite(value):
    """NaN and infinities as null: the browser's JSON has no words for them."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def page_html(page: dict) -> str:
    """The whole page as one string."""
    notes = "\n".join(f'<p class="note">{html.escape(n)}</p>' for n in page.get("notes", ()))
    study = ""
    if page.get("study"):
        study = '<h2>Study</h2><div id="study-heads"></div><div id="study-loss"></div>'
    body = BODY.format(title=html.escape(page["title"]), notes=notes, study=study)
    data = inline_json({**page, "levels": LEVELS, "first_head": numbering.FIRST_HEAD})
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(page['title'])}</title>",
            f"<style>{STYLE}</style>",
            "</head><body>",
            body,
            f'<script id="page-data" type="application/json">{data}</script>',
            f"<script>{asset(PLOTLY)}</script>",
            f"<script>{asset(SCRIPT)}</script>",
            "</body></html>",
            "",
        ]
    )


def write(out_dir: str | os.PathLike, page: dict) -> Path:
    """index.html in `out_dir` (written atomically); returns its path."""
    return files.write_text(Path(out_dir) / FILE, page_html(page))


def stat(mean, low=None, high=None) -> dict:
    """A table cell's numbers: a mean, and its interval when there is one."""
    out = {"mean": float(mean)}
    if low is not None:
        out.update(low=float(low), high=float(high))
    return out
