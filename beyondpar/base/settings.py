"""Settings compared field by field: a rerun into an existing output folder must keep the
settings that made it, and a refusal names every field that differs, old -> new.
Settings are compared in their JSON form, as they are saved: a tuple equals the list it
is read back as."""

from __future__ import annotations

import json


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


def refuse_changes(old: dict, new: dict, holder: str, advice: str, free=lambda field: False):
    """The fields of `new` that differ from `old` and that `free(field)` allows to change;
    any other difference is a ValueError: '<holder> ... (field: old -> new); <advice>'."""
    diff = changes(old, new)
    fixed = {k: v for k, v in diff.items() if not free(k)}
    if fixed:
        raise ValueError(f"{holder} ({listed(fixed)}); {advice}")
    return diff
