"""The benchmark baselines compute what the kernels compute, and the suites report."""

import dataclasses
import functools
import inspect
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from beyondpar import benchmarks, graphs, metrics, model, pretrained
from beyondpar.base import parallel
from beyondpar.benchmarks import baselines, corpus, load, machine
from beyondpar.benchmarks import metrics as metrics_benchmark
from beyondpar.benchmarks import pretrained as pretrained_benchmark
from beyondpar.benchmarks import synergy as synergy_benchmark
from beyondpar.benchmarks import train as train_benchmark
from beyondpar.benchmarks.models import SMOLLM2_135M
from helpers.paths import SMOLLM2_GGUF, needs_smollm2

# The pretrained and corpus suites' model (any family's config): built and compiled once.
TINY_GPT2 = dict(model_type="gpt2", vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)


@pytest.mark.float64
def test_numpy_baselines_agree_with_kernels():
    c = graphs.random_causal(4, (), 12, dtype=np.float64)
    fidelity, hit = baselines.numpy_exact(c, k=30)
    np.testing.assert_allclose(fidelity, metrics.minimax_fidelity(c, 30), rtol=1e-12)
    np.testing.assert_allclose(hit, metrics.hitting_time(c, 30), rtol=1e-12)
    paper_fidelity, paper_hit = baselines.paper_method(c, np.random.default_rng(0), 400, 30)
    np.testing.assert_allclose(paper_fidelity, fidelity, rtol=1e-12)
    _, stderr = metrics.monte_carlo_hitting_time(
        jax.random.PRNGKey(0), c, 400, 30, return_stderr=True
    )
    assert abs(paper_hit - hit) < 4 * float(stderr)


def test_flop_count_of_the_papers_step():

    flops = train_benchmark.train_step_flops(model.ModelConfig(), batch=50, t=100)
    assert 5.5e9 < flops < 6.5e9  # "about 6 GFLOP forward + backward"


def test_roofline_floor_of_the_papers_step():
    """FLOPs at the matmul rate plus ATTENTION_PASSES float32 passes over B x H x T x T per
    layer at the copy bandwidth; only the attention part grows with the head count."""
    cfg = model.ModelConfig(num_heads=8, max_len=100)
    flops = train_benchmark.train_step_flops(cfg, batch=50, t=100)
    passes = train_benchmark.ATTENTION_PASSES * 4 * 50 * 8 * 100 * 100 * 4
    assert train_benchmark.attention_bytes(cfg, 50, 100) == passes
    expected = 1e3 * (flops / 2e11 + passes / 1e10)
    assert train_benchmark.roofline_ms(cfg, 50, 100, 2e11, 1e10) == pytest.approx(
        expected, rel=1e-12
    )
    one = dataclasses.replace(cfg, num_heads=1)
    assert train_benchmark.train_step_flops(one, 50, 100) == flops
    assert train_benchmark.attention_bytes(one, 50, 100) * 8 == passes


def test_roofline_floor_with_the_softmaxs_exponentials():
    """The second floor adds one exponential per attention element, B x H x T x T per
    layer, at the exponential rate, to the first."""
    cfg = model.ModelConfig(num_heads=16, num_layers=3, max_len=20)
    elements = 3 * 7 * 16 * 20 * 20
    assert train_benchmark.attention_elements(cfg, 7, 20) == elements
    assert (
        train_benchmark.attention_bytes(cfg, 7, 20)
        == train_benchmark.ATTENTION_PASSES * elements * 4
    )
    plain = train_benchmark.roofline_ms(cfg, 7, 20, 2e11, 1e10)
    got = train_benchmark.roofline_ms(cfg, 7, 20, 2e11, 1e10, exps_per_s=5e9)
    assert got - plain == pytest.approx(1e3 * elements / 5e9, rel=1e-9)


