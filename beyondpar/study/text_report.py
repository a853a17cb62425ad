"""The report of a language-model ablation: each run's last evaluation (held-out bits
per byte and the attention graphs' measures, from its `metrics.jsonl`), as mean ± std
over seeds at each head count. Layers are numbered from 1, as in the task study."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from beyondpar.base import files
from beyondpar.reports import tables
from beyondpar.study.workdir import METRICS_FILE

BPB = "eval/bits_per_byte"
LAYER_MEASURES = (
    ("best_head_fidelity", "best head's minimax fidelity (%)"),
    ("fidelity_learned", "learned mix's minimax fidelity (%)"),
    ("fidelity_uniform", "uniform mix's minimax fidelity (%)"),
    ("fidelity_optimal", "held-out optimal mix's minimax fidelity (%)"),
    ("wins_learned", "windows where the learned mix beats the best head (%)"),
    ("wins_optimal", "windows where the optimal mix beats the best head (%)"),
    ("sink_mass", "heads' attention on token 0 (%)"),
)


def last_evaluation(run_dir: Path) -> dict | None:
    """The last line of a run's metrics that holds an evaluation (None: none yet)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return None
    lines = [json.loads(line) for line in path.read_text().splitlines() if BPB in line]
    return lines[-1] if lines else None


def by_heads(workdir: Path, configs: dict) -> dict[int, list[dict]]:
    """{heads: [last evaluation of each seed's run]} for the runs that have one."""
    out = defaultdict(list)
    for name, config in configs.items():
        found = last_evaluation(workdir / name)
        if found is not None:
            out[config.model.num_heads].append(found)
    return dict(sorted(out.items()))


def cell(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    v = np.asarray(values, float) * scale
    return (
        f"{v.mean():.{digits}f} ± {v.std():.{digits}f}" if v.size > 1 else f"{v.mean():.{digits}f}"
    )


def lines_of(groups: dict[int, list[dict]], failures: list) -> list[str]:
    heads = list(groups)
    out = [
        "# Language-model ablation",
        "",
        "Layers are numbered from 1; mean ± std over seeds.",
        "",
    ]
    out += [tables.row(["H", "runs", "held-out bits/byte", "step"]), "|---:|---:|---:|---:|"]
    for h, runs in groups.items():
        steps = sorted({r["step"] for r in runs})
        out.append(tables.row([h, len(runs), cell([r[BPB] for r in runs]), steps[-1]]))
    num_layers = max((_layers(r) for runs in groups.values() for r in runs), default=0)
    for key, title in LAYER_MEASURES:
        out += ["", f"## {title}", ""]
        rows = [
            (
                layer,
                [cell([r[f"layer{layer + 1}/{key}"] for r in groups[h]], 100, 2) for h in heads],
            )
            for layer in range(num_layers)
        ]
        out += tables.layer_table([f"H={h}" for h in heads], rows)
    if failures:
        out += ["", "## Failed", ""] + [f"- {name}: {message}" for name, message in failures]
    return out


def _layers(values: dict) -> int:
    return sum(1 for k in values if k.endswith("/best_head_fidelity"))


def write_report(workdir: Path, configs: dict, out_dir: Path, failures: list) -> list[Path]:
    """report.md and summary.json (the last evaluations by head count) in `out_dir`."""
    groups = by_heads(Path(workdir), configs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / "report.md"
    files.write_text(report, "\n".join(lines_of(groups, failures)) + "\n")
    summary = out_dir / "summary.json"
    files.write_text(summary, json.dumps({str(h): r for h, r in groups.items()}, indent=1))
    return [report, summary]
