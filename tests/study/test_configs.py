"""The config files hold the settings the README and the paper state: the paper's run, the
CPU default, and the ablation's task presets."""

from pathlib import Path

import pytest

from beyondpar.study import ablation, config_lib

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def load(name, arg=None):
    return config_lib.load_config_file(CONFIGS / f"{name}.py", arg)


def test_paper_config_is_the_papers_setup():
    """5,000 samples, batch 50, 200 epochs, Adam 1e-3, T = 100; d 64, 4 layers, vocab 256."""
    config = load("paper", "task=cycle,heads=16,seed=3")
    assert config.task.name == "cycle"
    assert config.model.num_heads == 16
    assert config.seed == 3
    assert config.model.embed_dim == 64
    assert config.model.num_layers == 4
    assert config.model.vocab_size == 256
    assert config.task.seq_len == 100
    assert config.task.num_train == 5000
    assert config.optim.batch_size == 50
    assert config.optim.num_epochs == 200
    assert config.optim.learning_rate == pytest.approx(1e-3, rel=1e-12)
    # 100 steps an epoch: 20,000 optimiser steps in the paper's run.
    steps = config.task.num_train // config.optim.batch_size * config.optim.num_epochs
    assert steps == 20_000
    config_lib.validate(config)


def test_cpu_config_is_the_documented_shortening():
    """The CPU default keeps the paper's model and shortens the data and training: 32 tokens,
    1,000 samples, batch 48, 20 epochs = 400 steps, Adam at 1e-2 (fast enough to converge in
    400 steps, which 1e-3 is not)."""
    config = load("cpu", "task=induction,heads=8,seed=2")
    assert (config.task.name, config.model.num_heads, config.seed) == ("induction", 8, 2)
    assert config.model.embed_dim == 64
    assert config.model.num_layers == 4
    assert config.task.seq_len == 32
    assert config.task.num_train == 1000
    assert config.optim.batch_size == 48
    assert config.optim.num_epochs == 20
    assert config.optim.learning_rate == pytest.approx(1e-2, rel=1e-12)
    steps = config.task.num_train // config.optim.batch_size * config.optim.num_epochs
    assert steps == 400
    for cores in (2, 3, 4, 6, 8):
        assert config.optim.batch_size % cores == 0
    config_lib.validate(config)


def test_cpu_config_differs_from_the_paper_only_where_documented():
    """Same model and task defaults as the paper's; the optimiser is ten times faster."""
    paper, cpu = load("paper", "heads=1"), load("cpu", "heads=1")
    assert cpu.model.to_dict() == paper.model.to_dict()
    assert cpu.optim.learning_rate == pytest.approx(10 * paper.optim.learning_rate)
    assert cpu.task.num_train * 5 == paper.task.num_train


@pytest.mark.parametrize(
    "preset, tasks",
    [
        ("paper", {"copy", "cycle"}),
        ("demo", {"cycle", "induction"}),
        ("attention", {"cycle", "shift", "pair_sum", "induction"}),
    ],
)
def test_ablation_task_presets(preset, tasks):
    """Each preset trains the tasks the README names for it, at heads 1/4/8/16, per seed."""
    config = load("ablation", f"tasks={preset},seeds=3")
    points = ablation.grid(config)
    assert {p["task"] for p in points} == tasks
    assert {p["heads"] for p in points} == {1, 4, 8, 16}
    assert {p["seed"] for p in points} == {0, 1, 2}
    assert len(points) == len(tasks) * 4 * 3


def test_demo_preset_tasks_all_need_attention():
    """The demo studies tasks that need attention only: the copy task does not."""
    config = load("ablation", "tasks=demo")
    assert "copy" not in set(config.levels.task)
    assert set(config.levels.task) <= set(load("ablation", "tasks=attention").levels.task)


def test_ablation_on_the_paper_base_runs_the_papers_optimiser():
    """`base=paper` points every run of the grid at the paper's settings."""
    config = load("ablation", "base=paper,tasks=demo")
    points = ablation.grid(config)
    run = ablation.run_config(config, points[-1])
    assert run.task.seq_len == 100
    assert run.optim.learning_rate == pytest.approx(1e-3, rel=1e-12)
    assert run.optim.batch_size == 50
    assert run.model.num_heads == points[-1]["heads"]
    assert run.task.name == points[-1]["task"]
