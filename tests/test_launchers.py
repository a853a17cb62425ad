"""The launchers' flags and exit status: what analyze.py's flags turn into (the analysis spec,
the layers, the source to analyse), which combinations are refused, ablate.py's status
when a run fails, what evaluate.py reports, and which suite benchmark.py runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beyondpar.base import locks
from helpers.launchers import launch_many

ROOT = Path(__file__).parents[1]


def probe_lines(done) -> list[str]:
    """The lines a probe printed (a script run in a process of its own, in the batch of
    `launched`, on the launch/ script and arguments it was given; absl's flags are global
    to a process, so each launcher is read in its own)."""
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


# Loads launch/analyze.py once and, for each command line, reports the source chosen and
# the MeasureSpec built from the flags, or the ValueError a flag rule raised. One process
# serves every command line: absl's flags are reset to their defaults between them.
_PROBE = """
import dataclasses, json, sys, runpy
from absl import flags
mod = runpy.run_path(sys.argv[1], run_name="analyze_flags")
for argv in json.loads(sys.argv[2]):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["analyze.py", *argv])
    try:
        out = {"what": mod["check_flag_rules"](), "spec": dataclasses.asdict(mod["spec"]())}
    except ValueError as err:
        out = {"error": str(err)}
    print(json.dumps(out))
for path in json.loads(sys.argv[3]):
    try:
        print(json.dumps({"text": mod["read_text_file"](path)}))
    except ValueError as err:
        print(json.dumps({"error": str(err)}))
"""

COMMAND_LINES = {
    "defaults": ["--attention=a.npz"],
    "walk_flags": [
        "--model=m",
        "--text=x",
        "--horizon=7",
        "--max_steps=9",
        "--residual=0.25",
        "--layers=0,5,11",
        "--sink_tokens=1",
        "--folds=3",
        "--nopairwise",
        "--optimal_weights",
        "--coalitions",
        "--exact_coalition_heads=6",
        "--permutations=12",
    ],
    "pruning_on_text": ["--model=m", "--text=x", "--pruning"],
    "batch_on_text_file": ["--model=m", "--text_file=t.txt", "--batch_size=4"],
    "attention_with_corpus": ["--attention=a.npz", "--corpus=c.txt"],
    "attention_with_text_file": ["--attention=a.npz", "--text_file=t.txt"],
    "corpus": ["--model=m", "--corpus=c.txt", "--tokens=64", "--pruning", "--max_windows=3"],
    "corpus_without_max_windows": ["--model=m", "--corpus=c.txt", "--tokens=64"],
}


def _text_files(folder: Path) -> list[Path]:
    """A UTF-8 text, a Latin-1 one and a missing one."""
    utf8 = folder / "utf8.txt"
    utf8.write_bytes("naïve café – 東京\n".encode())
    latin1 = folder / "latin1.txt"
    latin1.write_bytes("naïve café\n".encode("latin-1"))
    return [utf8, latin1, folder / "missing.txt"]


@pytest.fixture(scope="module")
def analyze(launched):
    """(the outcome of each of COMMAND_LINES, the outcome of reading each text file)."""
    names = list(COMMAND_LINES)
    lines = [json.loads(line) for line in probe_lines(launched["probe", "analyze"][0])]
    assert len(lines) == len(names) + 3
    return dict(zip(names, lines[: len(names)], strict=True)), lines[len(names) :]


def test_analyze_defaults_are_the_documented_spec(analyze):
    """Without walk flags, the spec is the documented one: horizon K=100, a 100-step cap,
    residual share 1/2, every layer, pairwise synergy on, no weight search, no sink
    tokens dropped, 2 folds, no coalitions (exact up to 10 heads, else 32 orders)."""
    outcome = analyze[0]["defaults"]
    assert outcome["what"] == "attention"
    assert outcome["spec"] == {
        "horizon": 100,
        "max_steps": 100,
        "eps": 0.25,
        "residual": 0.5,
        "layers": None,
        "pairwise": True,
        "optimal_weights": False,
        "sink_tokens": 0,
        "folds": 2,
        "coalitions": False,
        "exact_coalition_heads": 10,
        "permutations": 32,
        "coalition_seed": 0,
    }


def test_analyze_each_walk_flag_reaches_its_own_field(analyze):
    """Each flag sets its own field of the spec, with values chosen all different from the
    defaults and from one another so that a flag read into the wrong field shows; layers
    are numbered from 0 as typed."""
    outcome = analyze[0]["walk_flags"]
    assert outcome["what"] == "text"
    assert outcome["spec"] == {
        "horizon": 7,
        "max_steps": 9,
        "eps": 0.25,
        "residual": 0.25,
        "layers": [0, 5, 11],
        "pairwise": False,
        "optimal_weights": True,
        "sink_tokens": 1,
        "folds": 3,
        "coalitions": True,
        "exact_coalition_heads": 6,
        "permutations": 12,
        "coalition_seed": 0,  # no flag: the measurement's default
    }


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("pruning_on_text", "--pruning: for --corpus only, got --text"),
        ("batch_on_text_file", "--batch_size: for --corpus only, got --text_file"),
        ("attention_with_corpus", "--attention takes no text or corpus, got --corpus"),
        ("attention_with_text_file", "--attention takes no text or corpus, got --text_file"),
    ],
)
def test_analyze_refuses_flags_that_would_be_ignored(analyze, name, message):
    """A corpus-only flag beside a text, or a text or corpus beside --attention, would be
    silently ignored; each is refused, naming the flag and the source it came with."""
    assert analyze[0][name] == {"error": message}


def test_analyze_corpus_flags_are_accepted_with_a_corpus(analyze):
    """The corpus-only flags are accepted once the source is a corpus."""
    assert analyze[0]["corpus"]["what"] == "corpus"


def test_analyze_corpus_needs_only_tokens(analyze):
    assert analyze[0]["corpus_without_max_windows"]["what"] == "corpus"


# Runs launch/analyze.py's corpus analysis with the corpus and series runners replaced by
# stand-ins, for one model and for two, and prints what each runner was given.
_CORPUS_PROBE = """
import dataclasses, json, sys, runpy, types
from absl import flags
mod = runpy.run_path(sys.argv[1], run_name="analyze_corpus")
g = mod["analyse_corpus"].__globals__
calls = []
def run(model, corpus, cspec, spec, out, dtype, mesh=None):
    calls.append({"run": "corpus", "models": model, "cspec": dataclasses.asdict(cspec)})
    return {"summary": 1}, None
