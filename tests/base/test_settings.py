"""Settings comparison: a rerun may change only the fields it is allowed to."""

from __future__ import annotations

import json

import pytest

from beyondpar.base import files, settings


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


def test_guard_writes_records_and_refuses_before_writing(tmp_path):
    """A first run writes its settings; a free change is appended to the history with its
    step and rewrites the file; a fixed change is refused and leaves both files as they were."""
    path, history = tmp_path / "settings.json", tmp_path / "history.jsonl"
    free = lambda field: field == "train.steps"
    first = {"model": {"heads": 4}, "train": {"steps": 100}}
    guard = lambda wanted, step: settings.guard(
        path, wanted, "w holds other settings", "x", free, history=history, step=step
    )
    assert guard(first, 0) is None and files.read_json(path) == first
    assert guard(first, 5) == first and not history.exists()
    longer = {"model": {"heads": 4}, "train": {"steps": 300}}
    assert guard(longer, 100) == first and files.read_json(path) == longer
    assert files.read_json_lines(history, ("step",)) == [
        {"step": 100, "changes": {"train.steps": [100, 300]}}
    ]
    before = (path.read_text(), history.read_text())
    with pytest.raises(ValueError) as err:
        guard({"model": {"heads": 8}, "train": {"steps": 900}}, 300)
    assert str(err.value) == "w holds other settings (model.heads: 4 -> 8); x"
    assert (path.read_text(), history.read_text()) == before


def test_guard_fills_old_files_and_leaves_files_it_does_not_own(tmp_path):
    """`defaults` stand for fields an older file lacks, and the file is rewritten with them;
    `write=False` compares without writing; `saved` replaces the file's content."""
    path = tmp_path / "settings.json"
    files.write_json(path, {"model": "m"})
    wanted = {"model": "m", "model_sha256": "ab"}
    assert settings.guard(path, wanted, "w", "x", defaults={"model_sha256": "ab"}) is not None
    assert files.read_json(path) == wanted
    with pytest.raises(ValueError, match=r"^w \(model_sha256: 'ab' -> 'cd'\); x$"):
        settings.guard(path, {**wanted, "model_sha256": "cd"}, "w", "x")
    assert settings.guard(tmp_path / "none.json", wanted, "w", "x", write=False) is None
    assert not (tmp_path / "none.json").exists()
    with pytest.raises(ValueError, match=r"^w \(model: 'n' -> 'm'\); x$"):
        settings.guard(path, wanted, "w", "x", saved={"model": "n", "model_sha256": "ab"})


def test_guard_defaults_fill_only_fields_the_file_lacks(tmp_path):
    """`defaults` stand in for fields an older file lacks; a field the file does record is
    compared as recorded, never replaced by its default."""
    path = tmp_path / "settings.json"
    files.write_json(path, {"model": "m", "model_sha256": "abc"})
    wanted = {"model": "m", "model_sha256": "abc"}
    assert settings.guard(path, wanted, "h", "a", defaults={"model_sha256": "new"}) == wanted
    with pytest.raises(ValueError, match=r"model_sha256: 'abc' -> 'new'"):
        settings.guard(path, {"model": "m", "model_sha256": "new"}, "h", "a", defaults=wanted)
