"""Evaluate trees of runs or the paper's released checkpoints:

python launch/evaluate.py --runs=runs/ablation [--steps=all]
python launch/evaluate.py --reference=path/to/reference --out=out/reference
python launch/evaluate.py --runs=runs/ablation --coalitions   # + the heads' coalitions
"""

import json
from pathlib import Path

from absl import flags, logging

from beyondpar.base import cli, files, locks, parallel
from beyondpar.study import evaluate, report

RUNS = flags.DEFINE_string("runs", None, "Folder holding runs (config.json + checkpoints).")
STEPS = flags.DEFINE_enum("steps", "latest", ["latest", "all"], "Which saved steps.")
REFERENCE = flags.DEFINE_string("reference", None, "Folder of <H>_heads_<task>.npz|.pt files.")
OUT = flags.DEFINE_string("out", None, "Report folder (default: <runs>/report).")
COALITIONS = flags.DEFINE_bool(
    "coalitions", False, "Every coalition of each layer's heads as a game (fidelity, loss)."
)
flags.mark_flags_as_required([])


def evaluate_runs(root: Path) -> int:
    new, failures = evaluate.evaluate_tree(root, STEPS.value, coalitions=COALITIONS.value)
    problems: list[str] = []
    records = evaluate.read_records(root / evaluate.RECORDS_FILE, problems)
    for problem in problems:
        print(f"skipped {problem}")
    print(
        f"evaluated {len(new)} checkpoint(s), skipped {len(records) - len(new)} already "
        f"recorded, failed {len(failures)}; {len(records)} record(s) in "
        f"{root / evaluate.RECORDS_FILE}"
    )
    if records:
        for path in report.write_report(
            records, Path(OUT.value or root / "report"), failures, runs_root=root
        ):
            print(f"wrote {path}")
    for name, message in failures:
        print(f"FAILED {name}: {message}")
    return 1 if failures else 0


def evaluate_reference(folder: Path) -> int:
    evaluate.reference_files(folder)  # a bad --reference is refused before --out is made
    out = Path(OUT.value or "out/reference")
    with locks.lock(out):  # one process per report folder, as for --runs
        spec = evaluate.EvalSpec(coalitions=COALITIONS.value)
        records, failures = evaluate.evaluate_reference_folder(folder, spec)
        print(f"evaluated {len(records)} checkpoint(s), failed {len(failures)}")
        if records:
            lines = "".join(f"{json.dumps(r)}\n" for r in records)
            written = [files.write_text(out / "records.jsonl", lines)]
            written += report.write_report(records, out, failures)
            for path in written:
                print(f"wrote {path}")
    for name, message in failures:
        print(f"FAILED {name}: {message}")
    return 1 if failures else 0


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    if cli.exactly_one(runs=RUNS.value, reference=REFERENCE.value) == "runs":
        return evaluate_runs(Path(RUNS.value))
    return evaluate_reference(Path(REFERENCE.value))


if __name__ == "__main__":
    parallel.use_all_cpu_cores()
    cli.run(main)
