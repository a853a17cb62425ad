"""Every launcher's flag rules: a mistake is one line on stderr naming the flag, what it
must be and what it got, with exit status 2, and nothing is written."""

import subprocess
import sys

import pytest

from conftest import DATA, ROOT

HF = DATA / "hf"
TEXT = DATA / "text" / "declaration.txt"


def launch(script: str, *flags: str, cwd=ROOT):
    return subprocess.run(
        [sys.executable, str(ROOT / "launch" / script), *flags],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        ([f"--model={HF / 'llama-tiny'}", f"--corpus={TEXT}"], "--corpus needs --tokens=T"),
        (
            [f"--model={HF / 'llama-tiny'}", "--text=hi", f"--corpus={TEXT}", "--tokens=8"],
            "give exactly one of --text or --text_file or --corpus, got --text, --corpus",
        ),
        (
            [f"--model={HF / 'llama-tiny'}", "--text=hi", "--max_windows=3"],
            "--max_windows: for --corpus only",
        ),
        (["--text=hi"], "give exactly one of --model or --attention, got none"),
        (
            [f"--model={HF / 'llama-tiny'}", "--text=hi", "--layers=0,one"],
            "--layers must be layer numbers",
        ),
        (["--tokens=many"], "flag --tokens=many: invalid literal"),
    ],
)
def test_analyze_flag_rules_are_one_line(tmp_path, flags, message):
    done = launch("analyze.py", *flags, f"--out={tmp_path / 'out'}")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert message in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "script, flags, message",
    [
        ("train.py", [], "Flag --config must have a value"),
        (
            "train.py",
            ["--config=configs/smoke.py", "--config.optim.lr=1", "--workdir=W"],
            "--config.optim.lr must name fields of the config, got no field 'lr'",
        ),
        ("train.py", ["--config=configs/nope.py", "--workdir=W"], "No such file or directory"),
        (
            "ablate.py",
            ["--config=configs/ablation.py:tasks=all", "--workdir=W"],
            "tasks must be one of ['attention', 'demo', 'paper'], got 'all'",
        ),
        ("evaluate.py", [], "give exactly one of --runs or --reference, got none"),
        ("benchmark.py", ["fastest"], "takes one suite, one of ['metrics', 'train'"),
    ],
)
def test_every_launchers_mistakes_are_one_line(tmp_path, script, flags, message):
    flags = [f.replace("=W", f"={tmp_path / 'w'}") for f in flags]
    done = launch(script, *flags)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert message in done.stderr
    assert not (tmp_path / "w").exists()
