"""config.json fields read with errors that name the field and the value."""

import pytest

from beyondpar.pretrained import config_fields


def test_integer_fields_must_be_at_least_one():
    assert config_fields.field({"num_hidden_layers": 1}, "num_hidden_layers") == 1
    with pytest.raises(ValueError, match=r"'num_hidden_layers' must be an integer >= 1, got 0"):
        config_fields.field({"num_hidden_layers": 0}, "num_hidden_layers")


def test_number_fields_refuse_booleans():
    assert config_fields.field({"rope_theta": 10}, "rope_theta", float) == 10.0
    with pytest.raises(ValueError, match=r"'rope_theta' must be a number, got True"):
        config_fields.field({"rope_theta": True}, "rope_theta", float)


def test_positive_number_refuses_zero_and_allows_null_only_when_nullable():
    assert config_fields.positive_number({"w": 0.5}, "w") == 0.5
    assert config_fields.positive_number({"w": None}, "w", nullable=True) is None
    with pytest.raises(ValueError, match=r"'w' must be a number > 0, got 0"):
        config_fields.positive_number({"w": 0}, "w")
    with pytest.raises(ValueError, match=r"'w' must be a number > 0 or null, got 0"):
        config_fields.positive_number({"w": 0}, "w", nullable=True)


def test_integer_fields_refuse_booleans():
    with pytest.raises(ValueError, match=r"'num_hidden_layers' must be an integer >= 1, got True"):
        config_fields.field({"num_hidden_layers": True}, "num_hidden_layers")


def test_positive_number_missing_or_null_is_refused_unless_nullable():
    with pytest.raises(ValueError, match=r"'w' must be a number > 0, got None"):
        config_fields.positive_number({"w": None}, "w")
    with pytest.raises(ValueError, match=r"'w' must be a number > 0, got None"):
        config_fields.positive_number({}, "w")
    assert config_fields.positive_number({}, "w", nullable=True) is None