def run_corpus(models, corpus, cspec, spec, out, dtype, mesh=None):
    calls.append({"run": "series", "models": models, "cspec": dataclasses.asdict(cspec)})
    return None, out + "/series.jsonl"
g["corpus"] = types.SimpleNamespace(CorpusSpec=g["corpus"].CorpusSpec, run=run)
g["series"] = types.SimpleNamespace(expand=lambda m: m.split(","), run_corpus=run_corpus)
g["corpus_report"] = types.SimpleNamespace(write=lambda summary, out: [out + "/report.md"])
for model in ("m1", "m1,m2"):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["analyze.py", f"--model={model}", "--corpus=c.jsonl", "--tokens=64", "--out=o",
                 "--max_windows=3", "--batch_size=4", "--search_windows=5", "--pruning"])
    written = mod["analyse_corpus"]()
    calls[-1]["written"] = [str(p) for p in written]
print(json.dumps(calls))
"""


@pytest.fixture(scope="module")
def corpus_runs(launched):
    """What the runner was given for one model, then for two."""
    return json.loads(probe_lines(launched["probe", "corpus"][0])[-1])


def test_analyze_corpus_flags_reach_their_own_corpus_spec_fields(corpus_runs):
    for call in corpus_runs:
        assert call["cspec"] == {
            "tokens": 64,
            "max_windows": 3,
            "batch_size": 4,
            "pruning": True,
            "pruning_windows": 8,
            "pruning_points": 11,
            "search_windows": 5,
            "seed": 0,
            "coalition_windows": 8,
        }


def test_analyze_one_model_on_a_corpus_is_one_analysis_and_two_are_a_series(corpus_runs):
    one, two = corpus_runs
    assert (one["run"], one["models"], one["written"]) == ("corpus", "m1", ["o/report.md"])
    assert (two["run"], two["models"], two["written"]) == (
        "series",
        ["m1", "m2"],
        ["o/series.jsonl"],
    )


def test_analyze_text_file_is_read_as_utf8(analyze):
    """A --text_file is UTF-8: accents and CJK come back as written; a Latin-1 file (its
    'ï' is byte 0xEF, not valid UTF-8 there) and a missing file are errors naming them."""
    utf8, latin1, missing = analyze[1]
    assert utf8 == {"text": "naïve café – 東京\n"}
    assert (
        "must be UTF-8 text, got byte 0xef at offset 2 (invalid continuation byte)"
        in latin1["error"]
    )
    assert "latin1.txt" in latin1["error"]
    assert "--text_file" in latin1["error"]
    assert "missing.txt cannot be read" in missing["error"]


def test_ablate_exits_1_when_a_run_fails(launched):
    """A grid whose only run cannot be read (a torn config.json from an earlier, killed
    process) trains nothing, names the run once (its missing checkpoint is the same
    failure), counts it, and exits with status 1, so a script or CI job running the grid
    stops."""
    result, run = launched["ablate_failed"]
    assert result.returncode == 1, result.stderr[-2000:]
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    # the launcher's closing list: the run, once
    assert failed[-1].split(":")[0] == "FAILED heads-1_seed-0_task-copy"
    assert not any("@?" in line for line in failed)
    assert "config.json is not valid JSON" in failed[-1]
    assert "1 run(s) or checkpoint(s) failed; the report lists them" in result.stdout
    assert list((run / "checkpoints").iterdir()) == []  # nothing was trained


# Runs launch/evaluate.py's two entry points with the study modules replaced by stand-ins,
# and prints what each printed, returned and wrote.
_EVALUATE_PROBE = """
import json, sys, runpy, types
from pathlib import Path
from absl import flags
mod = runpy.run_path(sys.argv[1], run_name="evaluate_flags")
root = Path(sys.argv[2])
calls = []
fake_evaluate = types.SimpleNamespace(
    RECORDS_FILE="records.jsonl",
    evaluate_tree=lambda root, steps, coalitions=False: (["new"], [("run-b", "boom")]),
    read_records=lambda path, problems: [{"r": 1}, {"r": 2}, {"r": 3}],
    evaluate_reference_folder=lambda folder, spec=None: ([{"r": 1}], []),
    reference_files=lambda folder: [],
    EvalSpec=lambda **fields: fields,
)
def write_report(records, out, failures, runs_root=None):
    calls.append(str(out))
    return [out / "report.md"]