def test_bandwidth_bound_of_the_metric_recursions():
    """Every matrix entry read once per step; the bound is those bytes at the cache rate,
    and its flop rate over the matmul rate."""
    assert metrics_benchmark.recursion_bytes(t=100, steps=100, matrices_per_step=2) == 8 * 10**6
    assert metrics_benchmark.recursion_bytes(t=7, steps=3, matrices_per_step=1) == 4 * 49 * 3
    bound = metrics_benchmark.bandwidth_bound(
        flop=4e6, nbytes=8e6, bytes_per_s=8e10, flops_per_s=2e11
    )
    assert bound["seconds"] == pytest.approx(1e-4, rel=1e-12)
    assert bound["fraction_of_matmul"] == pytest.approx(0.2, rel=1e-12)  # 4e10 / 2e11
    assert metrics_benchmark.MATRICES_READ == {"fused": 2, "fused_normalized_walk": 1}


def test_product_bound_of_the_metric_recursions():
    """Each matrix read per step costs one bare product recursion: two reads, twice its
    seconds, and the kernel's flops over those seconds against the matmul rate."""
    bound = metrics_benchmark.product_bound(
        flop=4e6, product_s=2e-5, matrices_per_step=2, flops_per_s=4e11
    )
    assert bound["seconds"] == pytest.approx(4e-5, rel=1e-12)
    assert bound["fraction_of_matmul"] == pytest.approx(0.25, rel=1e-12)  # 1e11 / 4e11


@pytest.mark.float64
def test_product_recursion_is_ones_times_each_matrix_power():
    """Ones times each matrix `steps` times, and K times by default (float64 here)."""
    c = np.random.default_rng(0).random((3, 5, 5))
    want = np.ones(5) @ np.linalg.matrix_power(c, 4)
    np.testing.assert_allclose(
        metrics_benchmark.product_recursion(c, steps=4)[:, 0], want, rtol=1e-12
    )
    stochastic = c / c.sum(-1, keepdims=True)
    want = np.ones(5) @ np.linalg.matrix_power(stochastic, metrics_benchmark.K)
    np.testing.assert_allclose(
        metrics_benchmark.product_recursion(stochastic)[:, 0], want, rtol=1e-9
    )


