"""One text, or one corpus, through every model of a series (e.g. the training checkpoints
of one model): the real-model analogue of evaluating every step of a run.

Each model's full report goes to its own folder (for a corpus, with its own resumable
windows.jsonl) and one summary line per model is appended to `series.jsonl`; `series.md`
shows every per-layer summary against the checkpoint, layers numbered from 1 as in every
report (series.jsonl keeps the records' 0-based layer keys). A rerun skips the models already
recorded with the same settings and refuses other settings, naming every differing field;
one process per output folder.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
from pathlib import Path

import numpy as np
import tqdm

from beyondpar import measure, pretrained
from beyondpar.analysis import corpus, corpus_report, text_report, windowing
from beyondpar.analysis import text as text_lib
from beyondpar.base import files, locks, settings
from beyondpar.measure import record as schema
from beyondpar.reports import numbering, tables

SERIES_FILE = "series.jsonl"
REPORT_FILE = "series.md"
KEYS = ("model", "label", "settings", "layers")
FIDELITY, MEDIAN = schema.FIDELITY, schema.MEDIAN
HITTING = schema.HITTING_NORMALIZED
BEST_HEAD_FIDELITY, DIVERSITY = schema.BEST_HEAD_FIDELITY, schema.DIVERSITY
UNIFORM_MIX = ("mixes", schema.UNIFORM)
SUMMARY = {  # column of series.jsonl -> (what, its keys in a layer record, scale)
    "uniform_fidelity_pct": ("uniform mix minimax fidelity (%)", (*UNIFORM_MIX, FIDELITY), 100),
    "uniform_median_pct": ("uniform mix median node fidelity (%)", (*UNIFORM_MIX, MEDIAN), 100),
    "best_head_fidelity_pct": ("best head minimax fidelity (%)", (BEST_HEAD_FIDELITY,), 100),
    "hitting_time_steps": (
        f"uniform mix hitting time, normalised walk ({schema.unit_of(HITTING)})",
        (*UNIFORM_MIX, HITTING),
        1,
    ),
    "sink_mass": ("mean sink mass over heads", (schema.SINK_MASS.name,), 1),
    "head_diversity": ("head diversity", (DIVERSITY,), 1),
}
_STEP = re.compile(r"(?:step|checkpoint|ckpt|iter)[-_]?(\d+)", re.IGNORECASE)


def expand(models: str) -> list[str]:
    """Comma-separated paths or names; an item with * ? or [ is a glob (sorted matches)."""
    out = []
    for item in (m.strip() for m in models.split(",")):
        if not item:
            continue
        if any(c in item for c in "*?["):
            matches = sorted(glob.glob(os.path.expanduser(item)))
            if not matches:
                raise ValueError(f"--model pattern {item!r} matches no file or folder")
            out += matches
        else:
            out.append(item)
    if not out:
        raise ValueError(f"--model must name at least one model, got {models!r}")
    return out


def label(model: str) -> str:
    """'step 3000' when the folder or file name holds a step, else the name itself."""
    name = Path(model).name or str(model)
    m = _STEP.search(name)
    return f"step {int(m.group(1))}" if m else name


def summarize(record: dict) -> dict:
    """{layer: {column: mean over sequences}} of an analysis record, or of a corpus
    summary (whose values are {"mean", "low", "high"} over windows)."""
    out = {}
    for layer, d in record["layers"].items():
        row = {}
        for column, (_, where, scale) in SUMMARY.items():
            value = d
            for key in where:
                value = value[key]
            value = value["mean"] if isinstance(value, dict) else value
            row[column] = scale * float(np.mean(value))
        out[str(layer)] = row
    return out


def text_settings(text: str, spec: measure.MeasureSpec, dtype) -> dict:
    return {
        "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "spec": dataclasses.asdict(spec),
        "dtype": dtype,
    }


def run(models: list[str], text: str, spec, out_dir, dtype=None, progress=True, mesh=None):
    """Analyse `text` through every model not yet recorded (each loaded onto `mesh`);
    returns (records, written)."""

    def analyse(model, folder):
        full = text_lib.text_record(model, text, spec, dtype, mesh)
        text_report.write(full, folder)
        return summarize(full), float(np.mean(full["rollout"]["network_fidelity"]))

    wanted = text_settings(text, spec, dtype)
    return _series(models, wanted, analyse, out_dir, "one text", progress, pretrained.fingerprint)


def run_corpus(
    models: list[str], corpus_path, cspec, spec, out_dir, dtype=None, progress=True, mesh=None
):
    """A corpus analysis (`corpus.run`) of every model not yet recorded, each in
    its own folder; per-layer values in series.jsonl are means over windows."""
    wanted = {
        "corpus_sha256": windowing.fingerprint(corpus_path),
        "tokens": cspec.tokens,
        "max_windows": cspec.max_windows,
        "spec": dataclasses.asdict(spec),
        "dtype": dtype,
    }

    def analyse(model, folder):
        summary, _ = corpus.run(model, corpus_path, cspec, spec, folder, dtype, progress, mesh)
        corpus_report.write(summary, folder)
        return summarize(summary), summary["rollout"]["network_fidelity"]["mean"]

    what = f"one corpus ({corpus_path})"
    return _series(models, wanted, analyse, out_dir, what, progress, pretrained.fingerprint)


def _series(models, wanted: dict, analyse, out_dir, what: str, progress: bool, fingerprint=None):
    """Analyse the models not yet recorded into `out_dir`. `fingerprint` (model -> str,
    `pretrained.fingerprint`) is recorded with each model, and a model recorded with
    another is refused rather than skipped: its files changed since."""
    out_dir = Path(out_dir)
    _check_folders(models, out_dir)
    with locks.lock(out_dir):
        records = files.read_json_lines(out_dir / SERIES_FILE, KEYS)
        _check_folders([r["model"] for r in records] + models, out_dir)
        for record in records:  # each line holds the settings it was analysed with
            settings.guard(
                out_dir / SERIES_FILE,
                wanted,
                f"{out_dir / SERIES_FILE} holds a series analysed with other settings",
                "use another --out, or the old settings",
                saved=record["settings"],
                write=False,
            )
        done, asked = {_key(r["model"]) for r in records}, {_key(m) for m in models}
        _check_unchanged([r for r in records if _key(r["model"]) in asked], fingerprint, out_dir)
        todo = [m for m in models if _key(m) not in done]
        for model in tqdm.tqdm(todo, desc="models", unit="model", disable=not progress):
            layers, network = analyse(model, out_dir / _folder(model))
            line = {"model": model, "label": label(model), "settings": wanted, "layers": layers}
            if fingerprint is not None:
                line["model_sha256"] = fingerprint(model)
            line["network_fidelity_pct"] = 100 * network
            files.append_json_line(out_dir / SERIES_FILE, line)
            records.append(line)
        shown = [r for r in records if _key(r["model"]) in asked]
        written = files.write_text(out_dir / REPORT_FILE, markdown(_ordered(shown), what))
    return shown, written


def _check_unchanged(records: list[dict], fingerprint, out_dir: Path) -> None:
    """A recorded model whose files changed since (another fingerprint) is a ValueError;
    records written before fingerprints were recorded are taken as they are."""
    for record in records:
        if fingerprint is None or "model_sha256" not in record:
            continue
        if fingerprint(record["model"]) != record["model_sha256"]:
            raise ValueError(
                f"--model {record['model']} changed since {out_dir / SERIES_FILE} recorded it "
                "(its files' fingerprint differs); use another --out, or the model it recorded"
            )


def _key(model: str) -> str:
    """One spelling of a model: a path that exists by its real path (`a/`, `./a` and an
    absolute `a` are one model), a name as it is."""
    return os.path.realpath(model) if os.path.exists(model) else model


def _folder(model: str) -> str:
    name = Path(model).name or "model"
    return re.sub(r"[^\w.-]+", "_", name)


def _check_folders(models: list[str], out_dir: Path) -> None:
    """Two models whose names give one report folder are a ValueError naming both."""
    seen = {}
    for model in dict.fromkeys(models):
        other = seen.setdefault(_folder(model), model)
        if _key(other) != _key(model):
            raise ValueError(
                f"--model: {other} and {model} would share the report folder "
                f"{out_dir / _folder(model)}; each model of a series needs its own folder "
                "name (rename one, or analyse them into separate --out folders)"
            )


def _ordered(records: list[dict]) -> list[dict]:
    """By step when every label has one, else as given."""
    steps = [_STEP.search(r["label"].replace(" ", "")) for r in records]
    if all(steps):
        return [
            r for _, r in sorted(zip(steps, records, strict=True), key=lambda p: int(p[0].group(1)))
        ]
    return records


def markdown(records: list[dict], what: str = "one text") -> str:
    is_corpus = what.startswith("one corpus")
    over, each = ("windows", "corpus.json") if is_corpus else ("sequences", "analysis.json")
    lines = [
        "# Series analysis",
        "",
        f"{len(records)} model(s), {what}; per-layer values are means over {over}. "
        + numbering.note("series.jsonl", f"each model's {each}", heads=False)
        + " Each model's full report is in its own folder.",
        "",
        "| checkpoint | network fidelity (%) |",
        "|---|---:|",
    ]
    lines += [tables.row([r["label"], f"{r['network_fidelity_pct']:.4f}"]) for r in records]
    layers = sorted({int(k) for r in records for k in r["layers"]})
    for column, (heading, _, _) in SUMMARY.items():
        lines += ["", f"## {heading}", ""]
        lines.append(tables.row(["checkpoint", *(f"layer {numbering.number(k)}" for k in layers)]))
        lines.append("|---|" + "---:|" * len(layers))
        for r in records:
            cells = [r["layers"].get(str(k), {}).get(column) for k in layers]
            lines.append(
                tables.row([r["label"], *("-" if c is None else f"{c:.4g}" for c in cells)])
            )
    return "\n".join(lines) + "\n"