g = mod["evaluate_runs"].__globals__
g["evaluate"] = fake_evaluate
g["report"] = types.SimpleNamespace(write_report=write_report)
flags.FLAGS(["evaluate.py", f"--runs={root}"])
status = mod["evaluate_runs"](root)
flags.FLAGS.unparse_flags()
flags.FLAGS(["evaluate.py", f"--reference={root}", f"--out={root / 'ref'}"])
ref_status = mod["evaluate_reference"](root)
flags.FLAGS.unparse_flags()
flags.FLAGS(["evaluate.py", f"--runs={root}", f"--out={root / 'elsewhere'}"])
mod["evaluate_runs"](root)
fake_evaluate.evaluate_reference_folder = lambda folder, spec=None: (
    [{"r": 1}], [("ref-x", "bad")])
flags.FLAGS.unparse_flags()
flags.FLAGS(["evaluate.py", f"--reference={root}", f"--out={root / 'ref-failed'}"])
failed_status = mod["evaluate_reference"](root)
fake_evaluate.evaluate_tree = lambda root, steps, coalitions=False: ([], [])
flags.FLAGS.unparse_flags()
flags.FLAGS(["evaluate.py", f"--runs={root}", f"--out={root / 'rerun'}"])
rerun_status = mod["evaluate_runs"](root)
print(json.dumps({"status": status, "ref_status": ref_status, "failed_status": failed_status,
                  "rerun_status": rerun_status, "reports": calls}))
