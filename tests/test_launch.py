"""Every launcher's flag rules: a mistake is one line on stderr naming the flag, what it
must be and what it got, with exit status 2, and nothing is written."""

import json

import numpy as np
import pytest

from helpers.launchers import launch_many
from helpers.paths import DATA

HF = DATA / "hf"
TEXT = DATA / "text" / "declaration.txt"


ANALYZE_MISTAKES = [
    ([f"--model={HF / 'llama-tiny'}", f"--corpus={TEXT}"], "--corpus needs --tokens=T"),
    (
        [f"--model={HF / 'llama-tiny'}", "--text=hi", f"--corpus={TEXT}", "--tokens=8"],
        "give exactly one of --text or --text_file or --corpus, got --text, --corpus",
    ),
    (
        [f"--model={HF / 'llama-tiny'}", "--text=hi", "--max_windows=3"],
        "--max_windows: for --corpus only",
    ),
    (
        [f"--model={HF / 'llama-tiny'}", "--text=hi", "--search_windows=3"],
        "--search_windows: for --corpus only",
    ),
    (["--text=hi"], "give exactly one of --model or --attention, got none"),
    (
        [f"--model={HF / 'llama-tiny'}", "--text=hi", "--layers=0,one"],
        "--layers must be layer numbers",
    ),
    (["--tokens=many"], "flag --tokens=many: invalid literal"),
]
MISTAKES = [
    ("train.py", [], "Flag --config must have a value"),
    (
        "train.py",
        ["--config=configs/smoke.py", "--config.optim.lr=1", "--workdir=W"],
        "error: --config.optim.lr must name fields of the config, got no field 'lr'\n",
    ),
    (
        "train.py",
        ["--config=configs/smoke.py", "--config.optim.learnin_rate=1", "--workdir=W"],
        "error: --config.optim.learnin_rate must name fields of the config, got no field "
        '\'learnin_rate\'; Did you mean "learning_rate" instead of "learnin_rate"?\n',
    ),
    ("train.py", ["--config=configs/nope.py", "--workdir=W"], "No such file or directory"),
    (
        "ablate.py",
        ["--config=configs/ablation.py:tasks=all", "--workdir=W"],
        "tasks must be one of ['attention', 'demo', 'paper'], got 'all'",
    ),
    ("evaluate.py", [], "give exactly one of --runs or --reference, got none"),
    ("benchmark.py", ["fastest"], "takes one suite, one of ['metrics', 'train'"),
]


# The modules whose import must not load scipy.stats, and the script that imports those
# it is given and prints the scipy.stats modules then loaded.
STARTING = [
    "beyondpar.analysis.corpus_report",
    "beyondpar.measure",
    "beyondpar.analysis.series",
    "beyondpar.analysis.text_report",
    "beyondpar.analysis.corpus",
    "beyondpar.analysis.windowing",
    "beyondpar.analysis.text",
    "beyondpar.benchmarks",
    "beyondpar.study.ablation",
    "beyondpar.study.evaluate",
    "beyondpar.study.report",
    "beyondpar.study.train",
    "beyondpar.study.worked_example",
]
SCIPY_PROBE = """import importlib, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
print(sorted(m for m in sys.modules if m.startswith("scipy.stats")))
"""

FOLDS_FLAGS = ["--optimal_weights", "--folds=1", "--nopairwise", "--horizon=10", "--max_steps=10"]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """What each mistake above gave, keyed by (analyze or launcher, case number), with the
    folder it was told to write; all command lines run from one batch (`launch_many`),
    and with them ("folds", 0): an analysis of two sequences in one fold, and ("scipy",
    0): the `SCIPY_PROBE` script, which imports the `STARTING` modules."""
    folds = tmp_path_factory.mktemp("folds")
    probe = tmp_path_factory.mktemp("probe") / "scipy_probe.py"
    probe.write_text(SCIPY_PROBE)
    attention = np.load(HF / "llama-tiny" / "expected.npz")["attention"][:, :1, :, :8, :8]
    np.savez(folds / "attn.npz", attention=attention / attention.sum(-1, keepdims=True))
    folders = {("folds", 0): folds / "out"}
    cases = [
        (
            "analyze.py",
            [f"--attention={folds / 'attn.npz'}", *FOLDS_FLAGS, f"--out={folds / 'out'}"],
        )
    ]
    for i, (flags, _) in enumerate(ANALYZE_MISTAKES):
        folders["analyze", i] = out = tmp_path_factory.mktemp("analyze") / "out"
        cases.append(("analyze.py", [*flags, f"--out={out}"]))
    for i, (script, flags, _) in enumerate(MISTAKES):
        folders["launcher", i] = out = tmp_path_factory.mktemp("launcher") / "w"
        cases.append((script, [f.replace("=W", f"={out}") for f in flags]))
    folders["scipy", 0] = probe.parent
    cases.append((str(probe), STARTING))
    return dict(zip(folders, zip(launch_many(cases), folders.values(), strict=True), strict=True))


@pytest.mark.parametrize("case", range(len(ANALYZE_MISTAKES)))
def test_analyze_flag_rules_are_one_line(refused, case):
    done, out = refused["analyze", case]
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert ANALYZE_MISTAKES[case][1] in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("case", range(len(MISTAKES)))
def test_every_launchers_mistakes_are_one_line(refused, case):
    done, out = refused["launcher", case]
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert MISTAKES[case][2] in done.stderr
    assert not out.exists()


def test_analyze_folds_flag_reaches_the_cross_fitted_optimum(refused):
    """Two sequences in one fold: the optimum is searched on both, in sample."""
    done, out = refused["folds", 0]
    assert done.returncode == 0, done.stderr[-2000:]
    optimal = json.loads((out / "analysis.json").read_text())["layers"]["0"]["optimal"]
    assert optimal["held_out"] is False and optimal["search_sets"] == [[0, 1]]


def test_launchers_start_without_scipy_stats(refused):
    """scipy.stats takes most of a second to import, and every command of every launcher
    pays its start: it is imported when an interval or a rank correlation is computed.
    (The probe runs in a child of the batch, which has loaded the launchers' own imports
    before forking: one of them that loaded scipy.stats would show here too.)"""
    done, _ = refused["scipy", 0]
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