@pytest.mark.slow
def test_suites_report_their_ratios(capsys, monkeypatch):
    # The machine's yardsticks, measured by their own code on smaller blocks: a 256 x 256
    # matmul and 8 MB copied (the ratios below hold for any rates the run measured).
    matmul = functools.partial(machine.matmul_flops_per_s, size=256)
    monkeypatch.setattr(metrics_benchmark, "matmul_flops_per_s", matmul)
    monkeypatch.setattr(train_benchmark, "matmul_flops_per_s", matmul)
    copy = functools.partial(machine.copy_bytes_per_s, megabytes=8)
    monkeypatch.setattr(train_benchmark, "copy_bytes_per_s", copy)
    r = metrics_benchmark.metrics_suite(repeats=1, sequences=4, layers=1, operators=2)
    assert r["matrices"] == 8 and r["speedup_vs_paper"] > 1
    assert set(r["us_per_matrix"]) >= {"fused", "paper_method", "numpy_exact"}
    bound, share = r["bandwidth_bound_fraction_of_matmul"], r["fraction_of_bandwidth_bound"]
    # The normalised walk reads one matrix per step, the fused kernel two: half the bound.
    assert bound["fused_normalized_walk"] == pytest.approx(2 * bound["fused"], rel=1e-9)
    # Two metrics of K steps at 2 T^2 flops per step; the fused kernel reads 2 T^2 floats
    # per step for 4 T^2 flops: 0.5 flop per byte at the cache rate.
    rate = r["cache_gb_per_s"] / r["matmul_gflops"]
    assert bound["fused"] == pytest.approx(0.5 * rate, rel=1e-9)
    flop = 8 * 4 * 100**3
    kernel_s = 8 * r["us_per_matrix"]["fused"] * 1e-6
    assert r["effective_gflops"] == pytest.approx(flop / kernel_s / 1e9, rel=1e-6)
    us = r["us_per_matrix"]
    for key, name in [("", "fused"), ("_normalized_walk", "fused_normalized_walk")]:
        rate_of_kernel = flop / (8 * us[name] * 1e-6)
        want = rate_of_kernel / (r["matmul_gflops"] * 1e9)
        assert r[f"fraction_of_matmul{key}"] == pytest.approx(want, rel=1e-6)
    for name in ("fused", "fused_normalized_walk"):
        seconds = 8 * metrics_benchmark.recursion_bytes(
            100, 100, metrics_benchmark.MATRICES_READ[name]
        )
        seconds /= r["cache_gb_per_s"] * 1e9
        assert share[name] == pytest.approx(seconds / (8 * us[name] * 1e-6), rel=1e-6)
    products, on_products = r["product_bound_fraction_of_matmul"], r["fraction_of_product_bound"]
    assert products["fused_normalized_walk"] == pytest.approx(2 * products["fused"], rel=1e-9)
    for name in ("fused", "fused_normalized_walk"):
        reads = metrics_benchmark.MATRICES_READ[name] * us["product_recursion"]
        assert on_products[name] == pytest.approx(reads / us[name], rel=1e-6)
        assert products[name] == pytest.approx(
            4 * 100**3 / (reads * 1e-6) / (r["matmul_gflops"] * 1e9), rel=1e-6
        )
    # The fresh process's fidelity kernel, against the launcher's in this one.
    plain = us["fidelity_plain_session"]
    assert plain > 0 and r["plain_session_vs_launcher"] == pytest.approx(plain / us["fidelity"])
    updates = []  # each head count's jitted step, timed then profiled
    jitted_update = train_benchmark.study_train.jitted_update
    monkeypatch.setattr(
        train_benchmark.study_train,
        "jitted_update",
        lambda *args: updates.append(jitted_update(*args)) or updates[-1],
    )
    t = train_benchmark.train_suite(repeats=1, heads=(1, 4), batch=8, t=16, layers=1)
    # A profile runs the step it timed, compiled once (its program cached with the jit).
    assert len(updates) == 4 and updates[0] is not updates[1]
    assert updates[2] is updates[0] and updates[3] is updates[1]
    assert set(t["ms_per_step"]) == {"1", "4"} and t["floor_ms"] > 0
    for h, floor in t["roofline_ms"].items():
        cfg = model.ModelConfig(num_heads=int(h), num_layers=1, max_len=16)
        gflops, gbytes, gexps = t["matmul_gflops"], t["copy_gb_per_s"], t["exp_g_per_s"]
        want = train_benchmark.roofline_ms(cfg, 8, 16, gflops * 1e9, gbytes * 1e9)
        assert floor == pytest.approx(want, rel=1e-9)
        with_exp = train_benchmark.roofline_ms(cfg, 8, 16, gflops * 1e9, gbytes * 1e9, gexps * 1e9)
        assert t["roofline_with_exp_ms"][h] == pytest.approx(with_exp, rel=1e-9)
        ms = t["ms_per_step"][h]
        assert t["x_roofline_with_exp"][h] == pytest.approx(ms / with_exp, rel=1e-9)
    # Where the smallest and the largest steps go: both passes' matmuls, and the gradients
    # summed over the test's four devices.
    assert set(t["step_profiles_ms"]) == {"1", "4"}
    for kinds in t["step_profiles_ms"].values():
        assert {"forward: matmuls", "backward: matmuls"} <= set(kinds)
        assert any(kind.startswith("gradient all-reduce") for kind in kinds)
        assert all(ms > 0 for ms in kinds.values())
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith('{"devices"')


@pytest.mark.slow
def test_analysis_suites_report_every_part(capsys, monkeypatch):

    p = pretrained_benchmark.pretrained_suite(t=16, config=TINY_GPT2, gguf=False)
    assert set(p["seconds"]) >= {"load (build + random init)", "forward", "rollout", "report"}
    assert p["speedup_vs_paper_fidelity"] > 0 and p["peak_rss_gb_without_pairwise"] > 0
    capsys.readouterr()
    monkeypatch.setattr(synergy_benchmark, "matmul_flops_per_s", lambda repeats: 123.4e9)
    # The sizes of the recording test below: one model initialisation for both.
    s = synergy_benchmark.synergy_suite(sequences=3, heads=2, t=16, layers=1)
    assert set(s["seconds_warm"]) == set(s["share"]) and abs(sum(s["share"].values()) - 1) < 1e-9
    # The machine's rate, measured in the same run, rides with the times (in GFLOP/s).
    assert s["matmul_gflop_per_s"] == pytest.approx(123.4)
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith('{"heads": 2') and out[0].endswith("matmul 123 GFLOP/s")
    assert out[0].startswith("2 heads, 3 sequences of 16 tokens")


