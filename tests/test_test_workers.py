"""The test workers' own upkeep: compiled programs released before the kernel's map
limit is reached (a worker that passed it died inside XLA's compiler), test files
started longest first, and workers that end without finalisation."""

import gc
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from helpers import memory_maps as memory_maps_module
from helpers import worker_exit
from helpers.file_order import LONG_FILES, file_of, longest_first, missing_files
from helpers.memory_maps import (
    YOUNG_COLLECTION_ALLOCATIONS,
    collect_garbage_less_often,
    memory_maps,
    release_compiled_programs,
)
from helpers.worker_exit import end_worker_now, is_worker

ROOT = Path(__file__).resolve().parents[1]


def _compile(count: int) -> list:
    programs = [jax.jit(lambda x, i=i: x * i + 1.0) for i in range(count)]
    for program in programs:
        program(jnp.ones(3)).block_until_ready()
    return programs


def _maps_in_smaps() -> int:
    """The same count from another file: one header line (an address range) per map."""
    with open("/proc/self/smaps") as smaps:
        return sum(1 for line in smaps if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line))


def test_memory_maps_are_counted_one_per_map():
    held, _ = memory_maps()
    assert abs(held - _maps_in_smaps()) <= 8  # maps made or dropped between the two reads


def test_compiled_programs_hold_memory_maps_until_released():
    held, limit = memory_maps()
    assert 0 < held < limit // 2  # this worker is within its budget
    programs = _compile(100)  # kept alive: only the release drops their executables
    grown, _ = memory_maps()
    assert held + 100 <= grown <= held + 100 * 8  # one to a few maps per program's code
    assert not release_compiled_programs(lambda: (grown, 2 * grown))  # at half: kept
    assert memory_maps()[0] >= grown
    assert release_compiled_programs(lambda: (grown, 2 * grown - 2))  # over half
    assert memory_maps()[0] < held + (grown - held) // 4  # most of them unmapped
    assert [float(p(jnp.ones(1))[0]) for p in programs[:3]] == [1.0, 2.0, 3.0]


class _Collected:
    def __init__(self, nodeid):
        self.nodeid = nodeid


def test_long_files_start_first_and_the_rest_keep_their_collection_order():
    names = ["a.py::t1", "b.py::t1", "c.py::t1", "a.py::t2", "d.py::t1", "c.py::t2"]
    items = [_Collected(name) for name in names]
    longest_first(items, {"c.py": 9.0, "d.py": 30.0})
    assert [item.nodeid for item in items] == [
        "d.py::t1",
        "c.py::t1",
        "c.py::t2",
        "a.py::t1",
        "b.py::t1",
        "a.py::t2",
    ]


def test_the_suite_collects_its_long_files_longest_first_and_names_only_files_it_has(request):
    assert missing_files(ROOT) == []
    assert missing_files(ROOT, {"tests/no_such_file.py": 1.0}) == ["tests/no_such_file.py"]
    # The seconds of the files this run collected, in the order it collected them.
    collected = [LONG_FILES.get(file_of(item), 0.0) for item in request.session.items]
    assert collected == sorted(collected, reverse=True)


def test_young_collections_wait_for_many_allocations():
    """25,000 allocations, half the documented 50,000, start no collection."""
    started = []
    gc.collect()  # the young generation's count starts at 0
    gc.callbacks.append(lambda phase, info: phase == "start" and started.append(info))
    try:
        kept = [[i] for i in range(25_000)]
    finally:
        gc.callbacks.pop()
    assert len(kept) == 25_000 == YOUNG_COLLECTION_ALLOCATIONS // 2
    assert started == []  # CPython's default (700 allocations) collects 35 times here


def test_only_the_young_generations_threshold_changes():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 3, 4)
        collect_garbage_less_often()
        assert gc.get_threshold() == (YOUNG_COLLECTION_ALLOCATIONS, 3, 4)
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize("error", [FileNotFoundError, PermissionError])
def test_without_proc_no_maps_are_counted_and_nothing_is_released(monkeypatch, error):
    def unreadable(*args, **kwargs):
        raise error("/proc/self/maps")

    monkeypatch.setattr(memory_maps_module, "open", unreadable, raising=False)
    assert memory_maps() == (0, 1)
    assert not release_compiled_programs()


