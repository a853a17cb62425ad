"""The config every experiment family starts from, and the `get_config(arg)` parser.

Configs are data: files in configs/ only override fields of `base_config()`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import ml_collections

from beyondpar import metrics, tasks
from beyondpar import model as model_lib
from beyondpar.base import checks, cli
from beyondpar.lm import data as data_lib


def base_config() -> ml_collections.ConfigDict:
    """The paper's setup (5,000 samples, batch 50, 200 epochs, Adam 1e-3, T = 100)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = ml_collections.ConfigDict(
        dict(
            vocab_size=256,
            embed_dim=64,
            num_layers=4,
            num_heads=4,
            mlp_dim=128,
            max_len=100,
            dropout_rate=0.1,
            norm_eps=model_lib.FLOAT32_EPS,
        )
    )
    c.task = ml_collections.ConfigDict(
        dict(name="copy", seq_len=100, lag=1, num_train=5000, num_eval=500)
    )
    c.optim = ml_collections.ConfigDict(dict(learning_rate=1e-3, batch_size=50, num_epochs=200))
    c.eval_every_steps = 1000
    c.log_every_steps = 100
    c.checkpoint_every_steps = 1000
    c.keep_checkpoints = 3
    c.progress_bar = True
    # Several processes: set num_processes > 1 (or JAX_COORDINATOR_ADDRESS in the env).
    c.distributed = ml_collections.ConfigDict(
        dict(coordinator_address="", num_processes=1, process_id=0)
    )
    # What evaluation of the run's checkpoints measures; optimal_weights and pruning switch
    # off the costlier analyses (the optimal-weight search and the pruning curves); the
    # optimal weights are scored on `folds` folds of the sequences, each searched on the rest.
    # coalitions: every coalition of each layer's heads as a game (fidelity and loss).
    c.evaluation = ml_collections.ConfigDict(
        dict(
            num_sequences=50,
            seed=1234,
            horizon=100,
            max_steps=100,
            eps=0.25,
            walk="reference",
            optimal_weights=True,
            pruning=True,
            folds=2,
            coalitions=False,
        )
    )
    return c


def base_text_config() -> ml_collections.ConfigDict:
    """Fields of every language-model run; `configs/lm.py` sets a named size over them."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.size = "cpu"
    c.model = base_config().model
    c.model.dropout_rate = 0.0
    c.data = data_lib.default_data_config()
    c.seq_len = 128
    c.compute_dtype = "auto"  # bfloat16 on accelerators, float32 on CPU
    c.optim = ml_collections.ConfigDict(
        dict(
            learning_rate=3e-3,
            min_learning_rate_ratio=0.1,  # the cosine ends at this share of the peak
            warmup_steps=50,
            steps=600,
            batch_size=32,
            microbatches=1,  # gradient accumulation: the batch in this many slices
            weight_decay=0.1,
            beta1=0.9,
            beta2=0.95,
            clip_norm=1.0,
        )
    )
    c.eval_every_steps = 100
    c.log_every_steps = 20
    c.checkpoint_every_steps = 100
    c.keep_checkpoints = 3
    c.progress_bar = True
    c.distributed = base_config().distributed
    # Held-out loss on `heldout_windows` fixed windows; the graph measures on the first
    # `graph_windows` of them, cut to `graph_tokens` tokens (the cost is O(T^2) per head).
    c.evaluation = ml_collections.ConfigDict(
        dict(
            heldout_windows=64,
            graph_windows=8,
            graph_tokens=128,
            horizon=100,
            max_steps=100,
            eps=0.25,
            folds=2,
        )
    )
    return c


def run_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`base_config()` with the arguments every family takes: 'task=cycle,heads=8,seed=1'."""
    args = parse_arg(arg, task="copy", heads=4, seed=0)
    config = base_config()
    config.task.name = args.task
    config.model.num_heads = args.heads
    config.seed = args.seed
    return config


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
    """'heads=8,task=cycle' -> ConfigDict, typed like `defaults`; unknown keys are errors."""
    out = ml_collections.ConfigDict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        checks.one_of("config argument", key, sorted(defaults))
        out[key] = _typed(key, value if sep else None, defaults[key])
    return out