def test_synergy_suite_reports_first_calls_and_the_best_of_the_later_calls(monkeypatch, capsys):
    """Each part and the whole evaluation: its first call's time, and the best of
    `repeats` later calls (scripted times, in the order the suite takes them; nothing
    runs)."""
    monkeypatch.setattr(synergy_benchmark, "matmul_flops_per_s", lambda repeats: 1e9)
    # Per part, then the whole: the first call, then three later calls.
    times = iter([9.0, 3.0, 1.0, 2.0, 8.0, 2.0, 4.0, 3.0, 7.0, 5.0, 6.0, 4.0, 20, 11, 10, 12])
    monkeypatch.setattr(synergy_benchmark, "timed", lambda fn: (None, next(times)))
    s = synergy_benchmark.synergy_suite(repeats=3, sequences=3, heads=2, t=16, layers=1)
    capsys.readouterr()
    assert list(s["seconds_first_call"].values()) == [9.0, 8.0, 7.0]
    assert list(s["seconds_warm"].values()) == [1.0, 2.0, 4.0]
    assert (s["total_first_call_s"], s["total_s"]) == (20, 10)
    assert list(s["share"].values()) == pytest.approx([1 / 7, 2 / 7, 4 / 7])


def test_corpus_suite_times_every_part_of_a_corpus_analysis(capsys, monkeypatch):
    monkeypatch.setattr(corpus, "matmul_flops_per_s", lambda repeats: 87.6e9)
    summarized = []
    summarize = corpus.statistics.summarize
    monkeypatch.setattr(
        corpus.statistics,
        "summarize",
        lambda records: summarized.append(records) or summarize(records),
    )
    # Batches of one window, over two documents of the bootstrap, through the pretrained
    # suite's model (the corpus suite reads any family's config): the analysis test above
    # ran its one text through the same programs, which this run then reuses.
    r = corpus.corpus_suite(windows=6, tokens=16, batch_size=1, config=TINY_GPT2)
    # The timed summary is a user's: every window's record, in window order.
    assert [[line["window"] for line in records] for records in summarized] == [[*range(6)]]
    assert (r["windows"], r["tokens"], r["layers"], r["heads"]) == (6, 16, 1, 2)
    parts = {"forward", "rollout", "per-head and mixed metrics", "synergy analyses"}
    assert parts | {"summary (bootstrap intervals)", "report (markdown + plots)"} <= set(
        r["seconds"]
    )
    assert r["total_s"] == pytest.approx(sum(r["seconds"].values()))
    assert 0 < r["peak_rss_gb"] < 64
    assert r["matmul_gflop_per_s"] == pytest.approx(87.6)
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith('{"windows": 6') and out[0].endswith("matmul 88 GFLOP/s")


@needs_smollm2
def test_corpus_benchmark_has_the_real_models_shape():
    built = pretrained.build(SMOLLM2_135M).config
    real = pretrained.gguf_file.GgufFile(SMOLLM2_GGUF).config()
    real = pretrained.build(real).config
    assert built.eps == pytest.approx(real.eps)  # GGUF stores it as float32
    assert built == dataclasses.replace(real, eps=built.eps)


def test_load_suite_times_both_paths_on_the_same_values(capsys):
    tiny = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    tiny.update(num_key_value_heads=2, intermediate_size=256, max_position_embeddings=64)
    tiny.update(rope_theta=1e6, rms_norm_eps=1e-6)
    r = load.load_suite(repeats=1, config=tiny, smollm2=False)
    (name,) = r["files"]
    f = r["files"][name]
    # Q4_K_M on 2 layers: layer 1 gets the wider types; rows of 64 values fall back.
    assert f["types"] == {"Q5_0": 12, "Q8_0": 2, "Q6_K": 1, "Q4_K": 1, "F32": 11}
    assert f["same_values"] and f["speedup"] == pytest.approx(f["previous_seconds"] / f["seconds"])
    matrices = 64 * 64 * 2 + 32 * 64 * 2 + 64 * 256 * 3
    vectors = 64 + 32 + 32 + 64 * 2  # q/k/v biases, two norms
    values = 512 * 64 * 2 + 2 * (matrices + vectors) + 64
    assert f["weights_gb"] == pytest.approx(values * 4 / 2**30)
    assert f["rss_before_load_gb"] < f["peak_rss_gb"] < 64
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('{"cores"')