"""


@pytest.fixture(scope="module")
def evaluated(launched):
    """(the runs folder, what the entry points printed, what they returned and wrote)."""
    done, root = launched["probe", "evaluate"]
    lines = probe_lines(done)
    return root, lines[:-1], json.loads(lines[-1])


def test_evaluate_runs_counts_skips_reports_under_the_runs_and_exits_1_on_failure(evaluated):
    """One new checkpoint among three records: two were already recorded; the report goes
    to <runs>/report; a failed checkpoint is named and the status is 1."""
    root, printed, outcome = evaluated
    assert printed[0] == (
        "evaluated 1 checkpoint(s), skipped 2 already recorded, failed 1; "
        f"3 record(s) in {root / 'records.jsonl'}"
    )
    assert "FAILED run-b: boom" in printed
    assert outcome["status"] == 1
    assert outcome["reports"][0] == str(root / "report")


def test_evaluate_reference_writes_its_records_beside_the_report(evaluated):
    root, printed, outcome = evaluated
    records = root / "ref" / "records.jsonl"
    assert outcome["ref_status"] == 0
    assert outcome["reports"][1] == str(root / "ref")
    assert [json.loads(line) for line in records.read_text().splitlines()] == [{"r": 1}]
    assert f"wrote {records}" in printed


def test_evaluate_runs_writes_the_report_under_out_when_given(evaluated):
    root, _, outcome = evaluated
    assert outcome["reports"][2] == str(root / "elsewhere")


def test_evaluate_reference_exits_1_when_a_checkpoint_fails(evaluated):
    root, printed, outcome = evaluated
    assert outcome["failed_status"] == 1
    assert outcome["reports"][3] == str(root / "ref-failed")
    assert "FAILED ref-x: bad" in printed


def test_evaluate_runs_rewrites_the_report_when_every_checkpoint_is_already_recorded(evaluated):
    root, printed, outcome = evaluated
    assert printed[-2] == (
        "evaluated 0 checkpoint(s), skipped 3 already recorded, failed 0; "
        f"3 record(s) in {root / 'records.jsonl'}"
    )
    assert outcome["rerun_status"] == 0
    assert outcome["reports"][4] == str(root / "rerun")
    assert printed[-1] == f"wrote {root / 'rerun' / 'report.md'}"


# Runs launch/benchmark.py's main with stand-in suites and prints, for each command line,
# the keyword arguments the suite was called with or the ValueError main raised.
_BENCHMARK_PROBE = """
import json, sys, runpy, types
from absl import flags
mod = runpy.run_path(sys.argv[1], run_name="benchmark_flags")
calls = []
suites = {"metrics": lambda **kw: calls.append(["metrics", kw]),
          "train": lambda **kw: calls.append(["train", kw])}
mod["main"].__globals__["benchmarks"] = types.SimpleNamespace(SUITES=suites)
for argv in json.loads(sys.argv[2]):
    flags.FLAGS.unparse_flags()
    try:
        mod["main"](flags.FLAGS(["benchmark.py", *argv]))
        print(json.dumps(calls.pop()))
    except (ValueError, flags.Error) as err:
        print(json.dumps({"error": str(err)}))
"""


BENCHMARK_LINES = [["metrics"], ["--repeats=3", "train"], ["metrics", "train"], [], ["x"]]
BENCHMARK_LINES.append(["--repeats=0", "train"])


def test_benchmark_runs_exactly_one_named_suite_with_the_repeats_given(launched):
    printed = probe_lines(launched["probe", "benchmark"][0])
    outcomes = [json.loads(line) for line in printed]
    refused = "benchmark.py takes one suite, one of ['metrics', 'train'], got "
    assert outcomes == [
        ["metrics", {}],
        ["train", {"repeats": 3}],
        {"error": refused + "['metrics', 'train']"},
        {"error": refused + "[]"},
        {"error": refused + "['x']"},
        {"error": "flag --repeats=0: 0 is not a positive integer"},
    ]


def test_analyze_one_model_on_a_text_writes_a_text_report_not_a_series(launched):
    """A single --model is one analysis (analysis.json and report.md), not a series of one."""
    done, out = launched["text_report"]
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "analysis.json").exists() and (out / "report.md").exists()
    assert not (out / "series.jsonl").exists()


# Runs launch/ablate.py's main with --dry_run, the grid's runner replaced by a stand-in
# that records being called, and prints what main printed and returned.
_ABLATE_DRY_RUN_PROBE = """
import json, sys, runpy, types
from absl import flags
mod = runpy.run_path(sys.argv[1], run_name="ablate_flags")
g = mod["main"].__globals__
runs = []
def run(config, workdir):
    runs.append(str(workdir))
    return [], []
