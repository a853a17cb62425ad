"""The benchmark figures against hand-computed values: FLOP and byte counts, rates in
their units (FLOP/s vs GFLOP/s, s vs ms vs us), ratios and roofline floors. Timings are
replaced by fixed numbers so that every expected figure is exact."""

from __future__ import annotations

import json
import pathlib
import types

import jax
import numpy as np
import optax
import pytest

from beyondpar import model as model_lib
from beyondpar import tasks
from beyondpar.base import parallel
from beyondpar.benchmarks import baselines, machine
from beyondpar.benchmarks import metrics as metrics_benchmark
from beyondpar.benchmarks import train as train_benchmark


def _fixed_time(seconds):
    """A stand-in for `best_time` that runs the work once and reports `seconds`."""

    def best_time(fn, repeats):
        jax.block_until_ready(fn())
        return seconds

    return best_time


# machine: the yardsticks' units ------------------------------------------------------


def test_matmul_rate_counts_two_flops_per_multiply_add(monkeypatch):
    """An n x n matmul is 2 n^3 FLOPs: 2 * 8^3 = 1024 FLOP in 0.25 s is 4096 FLOP/s."""
    monkeypatch.setattr(machine, "best_time", _fixed_time(0.25))
    assert machine.matmul_flops_per_s(3, size=8) == pytest.approx(4096.0)


