"""The language-model suite's arithmetic: ratios from milliseconds, goals beside them,
its model the cpu size of configs/lm.py, and a run of the suite on fixed timings."""

import json

import numpy as np
import pytest

from beyondpar import benchmarks
from beyondpar.base import parallel
from beyondpar.benchmarks import lm as lm_bench
from beyondpar.benchmarks import train as train_bench
from beyondpar.lm import data as data_lib
from configs import lm as lm_config
from helpers import lm_corpus


def test_ratios_from_milliseconds():
    found = lm_bench.ratios({"jax": 10.0, "torch": 25.0, "floor": 4.0}, 4096, 8.192e6)
    assert found["tokens_per_s"] == pytest.approx(409_600)
    assert found["x_torch"] == pytest.approx(2.5)
    assert found["x_floor"] == pytest.approx(2.5)
    assert found["loader_x"] == pytest.approx(20.0)
    assert "x_torch" not in lm_bench.ratios({"jax": 10.0, "floor": 4.0}, 4096)


@pytest.mark.parametrize(
    ("found", "met"),
    [
        ({"x_torch": 2.0, "x_floor": 2.0, "loader_x": 10.0}, dict.fromkeys(lm_bench.GOALS, True)),
        (
            {"x_torch": 1.99, "x_floor": 2.01, "loader_x": 9.9},
            dict.fromkeys(lm_bench.GOALS, False),
        ),
        ({"x_floor": 1.5}, {"x_floor": True}),
    ],
)
def test_goals_at_their_bounds(found, met):
    assert lm_bench.goals_met(found) == met


def test_machine_rates_keep_the_best_of_each_measurement(monkeypatch):
    monkeypatch.setattr(lm_bench, "matmul_flops_per_s", lambda repeats: 1e11)
    monkeypatch.setattr(lm_bench, "copy_bytes_per_s", lambda repeats: 1e10)
    monkeypatch.setattr(lm_bench, "exp_per_s", lambda repeats: 1e9)
    assert lm_bench.machine_rates(1, (2e11, 5e9, 3e9)) == (2e11, 1e10, 3e9)
    monkeypatch.setattr(lm_bench, "in_cache_yardsticks_apply", lambda: False)
    assert lm_bench.machine_rates(1, (2e11, 5e9, None)) == (2e11, 1e10, None)


def test_lines_print_each_ratio_beside_its_goal():
    row = {"jax": 10.0, "torch": 15.0, "floor": 4.0}
    line = lm_bench.row_line(4, row, lm_bench.ratios(row, 4096))
    assert "2.50x (goal <= 2x: MISSED)" in line
    assert "1.50x slower (goal >= 2x: MISSED)" in line
    line = lm_bench.loader_line(1e7, 1e5)
    assert "100.0x the fastest step's 100,000 (goal >= 10x: ok)" in line


def test_the_suite_measures_the_cpu_size_of_the_lm_config():
    size = lm_config.SIZES["cpu"]
    for name, value in size["model"].items():
        assert lm_bench.CPU_MODEL[name] == value, name
    assert (size["seq_len"], size["optim"]["batch_size"]) == (lm_bench.SEQ_LEN, lm_bench.BATCH)
    assert benchmarks.SUITES["lm"] is lm_bench.lm_suite


def test_suite_on_fixed_timings_without_torch(monkeypatch, capsys, tmp_path):
    """Every step 10 ms, the machine's rates fixed: the JSON line's ratios follow."""
    corpus = lm_corpus.write_folder(tmp_path / "corpus", lm_corpus.documents())
    small = data_lib.load(lm_corpus.config(corpus), seed=0)
    monkeypatch.setattr(lm_bench.data_lib, "load", lambda config, seed: small)
    monkeypatch.setattr(lm_bench.torch_baseline, "available", lambda: False)
    monkeypatch.setattr(lm_bench, "jax_step", lambda cfg, mesh, windows: None)
    monkeypatch.setattr(train_bench, "step_ms", lambda steps, repeats: {"jax": 10.0})
    monkeypatch.setattr(lm_bench, "matmul_flops_per_s", lambda repeats: 1e11)
    monkeypatch.setattr(lm_bench, "copy_bytes_per_s", lambda repeats: 1e10)
    monkeypatch.setattr(lm_bench, "exp_per_s", lambda repeats: 1e9)
    result = lm_bench.lm_suite(repeats=1, heads=(1, 16), loader_steps=2)
    out = capsys.readouterr().out
    assert "PyTorch baseline: skipped (torch is not importable" in out
    assert json.loads(out.strip().splitlines()[-1]) == json.loads(json.dumps(result))
    cfg = lm_bench.model_config(16)
    floor = train_bench.roofline_ms(cfg, 32, 128, 1e11, 1e10, 1e9)
    assert result["ratios"]["16"]["x_floor"] == pytest.approx(10.0 / floor)
    assert result["ratios"]["1"]["tokens_per_s"] == pytest.approx(32 * 128 / 0.01)
    assert result["torch_ms_per_step"] is None
    assert result["loader_x_fastest_step"] == pytest.approx(
        result["loader_tokens_per_s"] / (32 * 128 / 0.01)
    )


def test_the_jax_step_builds_at_the_cpu_size():
    """The step the suite times is the language model's AdamW update (built, not run)."""
    windows = np.zeros((lm_bench.BATCH, lm_bench.SEQ_LEN + 1), np.int32)
    run = lm_bench.jax_step(lm_bench.model_config(4), parallel.data_mesh(), windows)
    assert callable(run)