g["ablation"] = types.SimpleNamespace(dry_run=g["ablation"].dry_run, run=run)
flags.FLAGS(["ablate.py", "--config=configs/ablation.py:base=smoke", "--workdir=W", "--dry_run"])
status = mod["main"]([])
print(json.dumps({"status": status, "runs": runs}))
"""


def test_ablate_dry_run_prints_one_train_command_per_run_and_trains_nothing(launched):
    *commands, outcome = probe_lines(launched["probe", "ablate_dry_run"][0])
    assert json.loads(outcome) == {"status": 0, "runs": []}
    assert len(commands) == 8  # heads 1, 4, 8, 16 x tasks copy, cycle
    assert commands[0] == (
        "python launch/train.py --config=configs/smoke.py --config.model.num_heads=1 "
        "--config.seed=0 --config.task.name=copy --workdir=W/heads-1_seed-0_task-copy"
    )
    assert all(c.startswith("python launch/train.py --config=configs/smoke.py") for c in commands)


EXTRA_WORDS = [
    ("analyze.py", ["--model=tests/data/hf/gpt2-tiny", "--text", "hello", "--out={out}"]),
    ("train.py", ["--config=configs/smoke.py", "--workdir={out}"]),
    ("ablate.py", ["--config=configs/ablation.py:base=smoke", "--workdir={out}"]),
    ("evaluate.py", ["--runs={out}"]),
    ("example2.py", ["--out={out}"]),
]
FOLDER_IS_A_FILE = [
    ("train.py", ["--config=configs/smoke.py", "--workdir={file}"]),
    ("ablate.py", ["--config=configs/ablation.py:base=smoke", "--workdir={file}"]),
    ("example2.py", ["--out={file}"]),
]


def _probe_cases(tmp_path_factory, add) -> None:
    """Each probe above as a script of its own, on its launcher and arguments (a script
    given by its absolute path, which `launch_many` takes as it is)."""
    folder = tmp_path_factory.mktemp("probes")
    texts = _text_files(tmp_path_factory.mktemp("texts"))
    root = tmp_path_factory.mktemp("runs")
    probes = {
        "analyze": (_PROBE, "analyze.py", [COMMAND_LINES[n] for n in COMMAND_LINES], texts),
        "corpus": (_CORPUS_PROBE, "analyze.py"),
        "evaluate": (_EVALUATE_PROBE, "evaluate.py", root),
        "benchmark": (_BENCHMARK_PROBE, "benchmark.py", BENCHMARK_LINES),
        "ablate_dry_run": (_ABLATE_DRY_RUN_PROBE, "ablate.py"),
    }
    for name, (probe, launcher, *args) in probes.items():
        script = folder / f"{name}.py"
        script.write_text(probe)
        words = [str(a) if isinstance(a, Path) else json.dumps(a, default=str) for a in args]
        add(("probe", name), root, str(script), [str(ROOT / "launch" / launcher), *words])


def _refused_cases(tmp_path_factory, add) -> None:
    """Each command line above, with the folder or file it names."""
    for i, (launcher, flags) in enumerate(EXTRA_WORDS):
        out = tmp_path_factory.mktemp("words") / "out"
        add(("words", i), out, launcher, [f.format(out=out) for f in flags] + ["there", "friend"])
    for i, (launcher, flags) in enumerate(FOLDER_IS_A_FILE):
        file = tmp_path_factory.mktemp("file") / "file"
        file.write_text("keep")
        add(("file", i), file, launcher, [f.format(file=file) for f in flags])


def _failing_cases(tmp_path_factory, add) -> Path:
    """An ablation grid whose only run has a torn config.json, one analysis of a text,
    an evaluation into a folder this process holds (returned) and one of a reference
    folder that does not exist."""
    grid = tmp_path_factory.mktemp("grid")
    run = grid / "heads-1_seed-0_task-copy"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text('{"model": ')
    ablate = ["--config=configs/ablation.py:base=smoke", "--config.levels.heads=(1,)"]
    ablate += ["--config.levels.task=('copy',)", f"--workdir={grid}"]
    add("ablate_failed", run, "ablate.py", ablate)
    text = ["--text=The cat sat on the mat", "--nopairwise", "--horizon=5", "--max_steps=5"]
    text.append("--layers=0")  # one layer: what is written does not depend on how many
    out = tmp_path_factory.mktemp("text") / "out"
    model = f"--model={ROOT / 'tests' / 'data' / 'hf' / 'llama-tiny'}"
    add("text_report", out, "analyze.py", [*text, f"--out={out}", model])
    reference = tmp_path_factory.mktemp("busy") / "reference"
    reference.mkdir()
    (reference / "1_heads_copy.npz").write_bytes(b"not a checkpoint")
    busy = reference.parent / "out"
    add("busy", busy, "evaluate.py", [f"--reference={reference}", f"--out={busy}"])
    missing = tmp_path_factory.mktemp("missing")
    nope, out = missing / "nope", missing / "out"
    add("missing", (nope, out), "evaluate.py", [f"--reference={nope}", f"--out={out}"])
    return busy


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """What each command line of this file that runs a launcher gave, keyed by case, with
    the folder or file it named; all of them run from one batch (`launch_many`), while
    this process holds the "busy" case's --out folder."""
    named, cases = {}, []

    def add(key, what, launcher, flags):
        named[key] = what
        cases.append((launcher, flags))

    _probe_cases(tmp_path_factory, add)
    _refused_cases(tmp_path_factory, add)
    busy = _failing_cases(tmp_path_factory, add)
    with locks.lock(busy):
        done = launch_many(cases)
    return dict(zip(named, zip(done, named.values(), strict=True), strict=True))


