"""The base config, the `key=value` argument parser, and validation of configs."""

import pytest

from beyondpar.study import config_lib


def small_config(batch_size=8, num_train=8):
    config = config_lib.base_config()
    config.task.seq_len = 12
    config.model.max_len = 12
    config.optim.batch_size = batch_size
    config.task.num_train = num_train
    return config


def test_parse_arg_types_values_like_their_defaults():
    """Values are converted to the default's type; a bare boolean key or an empty value
    switches the flag on, and 'no' / 'false' / '0' switch it off."""
    args = config_lib.parse_arg(
        "fast=,plots=no,verbose,seed=3,rate=0.5,task=cycle",
        fast=False,
        plots=True,
        verbose=False,
        quiet=True,
        seed=0,
        rate=1.0,
        task="copy",
    )
    assert args.fast is True
    assert args.plots is False
    assert args.verbose is True
    assert args.quiet is True  # untouched default
    assert args.seed == 3 and isinstance(args.seed, int)
    assert args.rate == 0.5 and args.task == "cycle"
    for text, expected in (
        ("1", True),
        ("yes", True),
        ("TRUE", True),
        ("0", False),
        ("off", False),
    ):
        assert config_lib.parse_arg(f"flag={text}", flag=False).flag is expected
        assert config_lib.parse_arg(f"flag={text}", flag=True).flag is expected
    assert config_lib.parse_arg("flag=on", flag=False).flag is True
    with pytest.raises(ValueError, match=r"must be one of \['flag'\], got 'flg'"):
        config_lib.parse_arg("flg=1", flag=False)


@pytest.mark.parametrize(
    "arg,message",
    [
        ("flag=ture", r"config argument flag must be one of \[.*'off'\], got 'ture'"),
        ("heads=four", r"config argument heads must be an integer, got 'four'"),
        ("heads=", r"config argument heads must be an integer, got ''"),
        ("heads=2.0", r"config argument heads must be an integer, got '2.0'"),
        ("rate=fast", r"config argument rate must be a number, got 'fast'"),
    ],
)
def test_parse_arg_names_a_value_its_type_cannot_take(arg, message):
    """A misspelt flag word or a number that does not parse is an error naming the
    argument and the value: it must not quietly turn a flag off or crash without a name."""
    with pytest.raises(ValueError, match=message):
        config_lib.parse_arg(arg, flag=True, heads=4, rate=1.0)


def test_run_config_names_a_bad_head_count():
    with pytest.raises(ValueError, match="config argument heads must be an integer, got 'x'"):
        config_lib.run_config("heads=x")


def test_run_config_overrides_task_heads_and_seed():
    """The family arguments land in the right fields; the rest stays the paper's setup."""
    config = config_lib.run_config("task=cycle,heads=8,seed=7")
    assert (config.task.name, config.model.num_heads, config.seed) == ("cycle", 8, 7)
    assert config.model.embed_dim == 64 and config.task.seq_len == 100
    default = config_lib.run_config()
    assert (default.task.name, default.model.num_heads, default.seed) == ("copy", 4, 0)


def test_validate_accepts_exactly_one_batch_of_training_data():
    """num_train equal to the batch size makes one full batch per epoch, which is
    runnable; one example fewer cannot fill a single batch."""
    config_lib.validate(small_config(batch_size=8, num_train=8))
    config_lib.validate(small_config(batch_size=8, num_train=9))
    with pytest.raises(ValueError, match=r"task.num_train must be >= optim.batch_size=8, got 7"):
        config_lib.validate(small_config(batch_size=8, num_train=7))


def test_validate_seq_len_against_max_len():
    """A sequence as long as the positional table is fine; one longer is not."""
    config = small_config()
    config_lib.validate(config)
    config.task.seq_len = 13
    with pytest.raises(ValueError, match=r"task.seq_len must be <= model.max_len=12, got 13"):
        config_lib.validate(config)


@pytest.mark.parametrize(
    "path",
    [
        "optim.learning_rate",
        "optim.batch_size",
        "optim.num_epochs",
        "task.num_eval",
        "eval_every_steps",
        "log_every_steps",
        "checkpoint_every_steps",
        "keep_checkpoints",
    ],
)
def test_validate_rejects_zero_for_settings_that_must_be_positive(path):
    """A zero learning rate never moves the weights, and a zero batch, epoch count,
    evaluation size, interval or checkpoint count leaves nothing to run or keep: each is
    refused with its name, while the small config itself is valid."""
    config = small_config()
    config_lib.validate(config)
    *parents, leaf = path.split(".")
    node = config
    for name in parents:
        node = node[name]
    node[leaf] = type(node[leaf])(0)
    expected = "a finite number > 0" if path == "optim.learning_rate" else "an integer >= 1"
    with pytest.raises(ValueError, match=rf"{path} must be {expected}, got 0"):
        config_lib.validate(config)


@pytest.mark.parametrize("path", ["model.vocab_size", "task.seq_len"])
def test_validate_refuses_sizes_no_task_can_be_made_at(path):
    """One token or one position leaves nothing to tell apart or to predict; the task
    generators refuse both, so the config is refused before a run writes anything."""
    config = small_config()
    section, leaf = path.split(".")
    config[section][leaf] = 2
    config_lib.validate(config)
    config[section][leaf] = 1
    with pytest.raises(ValueError, match=rf"^{path} must be an integer >= 2, got 1$"):
        config_lib.validate(config)


@pytest.mark.parametrize(
    "source, problem",
    [
        ("def get_config():\n    return 1 / 0\n", "raised ZeroDivisionError: division by zero"),
        ("def get_config(:\n", "has a syntax error: invalid syntax (c.py, line 1)"),
        ("x = 1\n", "defines no get_config()"),
        (
            "def get_config():\n    return None.steps\n",
            "raised AttributeError: 'NoneType' object has no attribute 'steps'",
        ),
    ],
    ids=["raises", "syntax_error", "no_get_config", "raises_attribute_error"],
)
def test_load_config_file_names_a_file_that_does_not_load(tmp_path, source, problem):
    (tmp_path / "c.py").write_text(source)
    with pytest.raises(ValueError) as err:
        config_lib.load_config_file(tmp_path / "c.py")
    assert str(err.value) == f"base config file '{tmp_path / 'c.py'}' {problem}"
