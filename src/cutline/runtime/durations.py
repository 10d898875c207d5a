"""Durations as a user writes them, read as seconds: ``1.5`` (a number: seconds), ``"500ms"``,
``"1s"``, ``"2min"``, ``"1h"``, or a :class:`datetime.timedelta`. One grammar for every
setting of the job and its restart strategy."""

from __future__ import annotations

import datetime as dt
import re
from typing import TypeAlias

Duration: TypeAlias = float | int | str | dt.timedelta
"""What a duration may be written as (see the module's docstring)."""

_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|min|m|h)?\s*")
_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def seconds(value: Duration | None, what: str) -> float | None:
    """``1.5``, ``"1s"``, ``"500ms"``, ``"2min"``, ``timedelta(seconds=3)`` -> seconds
    (``None`` stays ``None``); anything else is a ``ValueError`` naming ``what``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected seconds or a duration like '1s', got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match:
            return float(match.group(1)) * _UNITS[match.group(2)]
    raise ValueError(
        f"{what}: {value!r} is not a duration (use seconds, text like '500ms', '1s', '2min', "
        "or a timedelta)"
    )


def said(value: float) -> str:
    """Seconds for people: ``0.5 s``, ``1 min``, ``1.5 h``."""
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if value >= size and value % (size / 10) == 0:
            return f"{value / size:g} {unit}"
    return f"{value:g} s"