@pytest.mark.parametrize("case", range(len(EXTRA_WORDS)))
def test_launchers_refuse_words_that_are_not_flags(launched, case):
    """An unquoted flag value with spaces leaves words that are not flags: the launcher
    stops before doing anything, naming them, instead of running on the first word."""
    done, out = launched["words", case]
    launcher = EXTRA_WORDS[case][0]
    assert done.returncode == 2, done.stderr[-2000:]
    extra = "['there', 'friend']"
    assert done.stderr == f"error: {launcher} takes only flags, got extra arguments {extra}\n"
    assert not out.exists()


@pytest.mark.parametrize("case", range(len(FOLDER_IS_A_FILE)))
def test_launchers_name_a_folder_flag_that_is_a_file(launched, case):
    """A workdir or report folder that is an existing file is a usage error naming the
    flag, not a traceback."""
    done, file = launched["file", case]
    assert done.returncode == 2, done.stderr[-2000:]
    flag = FOLDER_IS_A_FILE[case][1][-1].split("=")[0]
    assert done.stderr == f"error: {flag} must be a folder, got '{file}', which is a file\n"
    assert file.read_text() == "keep"


def test_evaluate_reference_stops_at_once_when_another_process_holds_its_out_folder(launched):
    """Two reference evaluations into one --out would each write records.jsonl whole and
    lose the other's: the second stops before evaluating, naming the folder."""
    done, out = launched["busy"]
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(f"error: workdir {out} is in use by another process (pid ")
    assert done.stdout == ""
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_evaluate_reference_that_is_missing_makes_no_out_folder(launched):
    """A --reference folder that does not exist is refused before --out is made or locked."""
    done, (nope, out) = launched["missing"]
    assert done.returncode == 2, done.stderr[-2000:]
    message = f"error: reference folder must be an existing folder, got '{nope}'\n"
    assert (done.stderr, done.stdout) == (message, "")
    assert not out.exists()
