"""Settings comparison: a rerun may change only the fields it is allowed to."""

from __future__ import annotations

import json

import pytest

from beyondpar.base import settings


def test_refuse_changes_allows_only_free_fields():
    """A rerun may change the fields `free` allows (returned, old -> new); changing any
    other field is refused, naming exactly those fields and not the free ones."""
    old = {"model": {"heads": 4, "layers": 2}, "train": {"steps": 100}}
    new = {"model": {"heads": 4, "layers": 2}, "train": {"steps": 300}}
    free = lambda field: field == "train.steps"
    assert settings.refuse_changes(old, new, "w", "advice", free) == {"train.steps": (100, 300)}
    changed = {"model": {"heads": 8, "layers": 2}, "train": {"steps": 300}}
    with pytest.raises(ValueError) as err:
        settings.refuse_changes(old, changed, "workdir w was made with other settings", "x", free)
    assert str(err.value) == "workdir w was made with other settings (model.heads: 4 -> 8); x"


def test_refuse_changes_compares_settings_as_saved_in_json():
    """Settings read back from JSON hold lists where the new run holds tuples; equal
    values are no change, and a real change is named in its JSON form."""
    saved = json.loads(json.dumps({"spec": {"layers": (0, 2), "residual": 0.5}}))
    assert (
        settings.refuse_changes(saved, {"spec": {"layers": (0, 2), "residual": 0.5}}, "w", "x")
        == {}
    )
    with pytest.raises(ValueError) as err:
        settings.refuse_changes(saved, {"spec": {"layers": (0,), "residual": 0.5}}, "w", "x")
    assert str(err.value) == "w (spec.layers: [0, 2] -> [0]); x"
