"""Language-model training over two processes (`jax.distributed` on localhost, one CPU
device each): the parameters, held-out loss and logs of one process with the same global
batch, each process reading its own half of every batch, and process 0 alone writing
the run's files. One module-scoped run of about 25 s of CPU time, so every test here is
marked slow, as the task study's two-process test is."""

import json
import types
from pathlib import Path

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from beyondpar import checkpoints
from beyondpar.lm import data as data_lib
from beyondpar.study import runs, text_graphs
from helpers import distributed_worker, lm_corpus
from helpers.lm_training import two_process_config

STEPS, BATCH = 4, 8
HALF = BATCH // 2  # rows per process
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The two-process run (`two`; `seen`: what each process loaded and wrote; `outs`:
    what each printed) and the one-process run (`one`: this process, four devices),
    which trains while they do."""
    root = tmp_path_factory.mktemp("lm_processes")
    corpus = lm_corpus.write_folder(root / "corpus", lm_corpus.documents())
    procs = distributed_worker.start(root / "two", "text", corpus, root)
    try:
        # The reference's parameters, losses and held-out loss are compared; its graph
        # measures are not (the two processes' own are checked below): left out here.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(text_graphs, "graph_measures", lambda *args: {})
            runs.train_and_evaluate(two_process_config(corpus), str(root / "one"))
    finally:
        outs = distributed_worker.finish(procs)
    seen = [json.loads((root / f"record-{i}.json").read_text()) for i in (0, 1)]
    return types.SimpleNamespace(
        two=root / "two", one=root / "one", corpus=corpus, seen=seen, outs=outs
    )


def metrics(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_lm_train_two_processes_end_with_one_processs_parameters(run):
    two, one = run.two, run.one
    step2, state2 = checkpoints.load(two / "checkpoints")
    step1, state1 = checkpoints.load(one / "checkpoints")
    assert step1 == step2 == STEPS
    leaves = jax.tree_util.tree_leaves_with_path(state2["params"])
    for (path, a), b in zip(leaves, jax.tree.leaves(state1["params"]), strict=True):
        if "'key']['bias'" in jax.tree_util.keystr(path):
            # True gradient zero (softmax ignores a shift shared by all keys): AdamW steps
            # the sign of rounding noise, bounded by the summed learning rates.
            assert np.abs(a).max() < 0.03 and np.abs(b).max() < 0.03
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=str(path))


def test_lm_train_two_processes_log_one_processs_losses(run):
    two, one = run.two, run.one
    lines2, lines1 = metrics(two), metrics(one)
    assert [r["step"] for r in lines2] == [r["step"] for r in lines1] == [2, 4]
    for name in ("train/loss", "train/grad_norm", "eval/loss", "eval/bits_per_byte"):
        got, want = [r[name] for r in lines2 if name in r], [r[name] for r in lines1 if name in r]
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)
    assert "eval/loss" in lines2[-1] and lines2[-1]["layer1/sink_mass"] > 0


def test_lm_train_each_process_loads_its_half_of_every_global_batch(run):
    config = two_process_config(run.corpus)
    text = data_lib.load(config.data, config.seed, cache_dir=str(run.one))
    order = text.order(BATCH, config.seq_len)
    loaded = [s["windows"] for s in run.seen]
    assert [[r["step"] for r in rows] for rows in loaded] == [list(range(STEPS))] * 2
    for step in range(STEPS):
        rows = [loaded[p][step] for p in (0, 1)]
        assert [(r["process_index"], r["process_count"]) for r in rows] == [(0, 2), (1, 2)]
        first, second = (np.asarray(r["windows"]) for r in rows)
        whole = order[step]
        np.testing.assert_array_equal(first, whole[:HALF])
        np.testing.assert_array_equal(second, whole[HALF:])
        assert len(set(whole)) == BATCH and not set(first) & set(second)


def test_lm_train_only_process_0_writes_the_runs_files(run):
    """Process 0 writes every metrics line and TensorBoard scalar, once; process 1 none
    (both take part in the checkpoints, which read back above)."""
    two, seen = run.two, run.seen
    assert [s["metrics"] for s in seen] == [[2, 4], []]
    assert sorted(set(seen[0]["events"])) == [2, 4] and seen[1]["events"] == []
    assert len(list(two.glob("events.out.tfevents.*"))) == 1
    acc = event_accumulator.EventAccumulator(str(two))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [2, 4]
    assert [e.step for e in acc.Scalars("eval/loss")] == [4]
    assert checkpoints.list_steps(two / "checkpoints") == [2, 4]
    assert "trained a cpu language model" in run.outs[0]
    assert "trained a" not in run.outs[1]