_TRUE, _FALSE = ("", "1", "true", "yes", "on"), ("0", "false", "no", "off")


def _typed(key: str, value: str | None, default):
    """`value` as the type of `default`; a bare boolean key (`value` None) is True. A word
    that is neither true nor false, or a number that does not parse, is an error: a typo
    must not silently turn a flag off."""
    if isinstance(default, bool):
        word = "" if value is None else value.lower()
        if word not in _TRUE + _FALSE:
            raise ValueError(
                f"config argument {key} must be one of {list(_TRUE + _FALSE)}, got {value!r}"
            )
        return word in _TRUE
    try:
        return type(default)(value)
    except (TypeError, ValueError):
        kind = {int: "an integer", float: "a number"}.get(type(default), type(default).__name__)
        raise ValueError(f"config argument {key} must be {kind}, got {value!r}") from None


def model_config(config: ml_collections.ConfigDict) -> model_lib.ModelConfig:
    """The frozen hyperparameters a model gets (never the ConfigDict itself)."""
    return model_lib.ModelConfig(**config.model.to_dict())


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise ValueError for a config that cannot run, before any work starts."""
    cfg = model_config(config)
    task = config.task
    checks.one_of("task.name", task.name, tasks.TASKS)
    checks.integer_at_least("model.vocab_size", cfg.vocab_size, tasks.MIN_VOCAB_SIZE)
    checks.integer_at_least("task.seq_len", task.seq_len, tasks.MIN_SEQ_LEN)
    tasks.check(task.name, task.seq_len, cfg.vocab_size, task.lag)
    if task.seq_len > cfg.max_len:
        raise ValueError(f"task.seq_len must be <= model.max_len={cfg.max_len}, got {task.seq_len}")
    if task.num_train < config.optim.batch_size:
        raise ValueError(
            f"task.num_train must be >= optim.batch_size={config.optim.batch_size}, "
            f"got {task.num_train}"
        )
    checks.positive_number("optim.learning_rate", config.optim.learning_rate)
    counts = {
        "optim.batch_size": config.optim.batch_size,
        "optim.num_epochs": config.optim.num_epochs,
        "task.num_eval": task.num_eval,
        "eval_every_steps": config.eval_every_steps,
        "log_every_steps": config.log_every_steps,
        "checkpoint_every_steps": config.checkpoint_every_steps,
        "keep_checkpoints": config.keep_checkpoints,
    }
    for name, value in counts.items():
        checks.positive_int(name, value)
    validate_evaluation(config.evaluation)


def validate_evaluation(evaluation: ml_collections.ConfigDict) -> None:
    """The `evaluation` block, checked when the config is made rather than after training."""
    e = evaluation
    for name in ("num_sequences", "horizon", "max_steps", "folds"):
        checks.positive_int(f"evaluation.{name}", e[name])
    checks.open_unit_interval("evaluation.eps", e.eps)
    checks.one_of("evaluation.walk", e.walk, metrics.WALKS)
    for name in ("optimal_weights", "pruning", "coalitions"):
        checks.boolean(f"evaluation.{name}", e[name])


def load_config_file(path: str | os.PathLike, arg: str | None = None) -> ml_collections.ConfigDict:
    """`get_config(arg)` of a config file, as config_flags would load it."""
    path = Path(path)
    if not path.is_file():
        raise checks.path_error(path, f"base config must be an existing file, got {str(path)!r}")
    spec = importlib.util.spec_from_file_location(f"_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        return module.get_config(arg) if arg else module.get_config()
    except Exception as err:  # noqa: BLE001 - whatever the file raised, named with the file
        raise ValueError(f"base {cli.load_problem(path, err)}") from err
