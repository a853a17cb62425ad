"""The end of a test process: a pytest-xdist worker stops at its last hook, skipping
Python's finalisation. Its results are with the controller by then (sent when its session
finished), and finalising a process that holds thousands of compiled programs, freeing
each one's code, buffers and MLIR context, kept the controller waiting for seconds.
Skipped with it: atexit handlers, pytest's config cleanups and any thread a test left
running. A plugin: the suite's conftest loads it, and `-p helpers.worker_exit` elsewhere."""

import os
import sys

import pytest


def is_worker(config) -> bool:
    """Whether `config` is a pytest-xdist worker's (the controller and `-n 0` runs are not)."""
    return hasattr(config, "workerinput")


def end_worker_now(config, end=os._exit) -> None:
    """In a worker, flush what it printed and end the process (status 0: the controller
    counts the results it was sent); elsewhere, return."""
    if not is_worker(config):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    end(0)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """A worker ends after pytest's own last hooks (reports, logs), without finalisation."""
    end_worker_now(config)