def test_cache_rate_counts_each_pass_reading_and_writing_the_block(monkeypatch):
    """`passes` in-place passes over `kilobytes` per device: every byte read and written
    once per pass."""
    monkeypatch.setattr(machine, "best_time", lambda fn, repeats: 0.25)
    devices = len(jax.local_devices())
    rate = machine.cache_bytes_per_s(1, kilobytes=3, passes=5)
    assert rate == pytest.approx(2 * 5 * devices * 3 * 1024 / 0.25, rel=1e-12)


def test_exp_rate_counts_every_exponential_of_every_pass(monkeypatch):
    """`passes` passes over `kilobytes` of float32 per device, one exponential each."""
    monkeypatch.setattr(machine, "best_time", lambda fn, repeats: 0.5)
    devices = len(jax.local_devices())
    rate = machine.exp_per_s(1, kilobytes=3, passes=7)
    assert rate == pytest.approx(7 * devices * 3 * 256 / 0.5, rel=1e-12)


def test_exp_rate_times_exponentials_that_stay_finite(monkeypatch):
    """The timed call repeats x -> exp(-x) from ones: after the passes the block holds that
    iterate (near the fixed point 0.567), not infinities or subnormals."""
    calls = []
    monkeypatch.setattr(machine, "best_time", lambda fn, repeats: calls.append(fn()) or 1.0)
    machine.exp_per_s(1, kilobytes=1, passes=5)
    want = 1.0
    for _ in range(5):
        want = np.exp(-want)
    got = np.asarray(calls[0])
    assert got.shape[-1] * got.shape[0] == len(jax.local_devices()) * 256
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_copy_rate_counts_each_byte_read_and_written(monkeypatch):
    """One in-place pass over `megabytes` split over the devices: each byte read and
    written once."""
    monkeypatch.setattr(machine, "best_time", lambda fn, repeats: 0.25)
    assert machine.copy_bytes_per_s(1, megabytes=2) == pytest.approx(2 * 2 * 2**20 / 0.25)


def test_train_row_prints_the_steps_tokens_per_second_and_both_floors(capsys):
    row = {"jax": 10.0, "roofline": 4.0, "roofline_with_exp": 8.0, "torch": 25.0}
    train_benchmark._print_row(16, row, 5000)
    line = capsys.readouterr().out
    assert "10.0 ms/step" in line and " 500000 tokens/s" in line
    assert "floor    4.0 ms (2.50x)" in line and "with exp    8.0 ms (1.25x)" in line
    assert "PyTorch    25.0 ms (2.50x slower)" in line


def test_train_result_reports_ratios_of_the_measured_steps():
    """The JSON line's ratios are step over floor and 16 heads over 1, each way round."""
    cfg = model.ModelConfig(max_len=16)
    rows = {
        "1": {"jax": 10.0, "roofline": 5.0, "roofline_with_exp": 8.0},
        "16": {"jax": 30.0, "roofline": 12.0, "roofline_with_exp": 20.0},
    }
    r = train_benchmark._result(rows, 2, (2e11, 1e10, 5e9), cfg, 8, 16)
    assert r["ratio_16_to_1"] == pytest.approx(3.0)
    assert r["x_roofline"] == pytest.approx({"1": 2.0, "16": 2.5})
    assert r["x_roofline_with_exp"] == pytest.approx({"1": 1.25, "16": 1.5})
    assert r["exp_g_per_s"] == pytest.approx(5.0) and r["copy_gb_per_s"] == pytest.approx(10.0)
    assert r["tokens_per_s"]["16"] == pytest.approx(8 * 16 / 0.030)
    assert (
        train_benchmark._result({"1": rows["1"]}, 2, (2e11, 1e10, 5e9), cfg, 8, 16)["ratio_16_to_1"]
        is None
    )


