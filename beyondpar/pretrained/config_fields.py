"""Reading config.json fields with errors that name the field, the file and the value."""

from __future__ import annotations

from beyondpar.base import checks


def field(config: dict, name: str, kind=int, default=...):
    """config[name] as `kind`; a missing field without default, or a bad value, is an error."""
    if name not in config or config[name] is None:
        if default is ...:
            raise ValueError(f"config.json must set {name!r}, got no value")
        return default
    value = config[name]
    if kind is int:
        return checks.positive_int(f"config.json field {name!r}", value)
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"config.json field {name!r} must be a number, got {value!r}")
    return kind(value)


def one_of(name: str, value, choices) -> str:
    return checks.one_of(f"config.json field {name!r}", value, sorted(choices))


def positive_number(config: dict, name: str, nullable: bool = False) -> float | None:
    """config[name] as a float > 0; None when it is null and `nullable` (a feature off)."""
    value = config.get(name)
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        expected = "a number > 0" + (" or null" if nullable else "")
        raise ValueError(f"config.json field {name!r} must be {expected}, got {value!r}")
    return float(value)
