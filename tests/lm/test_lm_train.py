"""Language-model training on text: configs, schedule, bits per byte, a short run that
learns, its TensorBoard events and resumption, and a 12-step run whose logged numbers are
recomputed from its checkpoint, schedule and event files. The two runs share one model
and graph settings, so the second reuses the first's programs (one process per file)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from beyondpar import checkpoints
from beyondpar import model as model_lib
from beyondpar.base import locks
from beyondpar.lm import data as data_lib
from beyondpar.study import (
    ablation,
    config_lib,
    runs,
    text_config,
    text_graphs,
    text_optim,
    text_report,
    text_step,
    train,
)
from beyondpar.study import workdir as workdir_lib
from configs import lm, lm_ablation
from helpers.lm_training import tiny_config

ROOT = Path(__file__).resolve().parents[2]
GRAPH_WINDOWS = 2  # the attention graphs of 2 held-out windows: the measures' cost is per window


def run_config():
    """The tiny config with its graphs measured on fewer windows (the killed run's too)."""
    config = tiny_config()
    config.evaluation.graph_windows = GRAPH_WINDOWS
    return config


def test_lm_train_refuses_a_changed_experiment_before_writing_or_building(tmp_path, monkeypatch):
    """A workdir of another experiment (another seed) is refused before the corpus is
    tokenized into it and before the model is initialised."""
    workdir_lib.prepare(tmp_path, tiny_config(), 0)
    held = {p.name for p in tmp_path.iterdir()}
    changed = tiny_config()
    changed.seed += 1

    def no_model(*args, **kwargs):
        raise AssertionError("the model was built for a refused resume")

    monkeypatch.setattr(train, "create_state", no_model)
    with pytest.raises(ValueError, match=r"holds another experiment.*seed"):
        runs.train_and_evaluate(changed, str(tmp_path))
    # Only the lock the run takes on its workdir; no tokens folder, no other file.
    assert {p.name for p in tmp_path.iterdir()} == held | {locks.LOCK_FILE}


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lm") / "run"
    runs.train_and_evaluate(run_config(), str(workdir))
    return workdir


def test_lm_train_named_sizes_have_equal_parameters_at_every_head_count():
    for size in lm.SIZES:
        counts = set()
        for heads in text_config.SWEEP_HEADS:
            config = lm.get_config(f"heads={heads},size={size}")
            module = model_lib.Transformer(model_lib.ModelConfig(**config.model.to_dict()))
            shapes = jax.eval_shape(
                lambda m=module, c=config: model_lib.init_params(
                    m, jax.random.PRNGKey(0), c.seq_len
                )
            )
            counts.add(model_lib.count_params(shapes))
            assert module.config.head_dim * heads == config.model.embed_dim
        assert len(counts) == 1, (size, counts)


def test_lm_train_config_arguments_and_errors():
    config = lm.get_config("heads=8,seed=3,size=gpu")
    assert (config.model.num_heads, config.seed, config.size) == (8, 3, "gpu")
    assert config.model.embed_dim == 768 and config.model.num_layers == 12
    assert config.data.path == "" and config.optim.steps > 0
    with pytest.raises(ValueError, match="size must be one of"):
        lm.get_config("size=huge")
    bad = lm.get_config()
    bad.optim.microbatches = 5
    with pytest.raises(ValueError, match="optim.microbatches must divide optim.batch_size=32"):
        text_config.validate(bad)


def test_lm_train_schedule_warms_up_linearly_then_decays_by_cosine():
    s = text_optim.OptimSettings.from_config(tiny_config(steps=110, warmup_steps=10).optim)
    lr = text_optim.schedule(s)
    assert float(lr(0)) == 0.0
    np.testing.assert_allclose(float(lr(5)), 0.5e-2, rtol=1e-6)
    np.testing.assert_allclose(float(lr(10)), 1e-2, rtol=1e-6)
    # Half-way through the decay: the mean of peak and floor (a tenth of the peak).
    np.testing.assert_allclose(float(lr(60)), (1e-2 + 1e-3) / 2, rtol=1e-5)
    np.testing.assert_allclose(float(lr(110)), 1e-3, rtol=1e-5)


def test_lm_train_bits_per_byte_is_nats_over_ln2_over_bytes_per_token():
    text = types.SimpleNamespace(bytes_per_token=1.0)
    assert data_lib.bits_per_byte(math.log(2), text) == pytest.approx(1.0)
    text.bytes_per_token = 4.0
    assert data_lib.bits_per_byte(2.0, text) == pytest.approx(2.0 / math.log(2) / 4.0)


PEAK = 1e12  # a made-up chip peak, so that the CPU run logs its utilisation


def interval_run_config():
    """12 steps whose lines, evaluations and checkpoints fall on different steps; the
    tiny model and graph settings of `run_config`, so the two runs share their programs."""
    config = tiny_config(steps=12, warmup_steps=4)
    config.log_every_steps = 4
    config.eval_every_steps = 6
    config.checkpoint_every_steps = 6
    # 70 held-out windows: more than one padded chunk of 64 over the devices.
    config.evaluation.update(heldout_windows=70, graph_windows=2, graph_tokens=16)
    return config


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lm_intervals") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(text_config, "peak_flops", lambda kind: PEAK)
        runs.train_and_evaluate(interval_run_config(), str(workdir))
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return workdir, [json.loads(line) for line in lines]


def closed_form_lr(t, peak, floor_ratio, warmup, steps):
    if t < warmup:
        return peak * t / warmup
    cosine = (1 + math.cos(math.pi * (t - warmup) / (steps - warmup))) / 2
    return peak * (floor_ratio + (1 - floor_ratio) * cosine)


def test_lm_train_documented_optimiser_defaults():
    o = config_lib.base_text_config().optim
    assert (o.beta2, o.weight_decay, o.min_learning_rate_ratio, o.clip_norm) == (
        0.95,
        0.1,
        0.1,
        1.0,
    )
    s = text_optim.OptimSettings.from_config(tiny_config(steps=40, warmup_steps=7).optim)
    lr = text_optim.schedule(s)
    for t in (0, 1, 6, 7, 8, 20, 39, 40):
        want = closed_form_lr(t, 1e-2, 0.1, 7, 40)
        np.testing.assert_allclose(float(lr(t)), want, rtol=1e-5, atol=1e-9)


def read_metrics(workdir):
    return [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def unigram_entropy_nats(tokens: np.ndarray) -> float:
    counts = np.bincount(tokens.ravel(), minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def test_lm_train_short_run_learns_below_the_unigram_entropy(text_run):
    config = tiny_config()
    text_data = data_lib.load(config.data, config.seed)
    unigram = unigram_entropy_nats(np.asarray(text_data.train_stream))
    records = read_metrics(text_run)
    assert [r["step"] for r in records] == list(range(25, 151, 25))
    last = records[-1]
    assert last["eval/loss"] < unigram - 0.4, (last["eval/loss"], unigram)
    assert last["eval/bits_per_byte"] == pytest.approx(
        last["eval/loss"] / math.log(2) / text_data.bytes_per_token
    )
    for name in ("best_head_fidelity", "fidelity_learned", "fidelity_optimal", "sink_mass"):
        assert 0.0 <= last[f"layer2/{name}"] <= 1.0
    assert 0.0 <= last["layer1/wins_uniform"] <= 1.0
    assert records[0]["train/learning_rate"] == pytest.approx(
        1e-2 * (1 + 0.1) / 2 + 1e-2 * (1 - 0.1) / 2 * math.cos(math.pi * 14 / 140)
    )


def test_lm_train_tensorboard_events_read_back(text_run):
    acc = event_accumulator.EventAccumulator(str(text_run))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    wanted = {
        "train/loss",
        "train/learning_rate",
        "train/grad_norm",
        "tokens_per_s",
        "eval/loss",
        "eval/bits_per_byte",
        "layer1/best_head_fidelity",
        "layer2/fidelity_optimal",
        "layer2/wins_learned",
        "layer1/sink_mass",
    }
    assert wanted <= tags, wanted - tags
    bpb = acc.Scalars("eval/bits_per_byte")
    assert [e.step for e in bpb] == [75, 150]
    last = read_metrics(text_run)[-1]
    assert bpb[-1].value == pytest.approx(last["eval/bits_per_byte"], rel=1e-6)


KILLED_RUN = """
import sys, jax
jax.config.update("jax_num_cpu_devices", 4)
from beyondpar.study import runs
from helpers.lm_training import tiny_config
config = tiny_config()
config.evaluation.graph_windows = int(sys.argv[2])
runs.train_and_evaluate(config, sys.argv[1])
"""


def test_lm_train_resume_after_kill_9_gives_identical_parameters(text_run, tmp_path):
    """A run killed (SIGKILL) once its step-50 checkpoint is on disk, then started
    again, ends with the uninterrupted run's parameters and metrics lines."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, str(tmp_path), str(GRAPH_WINDOWS)], env=env, cwd=ROOT
    )
    deadline = time.monotonic() + 240
    while not checkpoints.list_steps(tmp_path / "checkpoints") and time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before its first checkpoint"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert checkpoints.list_steps(tmp_path / "checkpoints")[-1] < 150
    runs.train_and_evaluate(run_config(), str(tmp_path))
    step, resumed = checkpoints.load(Path(tmp_path) / "checkpoints")
    step_full, full = checkpoints.load(text_run / "checkpoints")
    assert step == step_full == 150
    jax.tree.map(np.testing.assert_array_equal, resumed["params"], full["params"])
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == list(range(25, 151, 25))


def test_lm_train_ablation_grid_commands_and_report(tmp_path):
    config = lm_ablation.get_config("seeds=2")
    commands = ablation.dry_run(config, tmp_path)
    assert len(commands) == 5 * 2
    assert "configs/lm.py:size=cpu" in commands[0] and "--config.model.num_heads=1" in commands[0]
    configs = ablation.validated_configs(config)
    for i, (name, run) in enumerate(configs.items()):
        values = {"eval/bits_per_byte": 2.0 + i, "eval/loss": 1.0}
        for layer in (1, 2, 3, 4):
            values.update({f"layer{layer}/{key}": 0.5 for key, _ in text_report.LAYER_MEASURES})
        (tmp_path / name).mkdir()
        line = json.dumps({"step": run.optim.steps, **values})
        (tmp_path / name / "metrics.jsonl").write_text(line + "\n")
    report, _ = text_report.write_report(tmp_path, configs, tmp_path / "report", [])
    text = report.read_text()
    steps = lm.get_config().optim.steps
    assert f"| 1 | 2 | 2.500 ± 0.500 | {steps} |" in text
    assert "| layer | H=1 | H=2 | H=4 | H=8 | H=16 |" in text


def test_lm_train_documented_throughput_is_the_flops_estimate():
    """configs/lm.py's expected tokens/s: 40% of the named chips' peak over the training
    FLOPs per token of each size's model."""
    chips = {"gpu": ("NVIDIA H100 80GB HBM3", 1), "gpu8": ("H100", 8), "tpu": ("TPU v5 lite", 16)}
    for size, (kind, devices) in chips.items():
        config = lm.get_config(f"size={size}")
        assert lm.SIZES[size]["devices"] == devices
        cfg = model_lib.ModelConfig(**config.model.to_dict())
        rate = text_config.expected_tokens_per_second(
            cfg, config.seq_len, text_config.peak_flops(kind), devices
        )
        written = f"{rate:.1e}".replace("e+0", "e")  # 6.3e5
        assert f"about {written} tokens/s" in lm.__doc__.replace("\n        ", " "), (size, rate)
    assert text_config.peak_flops("cpu") is None


def test_lm_train_run_logs_at_its_intervals_and_the_schedules_rate(short_run):
    _, records = short_run
    assert [r["step"] for r in records] == [4, 6, 8, 12]
    assert [r["step"] for r in records if "eval/loss" in r] == [6, 12]
    for r in records:
        want = closed_form_lr(r["step"] - 1, 1e-2, 0.1, 4, 12)
        assert r["train/learning_rate"] == pytest.approx(want, rel=1e-5)


def test_lm_train_run_logs_flops_utilisation(short_run):
    _, records = short_run
    config = interval_run_config()
    fpt = text_config.flops_per_token(config_lib.model_config(config), config.seq_len)
    for r in records:
        assert r["tokens_per_s"] == pytest.approx(r["steps_per_s"] * 16 * 32, rel=1e-6)
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * fpt / (PEAK * jax.device_count()))


def test_lm_train_run_evaluation_recomputed_from_its_checkpoint(short_run):
    workdir, records = short_run
    config = interval_run_config()
    step, state = checkpoints.load(workdir / "checkpoints")
    assert step == 12
    params = state["params"]
    text_data = data_lib.load(config.data, config.seed, cache_dir=str(workdir))
    heldout = np.asarray(text_data.heldout_windows(70, config.seq_len))
    module = model_lib.Transformer(config_lib.model_config(config))
    # Jitted: one program for the 70 windows at once (the run's went in padded chunks).
    nats = jax.jit(text_step.window_nats, static_argnums=0)(module, params, heldout)
    nats = np.asarray(nats, np.float64)
    last = records[-1]
    assert last["eval/loss"] == pytest.approx(nats.sum() / (70 * 32), rel=1e-5)
    bpb = last["eval/loss"] / math.log(2) / text_data.bytes_per_token
    assert last["eval/bits_per_byte"] == pytest.approx(bpb, rel=1e-9)
    windows = text_graphs.graph_windows(heldout, config.evaluation)
    measures = text_graphs.graph_measures(module, params, windows, config.evaluation)
    assert set(measures) <= set(last) and "layer2/sink_mass" in measures
    for name, value in measures.items():
        assert last[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name


def test_lm_train_run_events_match_the_metrics_lines(short_run):
    workdir, records = short_run
    acc = event_accumulator.EventAccumulator(str(workdir))
    acc.Reload()
    for r in records:
        for name, value in r.items():
            if name == "step" or not isinstance(value, float):
                continue
            events = {e.step: e.value for e in acc.Scalars(name)}
            assert events[r["step"]] == pytest.approx(value, rel=1e-6), (name, r["step"])
