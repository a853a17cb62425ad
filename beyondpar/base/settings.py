"""Settings compared field by field: a rerun into an existing output folder must keep the
settings that made it, and a refusal names every field that differs, old -> new.
Settings are compared in their JSON form, as they are saved: a tuple equals the list it
is read back as.

`guard` is the one rule for every folder that keeps its settings: the run's workdir
(config.json, allowed changes in config_history.jsonl), a corpus analysis
(settings.json), a series (each line of series.jsonl) and a corpus's optimal weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from beyondpar.base import files


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a.b": leaf} for a nested dict {"a": {"b": leaf}}."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def json_form(tree: dict) -> dict:
    """`tree` as it reads back from a JSON file: tuples become lists."""
    return json.loads(json.dumps(tree))


def changes(old: dict, new: dict) -> dict[str, tuple]:
    """{field: (old, new)} for every leaf that differs (missing on one side: None), both
    sides in their JSON form (tuples as lists)."""
    a, b = flatten(json_form(old)), flatten(json_form(new))
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def listed(diff: dict[str, tuple]) -> str:
    """'field: old -> new; ...' for a person to read."""
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in diff.items())


def nothing_free(field: str) -> bool:
    """The default rule: no field may change."""
    return False


def refuse_changes(old: dict, new: dict, holder: str, advice: str, free=nothing_free):
    """The fields of `new` that differ from `old` and that `free(field)` allows to change;
    any other difference is a ValueError: '<holder> ... (field: old -> new); <advice>'."""
    diff = changes(old, new)
    fixed = {k: v for k, v in diff.items() if not free(k)}
    if fixed:
        raise ValueError(f"{holder} ({listed(fixed)}); {advice}")
    return diff


def guard(
    path: str | os.PathLike,
    wanted: dict,
    holder: str,
    advice: str,
    free: Callable[[str], bool] = nothing_free,
    *,
    saved: dict | None = None,
    defaults: dict | None = None,
    history: str | os.PathLike | None = None,
    step: int | None = None,
    write: bool = True,
) -> dict | None:
    """Keep the settings file `path` to one experiment: a first run (no file) writes
    `wanted`; a rerun may change only the fields `free` allows, and any other change is a
    ValueError naming every differing field (`refuse_changes`), raised before anything is
    written. Allowed changes are appended with `step` to the JSON-lines file `history`
    when given, and the file is rewritten with `wanted` wherever it differs.

    `saved`: the settings on record when the caller read them elsewhere (e.g. one line of a
    JSON-lines file); by default `path`'s content. `defaults`: values for the fields a file
    written before they were recorded lacks. `write=False`: `path` holds more than the
    settings (its caller writes it). Returns the settings on record, None on a first run.
    """
    path = Path(path)
    if saved is None and path.exists():
        saved = files.read_json(path)
    if saved is not None:
        diff = refuse_changes({**(defaults or {}), **saved}, wanted, holder, advice, free)
        if diff and history is not None:
            changed = {k: [old, new] for k, (old, new) in diff.items()}
            files.append_json_line(history, {"step": step, "changes": changed})
    if write and saved != json_form(wanted):
        files.write_json(path, wanted)
    return saved