def test_copy_rate_counts_bytes_read_and_written(monkeypatch):
    """A pass over 1 MiB of float32 reads 1 MiB and writes 1 MiB: 2 MiB in 0.5 s."""
    monkeypatch.setattr(machine, "best_time", _fixed_time(0.5))
    devices = len(jax.local_devices())
    floats = (2**20 // 4 // devices) * devices  # the array is split evenly over the devices
    assert machine.copy_bytes_per_s(2, megabytes=1) == pytest.approx(2 * 4 * floats / 0.5)
    if 2**18 % devices == 0:
        assert machine.copy_bytes_per_s(2, megabytes=1) == pytest.approx(2**22)


def test_cache_rate_counts_every_pass_read_and_written(monkeypatch):
    """3 passes over a 4 KB block per device, each reading and writing it, in 0.1 s."""
    monkeypatch.setattr(machine, "best_time", _fixed_time(0.1))
    devices = len(jax.local_devices())
    expected = 3 * 2 * 4096 * devices / 0.1
    assert machine.cache_bytes_per_s(2, kilobytes=4, passes=3) == pytest.approx(expected)


def test_exp_rate_counts_elements_not_bytes(monkeypatch):
    """3 passes of exp over 4 KB (1024 float32) per device in 0.2 s: 3 * 1024 exps per
    device per 0.2 s, not 4 x that (a byte count)."""
    monkeypatch.setattr(machine, "best_time", _fixed_time(0.2))
    devices = len(jax.local_devices())
    expected = 3 * 1024 * devices / 0.2
    assert machine.exp_per_s(2, kilobytes=4, passes=3) == pytest.approx(expected)


def test_peak_rss_is_linux_kilobytes_in_gb(monkeypatch):
    """Linux reports the peak resident set in kB: 3 * 2^20 kB is 3 GB (GiB), not 3 MB."""
    usage = types.SimpleNamespace(ru_maxrss=3 * 2**20)
    monkeypatch.setattr(machine.resource, "getrusage", lambda who: usage)
    assert machine.peak_rss_gb() == pytest.approx(3.0)


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_peak_rss_agrees_with_the_kernels_high_water_mark():
    """The process's own peak as the kernel reports it (VmHWM, kB): a JAX process holds
    tens of MB at least, and the two readings agree to within what the process may grow
    between them."""
    before = _vm_hwm_kb() / 2**20
    got = machine.peak_rss_gb()
    after = _vm_hwm_kb() / 2**20
    assert got > 0.01
    assert before * 0.9 <= got <= after * 1.1


def _vm_hwm_kb() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    pytest.skip("no VmHWM in /proc/self/status")


# kernels: bounds, rates and the summary ---------------------------------------------


def test_recursion_bytes_is_float32_entries_per_step():
    """T = 3, 5 steps, 2 matrices read per step: 9 entries * 4 bytes * 5 * 2 = 360."""
    assert metrics_benchmark.recursion_bytes(3, 5, 2) == 360
    assert metrics_benchmark.recursion_bytes(100, 100, 1) == 4_000_000


def test_bandwidth_and_product_bounds():
    """360 bytes at 90 B/s take 4 s; 1000 FLOP in 4 s at a 50 FLOP/s matmul is 5x it.
    Two products of 0.5 s each take 1 s; 600 FLOP in 1 s against 100 FLOP/s is 6x."""
    assert metrics_benchmark.bandwidth_bound(1000, 360, 90, 50) == pytest.approx(
        {"seconds": 4.0, "fraction_of_matmul": 5.0}
    )
    assert metrics_benchmark.product_bound(600, 0.5, 2, 100) == pytest.approx(
        {"seconds": 1.0, "fraction_of_matmul": 6.0}
    )
    assert metrics_benchmark.product_bound(600, 0.5, 1, 100) == pytest.approx(
        {"seconds": 0.5, "fraction_of_matmul": 12.0}
    )


def test_rates_and_bounds_from_fixed_timings():
    """n = 3 operators at T = K = 100: two metrics of 2 K T^2 FLOP each, 1.2e7 FLOP.
    The fused kernel reads 2 matrices per step (2.4e7 bytes over n), the normalised walk
    one (1.2e7 bytes)."""
    timings = {"fused": 0.01, "fused_normalized_walk": 0.02}
    r = metrics_benchmark._rates_and_bounds(timings, 0.004, 3, rate=1e10, cache=1e11)
    assert r["effective_gflops"] == pytest.approx(1.2)  # 1.2e7 FLOP / 0.01 s, in GFLOP/s
    assert r["fraction_of_matmul"] == pytest.approx(0.12)
    assert r["fraction_of_matmul_normalized_walk"] == pytest.approx(0.06)
    # 2.4e7 bytes at 1e11 B/s = 2.4e-4 s; 1.2e7 FLOP in it is 5e10 FLOP/s = 5x the matmul
    assert r["bandwidth_bound_fraction_of_matmul"] == pytest.approx(
        {"fused": 5.0, "fused_normalized_walk": 10.0}
    )
    assert r["fraction_of_bandwidth_bound"] == pytest.approx(
        {"fused": 0.024, "fused_normalized_walk": 0.006}
    )
    # product bound: 2 x 0.004 s and 1 x 0.004 s
    assert r["product_bound_fraction_of_matmul"] == pytest.approx(
        {"fused": 0.15, "fused_normalized_walk": 0.3}
    )
    assert r["fraction_of_product_bound"] == pytest.approx(
        {"fused": 0.8, "fused_normalized_walk": 0.2}
    )


def test_rates_and_bounds_without_a_cache_rate_keep_the_product_bound():
    """Off the CPU no cache rate is measured: no bandwidth-bound figures, the same rest."""
    timings = {"fused": 0.01, "fused_normalized_walk": 0.02}
    with_cache = metrics_benchmark._rates_and_bounds(timings, 0.004, 3, rate=1e10, cache=1e11)
    without = metrics_benchmark._rates_and_bounds(timings, 0.004, 3, rate=1e10, cache=None)
    bandwidth = {"bandwidth_bound_fraction_of_matmul", "fraction_of_bandwidth_bound"}
    assert set(with_cache) - set(without) == bandwidth
    assert without == {k: v for k, v in with_cache.items() if k not in bandwidth}


@pytest.mark.parametrize(("backend", "applies"), [("cpu", True), ("gpu", False), ("tpu", False)])
def test_in_cache_yardsticks_apply_on_the_cpu_only(monkeypatch, backend, applies):
    monkeypatch.setattr(machine.jax, "default_backend", lambda: backend)
    assert machine.in_cache_yardsticks_apply() is applies


def test_product_recursion_is_ones_times_matrix_power():
    """v c^steps from v = 1, for each operator of a small block."""
    rng = np.random.default_rng(3)
    c = rng.uniform(size=(2, 3, 3)).astype(np.float32)
    c /= c.sum(-1, keepdims=True)
    out = np.asarray(metrics_benchmark.product_recursion(c, steps=4))
    expected = np.stack([np.ones(3) @ np.linalg.matrix_power(m.astype(np.float64), 4) for m in c])
    assert out.shape == (2, 1, 3)
    np.testing.assert_allclose(out[:, 0], expected, rtol=1e-5)


def _fixed_kernel_timings(monkeypatch):
    """Fixed seconds for the metric suite's kernels (for all n), its product recursion,
    its baselines (per matrix) and a matmul rate of 1e10 FLOP/s."""
    timings = {
        "fused": 0.01,
        "fused_from_one_device": 0.012,
        "fused_normalized_walk": 0.02,
        "fidelity": 0.004,
        "hitting_time": 0.006,
    }
    monkeypatch.setattr(
        metrics_benchmark, "_kernel_times", lambda host, batch, repeats: dict(timings)
    )
    monkeypatch.setattr(metrics_benchmark, "product_recursion_s", lambda batch, repeats: 0.004)
    monkeypatch.setattr(metrics_benchmark, "_baseline_times", lambda host, repeats: (3.0, 0.002))
    monkeypatch.setattr(metrics_benchmark, "matmul_flops_per_s", lambda repeats: 1e10)


def test_metrics_suite_figures_from_fixed_timings(monkeypatch, capsys):
    """Per-matrix microseconds, speed-ups and rates in GFLOP/s and GB/s over n = 2
    operators, from fixed kernel seconds (for all n) and baseline seconds (per matrix)."""
    calls = []
    _fixed_kernel_timings(monkeypatch)
    monkeypatch.setattr(metrics_benchmark, "cache_bytes_per_s", lambda repeats: 1e11)

    def plain(*args):
        calls.append(args)
        return 5000.0

    monkeypatch.setattr(metrics_benchmark, "plain_session_fidelity_us", plain)
    r = metrics_benchmark.metrics_suite(repeats=1, sequences=1, layers=1, operators=2)
    assert calls == [(1, 1, 2)]
    assert r["matrices"] == 2
    assert r["us_per_matrix"] == pytest.approx(
        {
            "fused": 5000.0,
            "fused_from_one_device": 6000.0,
            "fused_normalized_walk": 10000.0,
            "fidelity": 2000.0,
            "hitting_time": 3000.0,
            "product_recursion": 2000.0,
            "paper_method": 3e6,
            "numpy_exact": 2000.0,
            "fidelity_plain_session": 5000.0,
        }
    )
    assert r["speedup_vs_paper"] == pytest.approx(600.0)  # 3 s vs 5 ms per matrix
    assert r["speedup_vs_numpy_exact"] == pytest.approx(0.4)  # 2 ms vs 5 ms
    assert r["matmul_gflops"] == pytest.approx(10.0)
    assert r["cache_gb_per_s"] == pytest.approx(100.0)
    assert r["effective_gflops"] == pytest.approx(0.8)  # 8e6 FLOP in 0.01 s
    assert r["plain_session_vs_launcher"] == pytest.approx(2.5)  # 5000 us vs 2000 us
    assert "600x" in capsys.readouterr().out


def test_metrics_suite_off_the_cpu_measures_no_cache_rate(monkeypatch, capsys):
    """On a GPU the in-cache pass loop times kernel launches: it is not run, and the
    summary says there is no bandwidth bound instead of printing one."""
    monkeypatch.setattr(metrics_benchmark, "in_cache_yardsticks_apply", lambda: False)
    _fixed_kernel_timings(monkeypatch)

    def no_cache_rate(repeats):
        raise AssertionError("cache_bytes_per_s measured off the CPU")

    monkeypatch.setattr(metrics_benchmark, "cache_bytes_per_s", no_cache_rate)
    r = metrics_benchmark.metrics_suite(
        repeats=1, sequences=1, layers=1, operators=2, plain_session=False
    )
    assert r["cache_gb_per_s"] is None and "fraction_of_bandwidth_bound" not in r
    assert r["fraction_of_product_bound"] == pytest.approx(
        {"fused": 0.8, "fused_normalized_walk": 0.2}
    )
    out = capsys.readouterr().out
    assert "no bound off the CPU" in out and "bandwidth bound" not in out
    assert json.loads(out.splitlines()[-1])["cache_gb_per_s"] is None


# training: FLOPs, attention traffic and the floors ----------------------------------

# d = 6, mlp 5, vocab 10, 2 layers, 3 heads; batch 2, T = 7
SMALL = dict(vocab_size=10, embed_dim=6, num_layers=2, num_heads=3, mlp_dim=5, max_len=7)
# per layer: 2*2*7*(4*36 + 2*6*5) = 5712 for the projections and MLP, 4*2*49*6 = 2352
# for the scores and the value product; head: 2*2*7*6*10 = 1680; x3 for the backward
STEP_FLOPS = 3 * (2 * (5712 + 2352) + 1680)  # 53424
ELEMENTS = 2 * 2 * 3 * 49  # layers * batch * heads * T^2 = 588


def test_train_step_flops_by_hand():
    cfg = model_lib.ModelConfig(**SMALL)
    assert STEP_FLOPS == 53424
    assert train_benchmark.train_step_flops(cfg, 2, 7) == STEP_FLOPS


def test_attention_traffic_grows_with_heads():
    """B x H x T x T per layer, read and written ATTENTION_PASSES = 11 times as float32."""
    cfg = model_lib.ModelConfig(**SMALL)
    assert train_benchmark.attention_elements(cfg, 2, 7) == ELEMENTS
    assert train_benchmark.attention_bytes(cfg, 2, 7) == 11 * 4 * ELEMENTS  # 25872
    one_head = model_lib.ModelConfig(**{**SMALL, "num_heads": 1})
    assert train_benchmark.attention_elements(one_head, 2, 7) == ELEMENTS // 3


def test_roofline_ms_adds_flops_bytes_and_exponentials():
    """Rates chosen so each part takes exactly 1 s: 1000 ms per part, in milliseconds."""
    cfg = model_lib.ModelConfig(**SMALL)
    assert train_benchmark.roofline_ms(cfg, 2, 7, STEP_FLOPS, 25872) == pytest.approx(2000.0)
    assert train_benchmark.roofline_ms(cfg, 2, 7, STEP_FLOPS, 25872, ELEMENTS) == pytest.approx(
        3000.0
    )
    assert train_benchmark.roofline_ms(cfg, 2, 7, STEP_FLOPS, 25872, ELEMENTS / 4) == pytest.approx(
        6000.0
    )


def test_result_line_ratios_and_units():
    """The JSON line from fixed rows: rates in G/s, times in ms, tokens per second."""
    cfg = model_lib.ModelConfig(**SMALL)
    rate = STEP_FLOPS / 0.002  # the FLOPs alone take 2 ms
    rows = {
        "1": {"jax": 10.0, "roofline": 4.0, "roofline_with_exp": 5.0, "torch": 25.0},
        "16": {"jax": 30.0, "roofline": 6.0, "roofline_with_exp": 12.0, "torch": 45.0},
    }
    r = train_benchmark._result(rows, 4, (rate, 2e9, 3e9), cfg, 2, 7)
    assert r["devices"] == 4
    assert r["matmul_gflops"] == pytest.approx(rate / 1e9)
    assert r["copy_gb_per_s"] == pytest.approx(2.0)
    assert r["exp_g_per_s"] == pytest.approx(3.0)
    assert r["step_gflop"] == pytest.approx(53424e-9)
    assert r["floor_ms"] == pytest.approx(2.0)
    assert r["attention_passes"] == 11
    assert r["roofline_ms"] == {"1": 4.0, "16": 6.0}
    assert r["ms_per_step"] == {"1": 10.0, "16": 30.0}
    # 14 tokens per step: 14 / 0.010 s and 14 / 0.030 s
    assert r["tokens_per_s"] == pytest.approx({"1": 1400.0, "16": 1400.0 / 3})
    assert r["x_floor"] == pytest.approx({"1": 5.0, "16": 15.0})
    assert r["x_roofline"] == pytest.approx({"1": 2.5, "16": 5.0})
    assert r["roofline_with_exp_ms"] == {"1": 5.0, "16": 12.0}
    assert r["x_roofline_with_exp"] == pytest.approx({"1": 2.0, "16": 2.5})
    assert r["ratio_16_to_1"] == pytest.approx(3.0)
    assert r["torch_ms_per_step"] == {"1": 25.0, "16": 45.0}
    assert r["speedup_vs_torch"] == pytest.approx({"1": 2.5, "16": 1.5})


def test_result_line_without_an_exp_rate():
    """Off the CPU the exponentials bound nothing: no rate, and the second floor is the
    first (rows built by `roofline_ms` without `exps_per_s`)."""
    cfg = model_lib.ModelConfig(**SMALL)
    rows = {"1": {"jax": 10.0, "roofline": 4.0, "roofline_with_exp": 4.0}}
    r = train_benchmark._result(rows, 1, (1e9, 1e9, None), cfg, 2, 7)
    assert r["exp_g_per_s"] is None
    assert r["x_roofline_with_exp"] == r["x_roofline"] == pytest.approx({"1": 2.5})
    json.dumps(r)


def test_train_suite_off_the_cpu_has_one_floor(monkeypatch, capsys):
    """On a GPU the exp rate is not measured (its pass loop times kernel launches there),
    so the floor with exponentials is the floor of FLOPs and attention passes."""
    monkeypatch.setattr(train_benchmark, "in_cache_yardsticks_apply", lambda: False)

    def no_exp_rate(repeats):
        raise AssertionError("exp_per_s measured off the CPU")

    monkeypatch.setattr(train_benchmark, "exp_per_s", no_exp_rate)
    monkeypatch.setattr(train_benchmark, "matmul_flops_per_s", lambda repeats: STEP_FLOPS / 0.002)
    monkeypatch.setattr(train_benchmark, "copy_bytes_per_s", lambda repeats: 25872 / 0.002)
    monkeypatch.setattr(train_benchmark, "training_steps", lambda cfg, mesh, examples, device: {})
    monkeypatch.setattr(train_benchmark, "step_ms", lambda steps, repeats: {"jax": 10.0})
    monkeypatch.setattr(
        train_benchmark, "step_profile_ms", lambda cfg, mesh, examples: {"all": 1.0}
    )
    monkeypatch.setattr(train_benchmark.torch_baseline, "available", lambda: False)
    monkeypatch.setattr(train_benchmark.model_lib, "ModelConfig", _small_config)
    r = train_benchmark.train_suite(repeats=1, heads=(3,), batch=2, t=7)
    assert r["exp_g_per_s"] is None
    assert r["roofline_ms"] == r["roofline_with_exp_ms"] == pytest.approx({"3": 4.0})
    assert "exp: no floor off the CPU" in capsys.readouterr().out


def test_steps_are_timed_in_turns_and_each_keeps_its_best(monkeypatch):
    """Every round times each step once (a warm-up and its share of the repeats), in turn;
    each step's figure is its best round, in milliseconds, over exactly `repeats` calls."""
    calls = []
    seconds = {"jax": iter([0.5, 0.2, 0.4, 0.3]), "torch": iter([0.1, 0.6, 0.05, 0.7])}

    def fake_best_time(step, repeats):
        calls.append((step(), repeats))
        return next(seconds[step()])

    monkeypatch.setattr(train_benchmark, "best_time", fake_best_time)
    steps = {"jax": lambda: "jax", "torch": lambda: "torch"}
    assert train_benchmark.step_ms(steps, repeats=10) == pytest.approx(
        {"jax": 200.0, "torch": 50.0}
    )
    # 10 calls in all, 3 + 3 + 2 + 2; every other round in reverse order
    forward, backward = [("jax", 3), ("torch", 3)], [("torch", 3), ("jax", 3)]
    last = [("jax", 2), ("torch", 2), ("torch", 2), ("jax", 2)]
    assert calls == forward + backward + last
    calls.clear()
    seconds = {"jax": iter([0.5, 0.2]), "torch": iter([0.1, 0.6])}
    assert train_benchmark.step_ms(steps, repeats=2) == pytest.approx(
        {"jax": 200.0, "torch": 100.0}
    )
    assert calls == [("jax", 1), ("torch", 1), ("torch", 1), ("jax", 1)]
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        train_benchmark.step_ms(steps, repeats=0)


def test_step_ms_reports_steps_slower_than_a_second(monkeypatch):
    """A step whose every round takes seconds still reports its best round, not a cap."""
    seconds = {"slow": iter([3.0, 2.5]), "fast": iter([0.004, 0.002])}
    monkeypatch.setattr(train_benchmark, "best_time", lambda step, repeats: next(seconds[step()]))
    steps = {"slow": lambda: "slow", "fast": lambda: "fast"}
    assert train_benchmark.step_ms(steps, repeats=2) == pytest.approx({"slow": 2500.0, "fast": 2.0})


def _small_config(num_heads=3, max_len=7, num_layers=None, config=model_lib.ModelConfig):
    """The suite's configs at SMALL's sizes (the suite builds them by head count; its
    default layer count gives way to SMALL's)."""
    del num_layers
    return config(**(SMALL | {"num_heads": num_heads, "max_len": max_len}))


def test_result_line_without_both_head_counts_or_torch():
    cfg = model_lib.ModelConfig(**SMALL)
    rows = {"4": {"jax": 8.0, "roofline": 4.0, "roofline_with_exp": 4.0}}
    r = train_benchmark._result(rows, 1, (1e9, 1e9, 1e9), cfg, 2, 7)
    assert r["ratio_16_to_1"] is None
    assert "speedup_vs_torch" not in r


def test_result_line_leaves_torch_out_unless_every_row_has_it():
    cfg = model_lib.ModelConfig(**SMALL)
    rows = {
        "1": {"jax": 10.0, "roofline": 4.0, "roofline_with_exp": 5.0, "torch": 25.0},
        "16": {"jax": 30.0, "roofline": 6.0, "roofline_with_exp": 12.0},
    }
    r = train_benchmark._result(rows, 1, (1e9, 1e9, 1e9), cfg, 2, 7)
    assert "torch_ms_per_step" not in r
    assert "speedup_vs_torch" not in r
    assert r["ratio_16_to_1"] == pytest.approx(3.0)


def _suite_on_the_cpu(monkeypatch, seen):
    """`train_suite` on SMALL's sizes with the CPU's three rates fixed and every step 10 ms;
    `seen` collects what the suite times and profiles."""
    monkeypatch.setattr(train_benchmark, "in_cache_yardsticks_apply", lambda: True)
    monkeypatch.setattr(train_benchmark, "exp_per_s", lambda repeats: ELEMENTS / 0.001)
    monkeypatch.setattr(train_benchmark, "matmul_flops_per_s", lambda repeats: STEP_FLOPS / 0.002)
    monkeypatch.setattr(train_benchmark, "copy_bytes_per_s", lambda repeats: 25872 / 0.002)
    monkeypatch.setattr(
        train_benchmark,
        "training_steps",
        lambda cfg, mesh, examples, device: {"cfg": cfg, "device": device},
    )

    def step_ms(steps, repeats):
        seen.append(
            ("timed", steps["cfg"].num_heads, steps["cfg"].max_len, steps["device"], repeats)
        )
        return {"jax": 10.0}

    def profile(cfg, mesh, examples):
        seen.append(("profiled", cfg.num_heads, cfg.max_len))
        return {"all": float(cfg.num_heads)}

    monkeypatch.setattr(train_benchmark, "step_ms", step_ms)
    monkeypatch.setattr(train_benchmark, "step_profile_ms", profile)
    monkeypatch.setattr(train_benchmark.torch_baseline, "available", lambda: False)
    monkeypatch.setattr(train_benchmark.model_lib, "ModelConfig", _small_config)


def test_train_suite_on_the_cpu_adds_the_exponentials_to_the_second_floor(monkeypatch):
    _suite_on_the_cpu(monkeypatch, [])
    r = train_benchmark.train_suite(repeats=1, heads=(3,), batch=2, t=7)
    assert r["exp_g_per_s"] == pytest.approx(ELEMENTS / 0.001 / 1e9)
    # 2 ms of FLOPs + 2 ms of attention passes, then 1 ms of exponentials
    assert r["roofline_ms"] == pytest.approx({"3": 4.0})
    assert r["roofline_with_exp_ms"] == pytest.approx({"3": 5.0})
    assert r["x_roofline_with_exp"] == pytest.approx({"3": 2.0})


def test_train_suite_times_each_head_count_and_profiles_the_smallest_and_largest(monkeypatch):
    seen = []
    _suite_on_the_cpu(monkeypatch, seen)
    r = train_benchmark.train_suite(repeats=5, heads=(3, 1, 2), batch=2, t=5)
    assert set(r["ms_per_step"]) == {"1", "2", "3"}
    # each head count's steps at the suite's length, timed with its repeats, no PyTorch
    timed = [("timed", h, 5, None, 5) for h in (3, 1, 2)]
    assert seen == timed + [("profiled", 1, 5), ("profiled", 3, 5)]
    assert r["step_profiles_ms"] == {"1": {"all": 1.0}, "3": {"all": 3.0}}


def test_train_suite_times_pytorch_on_the_device_matching_jaxs_backend(monkeypatch):
    seen = []
    _suite_on_the_cpu(monkeypatch, seen)
    monkeypatch.setattr(train_benchmark.torch_baseline, "available", lambda: True)
    monkeypatch.setattr(train_benchmark.torch_baseline, "device_for", lambda backend: f"{backend}!")
    monkeypatch.setattr(train_benchmark, "_torch_version", lambda: "2.0")
    train_benchmark.train_suite(repeats=2, heads=(3,), batch=2, t=7)
    assert seen[0] == ("timed", 3, 7, f"{jax.default_backend()}!", 2)


def test_training_steps_time_the_jax_step_and_torch_only_on_a_device(monkeypatch):
    def run():
        return 0.0

    monkeypatch.setattr(train_benchmark, "_jax_step", lambda cfg, mesh, examples: (run, "HLO text"))
    runners = []

    def step_runner(cfg, inputs, targets, devices, device):
        runners.append((cfg, inputs.tolist(), targets.tolist(), devices, device))
        return "torch step"

    monkeypatch.setattr(train_benchmark.torch_baseline, "step_runner", step_runner)
    cfg, mesh = model_lib.ModelConfig(**SMALL), types.SimpleNamespace(size=2)
    inputs, targets = np.array([[1, 2], [3, 4]]), np.array([[2, 3], [4, 5]])
    examples = tasks.Examples(inputs, targets, np.ones((2, 2), bool))
    assert train_benchmark.training_steps(cfg, mesh, examples, None) == {"jax": run}
    assert runners == []
    steps = train_benchmark.training_steps(cfg, mesh, examples, "cpu")
    assert steps == {"jax": run, "torch": "torch step"}
    assert runners == [(cfg, [[1, 2], [3, 4]], [[2, 3], [4, 5]], 2, "cpu")]


def test_the_timed_jax_step_trains_the_model_and_carries_its_state_on():
    """Each call of the "jax" step is one Adam step (learning rate 1e-3) of the model
    initialised from key 0 on the whole batch: it returns the loss before the update,
    so two calls give the initial loss and the loss after one update (without dropout,
    both recomputed here on one device)."""
    cfg = model_lib.ModelConfig(
        **dict(SMALL, num_layers=1, num_heads=2, embed_dim=8, dropout_rate=0.0)
    )
    examples = tasks.make_examples("copy", jax.random.PRNGKey(1), 8, cfg.max_len, cfg.vocab_size)
    run = train_benchmark.training_steps(cfg, parallel.data_mesh(), examples, None)["jax"]
    got = [float(run()) for _ in range(2)]

    module, tx = model_lib.Transformer(cfg), optax.adam(1e-3)
    params = model_lib.init_params(module, jax.random.PRNGKey(0), cfg.max_len)

    def loss(p):
        logits = module.apply({"params": p}, examples.inputs, deterministic=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, examples.targets).mean()

    @jax.jit
    def one_step(p):
        value, grads = jax.value_and_grad(loss)(p)
        updates, _ = tx.update(grads, tx.init(p), p)
        return value, loss(optax.apply_updates(p, updates))

    before, after = one_step(params)
    assert got[0] == pytest.approx(float(before), rel=1e-5)
    assert got[1] == pytest.approx(float(after), rel=1e-5)
    assert got[1] < got[0] - 1e-3  # one Adam step moves every weight by about 1e-3


# baselines: closed forms on a two-token operator ------------------------------------

# Every row is (1/2, 1/2): the walk from token 0 reaches the sink (token 1) with
# probability 1/2 per step, so within k = 3 steps it takes 1 + 1/2 + 1/4 = 1.75 steps on
# average; the sink itself takes 0, so the mean over both tokens is 0.875. The sink's
# row is (1/2, 1/2) at every power, so the fidelity is 1/2.
HALVES = np.full((2, 2), 0.5)


def test_numpy_exact_closed_form():
    fidelity, hitting = baselines.numpy_exact(HALVES, k=3)
    assert fidelity == pytest.approx(0.5)
    assert hitting == pytest.approx(0.875)
    # k = 4: one more term, 1/8 from token 0
    assert baselines.numpy_exact(HALVES, k=4)[1] == pytest.approx((1.75 + 0.125) / 2)


def test_paper_fidelity_closed_form():
    """A causal 2-token operator: the sink's row at step k is (1 - q^k, q^k) with q = 0.7,
    so the best over 3 steps is (1 - 0.343, 0.7) and the fidelity 0.657."""
    c = np.array([[1.0, 0.0], [0.3, 0.7]])
    assert baselines.paper_fidelity(c, 3) == pytest.approx(0.657)
    assert baselines.numpy_exact(c, k=3)[0] == pytest.approx(0.657)


def test_paper_method_monte_carlo_matches_closed_form():
    """2000 walks from token 0: standard error of the mean about 0.01 after halving."""
    fidelity, hitting = baselines.paper_method(HALVES, np.random.default_rng(0), walks=2000, k=3)
    assert fidelity == pytest.approx(0.5)
    assert hitting == pytest.approx(0.875, abs=0.05)
