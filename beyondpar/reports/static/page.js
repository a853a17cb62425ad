// The report page: reads the JSON in #page-data (see beyondpar/reports/html.py for its
// shape) and draws every part with Plotly. No network: everything is inline.
(function () {
  "use strict";
  const page = JSON.parse(document.getElementById("page-data").textContent);
  const $ = (id) => document.getElementById(id);
  const state = { layer: 0, head: 0, view: 0 };
  const CONFIG = { displaylogo: false, responsive: true };
  const MAX_LABELS = 40; // tick labels per axis: every k-th beyond this
  const LOG_FLOOR = -4; // log10 of the smallest probability or share a colour tells apart

  // Heads are 0-based in the data (row.head, state.head, the views' lists) and shown from
  // page.first_head (1: beyondpar/reports/numbering.py) in every label, tick and hover.
  const FIRST_HEAD = page.first_head === undefined ? 1 : page.first_head;
  const fields = page.fields || [];
  const layers = page.layers || [];
  const views = page.views || [];

  function digits(field) {
    return field.unit === "steps" ? 2 : 3;
  }

  function show(field, x) {
    return x === null || x === undefined ? "-" : (field.scale * x).toFixed(digits(field));
  }

  function cellText(field, stat) {
    if (!stat) return "-";
    let text = show(field, stat.mean);
    if (stat.low !== undefined) text += " [" + show(field, stat.low) + ", " + show(field, stat.high) + "]";
    return text;
  }

  function layerName() {
    const l = layers[state.layer];
    return l.label || "layer " + l.number;
  }

  function headNumber(h) {
    return h + FIRST_HEAD;
  }

  function headName() {
    const row = headRows(layers[state.layer])[state.head];
    return row ? row.name : "head " + headNumber(state.head);
  }

  function headRows(layer) {
    return layer.rows.filter((r) => r.kind === "head");
  }

  function mixRows(layer) {
    return layer.rows.filter((r) => r.kind === "mix");
  }

  function option(select, value, text) {
    const o = document.createElement("option");
    o.value = String(value);
    o.textContent = text;
    select.appendChild(o);
  }

  function fillSelects() {
    layers.forEach((l, i) => option($("layer"), i, l.label || "layer " + l.number));
    views.forEach((v, i) => option($("view"), i, v.name));
    $("view-control").hidden = views.length < 2 || Boolean(page.study); // a study's follow the layer
    fillHeads();
  }

  function fillHeads() {
    const select = $("head");
    const rows = layers.length ? headRows(layers[state.layer]) : [];
    select.innerHTML = "";
    rows.forEach((row, h) => option(select, h, row.name));
    state.head = Math.min(state.head, Math.max(0, rows.length - 1));
    select.value = String(state.head);
  }

  function drawTable() {
    const table = $("layer-table");
    table.innerHTML = "";
    if (!layers.length) return;
    const layer = layers[state.layer];
    const head = table.createTHead().insertRow();
    const th = (text) => {
      const cell = document.createElement("th");
      cell.textContent = text;
      head.appendChild(cell);
    };
    th(page.row_label || "operator");
    fields.forEach((f) => th(f.label + (f.display_unit ? " (" + f.display_unit + ")" : "")));
    const body = table.createTBody();
    layer.rows.forEach((row) => {
      const tr = body.insertRow();
      tr.dataset.row = row.name;
      tr.dataset.kind = row.kind;
      if (row.kind === "head" && row.head === state.head) tr.className = "chosen";
      tr.insertCell().textContent = row.name;
      fields.forEach((f) => {
        const td = tr.insertCell();
        const stat = row.values[f.name];
        td.dataset.field = f.name;
        td.textContent = cellText(f, stat);
        if (!stat) return;
        td.dataset.value = String(stat.mean);
        if (stat.low !== undefined) {
          td.dataset.low = String(stat.low);
          td.dataset.high = String(stat.high);
        }
      });
    });
    const headed = headRows(layer).length > 0;
    $("layer-title").textContent = layerName() + (headed ? ", " + headName() : "");
  }

  function statOf(row, name) {
    return row && row.values[name] ? row.values[name] : null;
  }

  function errorBars(stats, scale) {
    if (!stats.length || !stats[0] || stats[0].low === undefined) return undefined;
    return {
      type: "data",
      symmetric: false,
      array: stats.map((s) => (s ? scale * (s.high - s.mean) : 0)),
      arrayminus: stats.map((s) => (s ? scale * (s.mean - s.low) : 0)),
    };
  }

  function drawOverview() {
    $("overview").hidden = !layers.some((l) => headRows(l).length);
    if ($("overview").hidden) return;
    const numbers = layers.map((l) => l.number);
    const names = layers.map((l) => l.label || String(l.number));
    const rowsAt = [...layers.keys()];
    const width = Math.max(...layers.map((l) => headRows(l).length));
    const z = layers.map((l) => {
      const row = headRows(l).map((r) => (statOf(r, "fidelity") ? 100 * statOf(r, "fidelity").mean : null));
      while (row.length < width) row.push(null);
      return row;
    });
    const step = layers.length > 30 ? 2 : 1;
    const shownAt = rowsAt.filter((i) => i % step === 0);
    const heat = {
      type: "heatmap", z: z, x: [...Array(width).keys()].map(headNumber), y: rowsAt, colorscale: "Viridis",
      text: layers.map((l) => Array(width).fill(l.label || "layer " + l.number)),
      colorbar: { title: { text: "minimax fidelity (%)" } },
      hovertemplate: "%{text}, head %{x}: %{z:.3f}%<extra></extra>",
    };
    Plotly.newPlot($("overview"), [heat], {
      title: { text: "Each head's minimax fidelity (click a cell to choose it)" },
      xaxis: { title: { text: "head" }, dtick: 1 },
      yaxis: { title: { text: page.study ? "" : "layer" }, autorange: "reversed", tickvals: shownAt,
        ticktext: shownAt.map((i) => names[i]), automargin: true },
      height: Math.max(320, 16 * layers.length + 140), margin: { t: 50 },
    }, CONFIG).then((div) => div.on("plotly_click", (ev) => choose(ev.points[0].y, ev.points[0].x - FIRST_HEAD)));
    drawMixesByLayer(numbers);
  }

  function drawMixesByLayer(numbers) {
    // A study's entries are (run, layer) pairs: its own charts below compare them.
    $("mixes").hidden = layers.length < 2 || Boolean(page.study);
    if ($("mixes").hidden) return;
    const names = mixRows(layers[0]).map((r) => r.name);
    const traces = names.map((name) => {
      const stats = layers.map((l) => statOf(l.rows.find((r) => r.name === name), "fidelity"));
      return {
        type: "scatter", mode: "lines+markers", name: name, x: numbers,
        y: stats.map((s) => (s ? 100 * s.mean : null)), error_y: errorBars(stats, 100),
      };
    });
    const best = layers.map((l) => Math.max(...headRows(l).map((r) => (statOf(r, "fidelity") || { mean: NaN }).mean)));
    traces.push({ type: "scatter", mode: "lines", name: "best head", x: numbers,
      y: best.map((v) => 100 * v), line: { dash: "dot", color: "gray" } });
    Plotly.newPlot($("mixes"), traces, {
      title: { text: "Minimax fidelity of each mix per layer" },
      xaxis: { title: { text: "layer" }, dtick: layers.length > 30 ? 2 : 1 },
      yaxis: { title: { text: "minimax fidelity (%, log)" }, type: "log" },
      height: 360, margin: { t: 50 },
    }, CONFIG);
  }

  function drawHeads() {
    const rows = layers.length ? headRows(layers[state.layer]) : [];
    $("heads").hidden = !rows.length;
    if (!rows.length) return;
    const charted = ["fidelity", "hitting_time_normalized", "hitting_time", "sink_mass"];
    const panels = fields.filter((f) => charted.includes(f.name))
      .map((f) => [f.name, f.label + (f.display_unit ? " (" + f.display_unit + ")" : ""), f.scale]);
    const shown = panels.filter((p) => rows.some((r) => statOf(r, p[0])));
    const traces = shown.map((p, i) => {
      const stats = rows.map((r) => statOf(r, p[0]));
      return {
        type: "bar", name: p[1], x: rows.map((r) => headNumber(r.head)), xaxis: "x" + (i ? i + 1 : ""),
        yaxis: "y" + (i ? i + 1 : ""), y: stats.map((s) => (s ? p[2] * s.mean : null)),
        error_y: errorBars(stats, p[2]),
        marker: { color: rows.map((r) => (r.head === state.head ? "#d62728" : "#1f77b4")) },
      };
    });
    const layout = { grid: { rows: 1, columns: shown.length, pattern: "independent" },
      showlegend: false, height: 320, margin: { t: 60 },
      title: { text: "Heads of " + layerName() + " (chosen head in red)" } };
    shown.forEach((p, i) => {
      layout["xaxis" + (i ? i + 1 : "")] = { title: { text: "head" }, dtick: 1 };
      layout["yaxis" + (i ? i + 1 : "")] = { title: { text: p[1] } };
    });
    Plotly.react($("heads"), traces, layout, CONFIG);
  }

  // One byte per cell on and below the diagonal, row by row, head after head, gzipped
  // and in base64 (see beyondpar/reports/packing.py); probability = (byte / levels)^2.
  const inflated = new Map();

  function inflate(text) {
    if (!inflated.has(text)) {
      const packed = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
      const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream("gzip"));
      inflated.set(text, new Response(stream).arrayBuffer().then((b) => new Uint8Array(b)));
    }
    return inflated.get(text);
  }

  function square(bytes, n) {
    let at = state.head * (n * (n + 1)) / 2;
    const z = [];
    for (let i = 0; i < n; i++) {
      const row = new Array(n).fill(null);
      for (let j = 0; j <= i; j++) row[j] = Math.pow(bytes[at++] / page.levels, 2);
      z.push(row);
    }
    return z;
  }

  function ticks(labels) {
    const step = Math.max(1, Math.ceil(labels.length / MAX_LABELS));
    const vals = [];
    for (let i = 0; i < labels.length; i += step) vals.push(i);
    return { tickvals: vals, ticktext: vals.map((i) => short(labels[i])), step: step };
  }

  function short(label) {
    const text = JSON.stringify(label).slice(1, -1);
    return plain(text.length > 12 ? text.slice(0, 11) + "…" : text);
  }

  // Plotly reads tags such as <b> or <s> in its labels: a token's text is shown as text.
  function plain(text) {
    return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function logTicks() {
    const vals = [];
    for (let e = LOG_FLOOR; e <= 0; e++) vals.push(e);
    return { tickvals: vals, ticktext: vals.map((e) => String(Math.pow(10, e))) };
  }

  // The chosen view's entry for the chosen layer. A study's views each hold one run's
  // layers: when the chosen view lacks the layer, the view that holds it is chosen.
  function viewLayer() {
    const key = layers.length ? layers[state.layer].key : undefined;
    if (views[state.view] && !views[state.view].layers[key]) {
      const found = views.findIndex((v) => v.layers[key]);
      if (found >= 0) {
        state.view = found;
        $("view").value = String(found);
      }
    }
    const view = views[state.view];
    return view ? view.layers[key] : undefined;
  }

  let drawn = 0; // the latest attention draw: an earlier one that ends later is dropped

  async function drawAttention() {
    const data = viewLayer();
    $("view-section").hidden = !data;
    if (!data) return;
    const ticket = ++drawn;
    const bytes = await inflate(data.attention);
    if (ticket !== drawn) return;
    const view = views[state.view];
    const raw = square(bytes, data.shape[1]);
    const logs = raw.map((r) => r.map((p) => (p === null ? null : Math.max(LOG_FLOOR, Math.log10(Math.max(p, 1e-12))))));
    const axis = ticks(view.labels);
    const idx = [...Array(view.labels.length).keys()];
    const trace = {
      type: "heatmap", z: logs, x: idx, y: idx, customdata: raw, colorscale: "Viridis",
      zmin: LOG_FLOOR, zmax: 0,
      colorbar: Object.assign({ title: { text: "attention probability (log scale)" } }, logTicks()),
      text: idx.map((i) => idx.map((j) => plain(view.labels[i] + " → " + view.labels[j]))),
      hovertemplate: "query %{y} reads key %{x}<br>%{text}<br>probability %{customdata:.4f}<extra></extra>",
    };
    const size = Math.min(720, Math.max(360, 9 * idx.length + 200));
    await Plotly.react($("attention"), [trace], {
      // Two lines: a layer's name and a view's name together outgrow the smallest heatmap.
      title: { text: headName() + ", " + layerName() + "<br>attention of " + plain(view.name) },
      xaxis: { title: { text: "key (token read)" }, tickvals: axis.tickvals, ticktext: axis.ticktext, tickangle: -60 },
      yaxis: { title: { text: "query (token reading)" }, tickvals: axis.tickvals, ticktext: axis.ticktext, autorange: "reversed" },
      width: size + 160, height: size + 20, margin: { l: 110, b: 110, t: 70 },
    }, CONFIG);
    if (window.beyondparFirstHeatmapMs === undefined) window.beyondparFirstHeatmapMs = performance.now();
    $("attention").dataset.drawn = layers[state.layer].key + "/" + state.head + "/" + state.view;
    $("attention-note").textContent = view.pool > 1
      ? "Blocks of " + view.pool + " tokens: a block of keys sums its attention, a block of queries averages it; every " + axis.step + "-th label shown."
      : (axis.step > 1 ? "Every " + axis.step + "-th token labelled. " : "") + "Rows: queries; columns: the keys they read; above the diagonal: masked.";
  }

  function flowTraces(data, view) {
    const idx = [...Array(view.labels.length).keys()];
    const series = [[headName(), data.heads.values[state.head], data.heads.worst_token[state.head], data.heads.worst_value[state.head]]];
    Object.entries(data.mixes).forEach(([name, f]) => series.push(["mix: " + name, f.values, f.worst_token, f.worst_value]));
    const traces = [];
    series.forEach(([name, values, worst, value]) => {
      traces.push({ type: "scatter", mode: "lines", name: name, x: idx, y: values.map((v) => 100 * v), text: view.labels.map(plain),
        hovertemplate: "%{x} %{text}: %{y:.3g}%<extra>" + name + "</extra>" });
      traces.push({ type: "scatter", mode: "markers", showlegend: false, name: name + ", worst token",
        x: [Math.floor(worst / view.pool)], y: [100 * value], marker: { symbol: "x", size: 11, color: "black" },
        hovertemplate: "worst-served token " + worst + ": %{y:.4g}%<extra>" + name + "</extra>" });
    });
    return traces;
  }

  function drawFlow() {
    const data = viewLayer();
    if (!data) return;
    const view = views[state.view];
    const axis = ticks(view.labels);
    Plotly.react($("flow"), flowTraces(data, view), {
      title: { text: "Flow to the sink: each token's node fidelity, max over t of its share at the last position" },
      xaxis: { title: { text: "token" }, tickvals: axis.tickvals, ticktext: axis.ticktext, tickangle: -60 },
      yaxis: { title: { text: "share reaching the last position (%, log)" }, type: "log" },
      height: 380, margin: { b: 110, t: 50 },
    }, CONFIG);
    drawTokens(data, view);
  }

  function colour(v) {
    // Viridis at log10(v) between LOG_FLOOR and 0.
    const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    const t = Math.min(1, Math.max(0, (Math.log10(Math.max(v, 1e-12)) - LOG_FLOOR) / -LOG_FLOOR));
    const x = t * (stops.length - 1);
    const k = Math.min(stops.length - 2, Math.floor(x));
    const c = stops[k].map((a, i) => Math.round(a + (stops[k + 1][i] - a) * (x - k)));
    return "rgb(" + c.join(",") + ")";
  }

  // A strip of tokens per operator (the head, then each mix), each token coloured by its
  // node fidelity; the operator's worst-served token outlined.
  function drawTokens(data, view) {
    const box = $("flow-tokens");
    box.innerHTML = "";
    const strips = [["head", headName(), data.heads.values[state.head], data.heads.worst_token[state.head]]];
    Object.entries(data.mixes).forEach(([name, f]) => strips.push([name, "mix: " + name, f.values, f.worst_token]));
    strips.forEach(([key, title, values, worstToken]) => {
      const strip = document.createElement("div");
      strip.className = "strip";
      strip.dataset.operator = key;
      const name = document.createElement("b");
      name.textContent = title;
      strip.appendChild(name);
      const worst = Math.floor(worstToken / view.pool);
      view.labels.forEach((label, i) => strip.appendChild(token(label, i, values[i], i === worst)));
      box.appendChild(strip);
    });
    const value = data.heads.worst_value[state.head];
    $("flow-scale").textContent = "Colour: share of each token reaching the last position (node fidelity), log scale from 0.01% (dark) to 100% (yellow); each operator's worst-served token is outlined in red (" + headName() + ": " + (100 * value).toPrecision(3) + "%).";
  }

  function token(label, i, value, worst) {
    const span = document.createElement("span");
    span.textContent = label;
    span.style.background = colour(value);
    span.style.color = Math.log10(Math.max(value, 1e-12)) > -1.5 ? "black" : "white";
    span.dataset.value = String(value);
    span.title = "token " + i + ": " + (100 * value).toPrecision(3) + "% reaches the last position";
    if (worst) span.className = "worst";
    return span;
  }

  // Coalition data (Shapley values and pair interactions of the heads) is drawn when a
  // layer carries it: page.layers[i].coalitions = {shapley_fidelity: (H,),
  // interaction_fidelity: (H, H)}, from the record's `coalitions` entry.
  function drawCoalitions() {
    const c = layers.length ? layers[state.layer].coalitions : undefined;
    $("coalitions-section").hidden = !c;
    if (!c) return;
    const heads = c.shapley_fidelity.map((_, h) => h);
    const numbers = heads.map(headNumber);
    Plotly.react($("coalitions-shapley"), [{ type: "bar", x: numbers, y: c.shapley_fidelity.map((v) => 100 * v),
      marker: { color: heads.map((h) => (h === state.head ? "#d62728" : "#1f77b4")) } }], {
      title: { text: "Shapley value of each head (minimax fidelity)" }, height: 320,
      xaxis: { title: { text: "head" }, dtick: 1 }, yaxis: { title: { text: "Shapley value (pp of fidelity)" } },
    }, CONFIG);
    if (!c.interaction_fidelity) return;
    Plotly.react($("coalitions-interaction"), [{ type: "heatmap", x: numbers, y: numbers, colorscale: "RdBu", zmid: 0,
      z: c.interaction_fidelity.map((r) => r.map((v) => 100 * v)), colorbar: { title: { text: "interaction (pp)" } } }], {
      title: { text: "Pair interaction of the heads (minimax fidelity)" }, height: 380,
      xaxis: { title: { text: "head" }, dtick: 1 }, yaxis: { title: { text: "head" }, dtick: 1, autorange: "reversed" },
    }, CONFIG);
  }

  function drawStudy() {
    const study = page.study;
    if (!study) return;
    drawCharts(study.charts || []);
    if (!study.series.length) return;
    const traces = [];
    const layout = { grid: { rows: 1, columns: 2, pattern: "independent" }, height: 380, margin: { t: 50 },
      title: { text: "Measures against head count (mean over seeds ± std)" },
      xaxis: { title: { text: "heads" }, type: "log", tickvals: study.head_counts },
      yaxis: { title: { text: "minimax fidelity, layer mean (%)" } },
      xaxis2: { title: { text: "heads" }, type: "log", tickvals: study.head_counts },
      yaxis2: { title: { text: "hitting time, layer mean (steps)" } } };
    const names = [...new Set(study.series.map((s) => s.name))];
    const palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
    study.series.forEach((s) => {
      const axis = s.unit === "steps" ? "2" : "";
      const scale = s.unit === "fraction" ? 100 : 1;
      const color = palette[names.indexOf(s.name) % palette.length];
      traces.push({ type: "scatter", mode: "lines+markers", name: s.name, x: s.heads, xaxis: "x" + axis, yaxis: "y" + axis,
        legendgroup: s.name, showlegend: !axis, line: { color: color }, marker: { color: color },
        y: s.mean.map((v) => scale * v), error_y: { type: "data", array: s.std.map((v) => scale * v) } });
    });
    Plotly.newPlot($("study-heads"), traces, layout, CONFIG);
    if (!study.curves || !study.curves.length) return;
    Plotly.newPlot($("study-loss"), study.curves.map((c) => ({ type: "scatter", mode: "lines", name: c.name, x: c.step, y: c.loss })), {
      title: { text: "Training loss against step" }, height: 360,
      xaxis: { title: { text: "step" } }, yaxis: { title: { text: "loss (nats per token)" }, type: "log" },
    }, CONFIG);
  }

  // study.charts: [{title, x: "heads" | "step", y (axis unit), scale, lines: [{name, x,
  // mean, low, high}]}], a chart each, with 95% interval bars where low is not null.
  function drawCharts(charts) {
    charts.forEach((c) => {
      const div = document.createElement("div");
      div.className = "study-chart";
      $("study-section").appendChild(div);
      const traces = c.lines.map((l) => ({
        type: "scatter", mode: "lines+markers", name: l.name, x: l.x,
        y: l.mean.map((v) => (v === null ? null : c.scale * v)),
        error_y: { type: "data", symmetric: false, visible: l.low.some((v) => v !== null),
          array: l.mean.map((v, i) => (l.high[i] === null ? 0 : c.scale * (l.high[i] - v))),
          arrayminus: l.mean.map((v, i) => (l.low[i] === null ? 0 : c.scale * (v - l.low[i]))) },
      }));
      const heads = c.x === "heads";
      Plotly.newPlot(div, traces, {
        title: { text: c.title }, height: 340, margin: { t: 50 }, showlegend: true,
        xaxis: heads ? { title: { text: "heads" }, type: "log", tickvals: page.study.head_counts }
          : { title: { text: "step" } },
        yaxis: { title: { text: c.y } },
      }, CONFIG);
    });
  }

  function redrawLayer() {
    drawTable();
    drawHeads();
    drawAttention();
    drawFlow();
    drawCoalitions();
  }

  function choose(layer, head) {
    if (layer >= 0 && layer !== state.layer) {
      state.layer = layer;
      $("layer").value = String(layer);
      fillHeads();
    }
    if (head !== undefined) {
      state.head = head;
      $("head").value = String(head);
    }
    redrawLayer();
  }

  function init() {
    fillSelects();
    $("layer").addEventListener("change", (e) => choose(Number(e.target.value)));
    $("head").addEventListener("change", (e) => choose(state.layer, Number(e.target.value)));
    $("view").addEventListener("change", (e) => {
      state.view = Number(e.target.value);
      redrawLayer();
    });
    // A lone entry with no heads (the language study's table) has nothing to choose.
    $("controls").hidden = !layers.length || (layers.length < 2 && !headRows(layers[0]).length);
    $("layers-section").hidden = !layers.length;
    drawTable();
    // The rest after the first heatmap is on screen.
    drawAttention().finally(() => {
      drawOverview();
      drawHeads();
      drawFlow();
      drawCoalitions();
      drawStudy();
      document.body.dataset.ready = "true";
    });
  }

  init();
}());
