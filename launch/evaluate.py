"""Evaluate trees of runs or the paper's released checkpoints:

python launch/evaluate.py --runs=runs/ablation [--steps=all]
python launch/evaluate.py --reference=path/to/reference --out=out/reference
"""

import json
import sys
from pathlib import Path

from absl import app, flags, logging

from beyondpar import evaluate, files, parallel, report

RUNS = flags.DEFINE_string("runs", None, "Folder holding runs (config.json + checkpoints).")
STEPS = flags.DEFINE_enum("steps", "latest", ["latest", "all"], "Which saved steps.")
REFERENCE = flags.DEFINE_string("reference", None, "Folder of <H>_heads_<task>.npz|.pt files.")
OUT = flags.DEFINE_string("out", None, "Report folder (default: <runs>/report).")
flags.mark_flags_as_required([])


def evaluate_runs(root: Path) -> int:
    new, failures = evaluate.evaluate_tree(root, STEPS.value)
    records = evaluate.read_records(root / evaluate.RECORDS_FILE)
    print(f"{len(new)} new record(s), {len(records)} in {root / evaluate.RECORDS_FILE}")
    if records:
        written = report.write_report(records, Path(OUT.value or root / "report"))
        print("report: " + ", ".join(str(p) for p in written))
    for name, message in failures:
        print(f"FAILED {name}: {message}")
    return 1 if failures else 0


def evaluate_reference(folder: Path) -> int:
    paths = sorted(
        p for p in folder.iterdir() if "_heads_" in p.name and p.suffix in (".npz", ".pt")
    )
    paths = [p for p in paths if not p.name.endswith(".expected.npz")]
    records, status = [], 0
    for path in paths:
        if path.suffix == ".pt" and path.with_suffix(".npz") in paths:
            continue  # the same weights; .npz needs no torch
        try:
            records.append(evaluate.evaluate_reference(path))
        except (ImportError, ValueError) as err:
            print(f"FAILED {path.name}: {err}")
            status = 1
    out = Path(OUT.value or "out/reference")
    files.write_text(out / "records.jsonl", "".join(f"{json.dumps(r)}\n" for r in records))
    if records:
        written = report.write_report(records, out)
        print("report: " + ", ".join(str(p) for p in written))
    return status


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    if bool(RUNS.value) == bool(REFERENCE.value):
        raise app.UsageError("give exactly one of --runs or --reference")
    sys.exit(
        evaluate_runs(Path(RUNS.value)) if RUNS.value else evaluate_reference(Path(REFERENCE.value))
    )


if __name__ == "__main__":
    parallel.use_all_cpu_cores()
    app.run(main)