def test_each_suite_repeats_as_the_launchers_usage_says():
    """`python launch/benchmark.py SUITE` with no --repeats runs each suite's default: the
    usage lines of the launcher's docstring say how many (a pass of the corpus is one)."""
    usage = (Path(__file__).parents[2] / "launch" / "benchmark.py").read_text()
    said = {
        m.group(1): 1 if m.group(2) == "one pass" else int(m.group(3))
        for m in re.finditer(r"benchmark\.py (\w+) .*\((one pass|(\d+) repeats?)\)", usage)
    }
    assert set(said) == set(benchmarks.SUITES)
    for name, suite in benchmarks.SUITES.items():
        assert inspect.signature(suite).parameters["repeats"].default == said[name], name


def test_synergy_suite_defaults_are_the_papers_sizes():
    """docs/benchmarks.md: one 16-head checkpoint on 50 sequences of the paper's length
    (100 tokens) in its 4 layers, the sizes `model.ModelConfig` defaults to."""
    defaults = {
        name: p.default
        for name, p in inspect.signature(synergy_benchmark.synergy_suite).parameters.items()
    }
    assert defaults == {"repeats": 1, "sequences": 50, "heads": 16, "t": 100, "layers": 4}
    paper = model.ModelConfig()
    assert (defaults["t"], defaults["layers"]) == (paper.max_len, paper.num_layers)


def test_synergy_suite_evaluates_a_model_of_the_sizes_it_is_given(capsys, monkeypatch):
    """Every part of the suite works on one model of the asked head count, layers and
    length, with parameters of that shape placed as `evaluate` places them (on every
    device: the parts then run the whole evaluation's programs), on the asked number of
    sequences of `t` tokens (the analyses themselves replaced by recorders)."""
    seen = []

    def record(part, result):
        def call(*args):
            seen.append((part, *args))
            return result

        return call

    evaluate = synergy_benchmark.evaluate
    monkeypatch.setattr(evaluate, "per_sequence", record("per_sequence", None))
    monkeypatch.setattr(evaluate, "forward", record("forward", (None, "attn", "weights")))
    monkeypatch.setattr(evaluate, "optimal_mixes", record("optimal_mixes", None))
    monkeypatch.setattr(evaluate, "evaluate_params", record("evaluate_params", None))
    pruning = synergy_benchmark.pruning_curves
    monkeypatch.setattr(pruning, "pruning_curves", record("pruning_curves", None))
    monkeypatch.setattr(synergy_benchmark, "matmul_flops_per_s", lambda repeats: 1e9)
    # Sizes all different, so that one given for another shows (the analysis test's).
    synergy_benchmark.synergy_suite(repeats=1, sequences=3, heads=2, t=16, layers=1)
    assert capsys.readouterr().out.startswith("2 heads, 3 sequences of 16 tokens")
    want = model.ModelConfig(num_heads=2, num_layers=1, max_len=16)
    shapes = jax.tree.map(
        np.shape, model.init_params(model.Transformer(want), jax.random.PRNGKey(0))
    )
    everywhere = parallel.replicated(parallel.data_mesh(jax.local_devices()))
    # Each part twice (its first call, then the timed one); pruning runs its own forward.
    parts = 2 * ["per_sequence"] + 2 * ["forward", "optimal_mixes"]
    parts += 2 * ["forward", "pruning_curves"] + 2 * ["evaluate_params"]
    assert [call[0] for call in seen] == parts
    for part, *args in seen:
        if part != "optimal_mixes":  # (module, params, examples or their inputs, ...)
            module, params, data = args[:3]
            assert module.config == want, part
            assert jax.tree.map(np.shape, params) == shapes, part
            placed = [
                p.sharding.is_equivalent_to(everywhere, p.ndim) for p in jax.tree.leaves(params)
            ]
            assert all(placed), part
            assert np.shape(getattr(data, "inputs", data)) == (3, 16), part
        if part in {"optimal_mixes", "pruning_curves", "evaluate_params"}:  # spec last
            assert args[-1].num_sequences == 3, part
    # Both parts' forward passes read one input, split over the devices as the evaluation
    # splits it (a device array, not the host batch): the whole evaluation's program.
    inputs = [args[2] for part, *args in seen if part == "forward"]
    assert all(x is inputs[0] for x in inputs) and isinstance(inputs[0], jax.Array)