def _suite_conftest(request):
    """The suite's own conftest module, as pytest loaded it."""
    plugins = request.config.pluginmanager.get_plugins()
    return next(
        p for p in plugins if str(getattr(p, "__file__", "")) == str(ROOT / "tests" / "conftest.py")
    )


class _Unmarked(_Collected):
    def get_closest_marker(self, name):
        return None


def test_the_suites_collection_puts_long_files_first(request):
    items = [_Unmarked("tests/test_norm.py::t"), _Unmarked("tests/test_metrics.py::t")]
    _suite_conftest(request).pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == ["tests/test_metrics.py::t", "tests/test_norm.py::t"]


def test_each_test_file_ends_by_releasing_programs_over_the_map_budget(request, monkeypatch):
    conftest = _suite_conftest(request)
    assert "_release_compiled_programs" in request.fixturenames  # autouse
    definitions = request._fixturemanager.getfixturedefs("_release_compiled_programs", request.node)
    assert definitions[-1].scope == "module"  # once a file, not once a run
    checked = []
    monkeypatch.setattr(conftest, "release_compiled_programs", lambda: checked.append(1))
    after_each_file = conftest._release_compiled_programs._get_wrapped_function()()
    next(after_each_file)
    assert checked == []  # nothing before the file's tests
    with pytest.raises(StopIteration):
        next(after_each_file)
    assert checked == [1]


class _Config:
    """A pytest config: a worker's has `workerinput`."""

    def __init__(self, worker: bool):
        if worker:
            self.workerinput = {"workerid": "gw0"}


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def flush(self):
        self.log.append(self.name)


def test_a_worker_flushes_what_it_printed_before_it_ends(monkeypatch):
    log = []
    monkeypatch.setattr(sys, "stdout", _Stream("stdout", log))
    monkeypatch.setattr(sys, "stderr", _Stream("stderr", log))
    end_worker_now(_Config(worker=True), end=lambda status: log.append(status))
    assert sorted(log[:2]) == ["stderr", "stdout"] and log[2:] == [0]


def test_only_a_worker_ends_at_once_and_with_status_0():
    ended = []
    end_worker_now(_Config(worker=False), end=ended.append)
    assert ended == [] and not is_worker(_Config(worker=False))
    end_worker_now(_Config(worker=True), end=ended.append)
    assert ended == [0] and is_worker(_Config(worker=True))


def test_the_suites_workers_end_after_pytests_own_last_hooks(request, monkeypatch):
    plugin = request.config.pluginmanager.get_plugin("helpers.worker_exit")
    assert plugin is worker_exit
    hook = worker_exit.pytest_unconfigure
    assert hook.pytest_impl["trylast"]  # pytest's own hooks (reports, logs) come first
    seen = []
    monkeypatch.setattr(worker_exit, "end_worker_now", seen.append)
    config = _Config(worker=True)
    hook(config)
    assert seen == [config]


_TWO_RESULTS = """
import atexit
from pathlib import Path


def test_passes():
    print("printed by a worker")
    atexit.register(Path(__file__).with_suffix(".finalised").touch)


def test_fails():
    assert 1 == 2
"""


def test_workers_that_end_at_once_lose_no_result(tmp_path):
    """Two workers ending as the suite's do (its plugin): the controller still reports
    both results, the failure's output, and fails."""
    (tmp_path / "test_one.py").write_text(_TWO_RESULTS)
    (tmp_path / "test_two.py").write_text(_TWO_RESULTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "helpers.worker_exit"]
        + ["-p", "no:cacheprovider", "-rA", "."],
        cwd=tmp_path,
        env={
            "PYTHONPATH": str(ROOT / "tests"),
            "PATH": "/usr/bin:/bin",
            **{k: v for k, v in os.environ.items() if k.startswith("PYTHON") and "PATH" not in k},
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    # A worker that ended before its results were sent is restarted as crashed.
    assert "node down" not in done.stdout
    assert "2 failed, 2 passed" in done.stdout
    assert done.stdout.count("assert 1 == 2") >= 2
    assert done.stdout.count("printed by a worker") == 2
    assert sorted(tmp_path.glob("*.finalised")) == []  # no worker ran its atexit handlers
