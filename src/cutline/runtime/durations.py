"""Durations as a user writes them: one grammar, one parser, for every duration cutline takes
(the settings of a job and its restart strategy, event time, windows, ``monitor=``,
timeouts, ``stop_after``, the command line's options).

A duration is one of:

* **text with a unit**: a number (``3``, ``1.5``, ``.5``) and a unit, spaces allowed around
  and between them: ``"500ms"``, ``"3s"``, ``"1.5 s"``, ``"1 min"``, ``"2h"``, ``"1d"``. The
  units, in any case: ``ms``, ``msec``, ``millisecond(s)``; ``s``, ``sec``, ``secs``,
  ``second(s)``; ``m``, ``min``, ``mins``, ``minute(s)``; ``h``, ``hr``, ``hrs``,
  ``hour(s)``; ``d``, ``day(s)``. ``m`` is minutes, as in Flink, Spark and Go (both of
  cutline's earlier parsers read it so); a capital ``M`` alone is refused, since it may be
  read as months. Text without a unit (``"5"``) is refused: write ``"5s"``, or the number;
* a :class:`datetime.timedelta`;
* a **bare number** (``int`` or ``float``, not ``bool``): **seconds**, everywhere.

Anything else is a ``ValueError`` naming the argument and the value.

Inside, one unit per kind of time: event time (timestamps, watermarks, window sizes, how far
out of order, lateness) in whole milliseconds, ``int`` (``milliseconds()``); wall-clock
time (timeouts, intervals, idleness) in seconds, ``float`` (``seconds()``). Fields say
their unit in their name where it is not obvious (``bound_ms``, ``idle_timeout_s``).

**A bare number that once was milliseconds.** Before this grammar, the event-time keywords
(``max_out_of_orderness``, ``idle_timeout``, ``max_watermark_jump``, window sizes, ``every``,
``offset``, ``gap``, ``allowed_lateness``, ``early``, ``BoundedOutOfOrderness(bound)``) read a
bare integer as milliseconds. They read seconds now; a bare number of 1,000 or more given to
one of them (``max_out_of_orderness=5000``: 83 minutes now) was probably meant as
milliseconds, and is warned about once per keyword per process (:class:`~cutline.DurationWarning`):
write ``"5000ms"`` or ``"5s"``, which are never warned about.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import sys
import warnings
from decimal import Decimal
from numbers import Real
from types import CodeType
from typing import TypeAlias

Duration: TypeAlias = float | int | str | dt.timedelta
"""What a duration may be written as (see the module's docstring)."""

_TEXT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")
_UNITS: dict[str, Decimal] = {}
for _names, _size in (
    (("ms", "msec", "millisecond", "milliseconds"), Decimal("0.001")),
    (("s", "sec", "secs", "second", "seconds"), Decimal(1)),
    (("m", "min", "mins", "minute", "minutes"), Decimal(60)),
    (("h", "hr", "hrs", "hour", "hours"), Decimal(3600)),
    (("d", "day", "days"), Decimal(86400)),
):
    _UNITS.update(dict.fromkeys(_names, _size))
UNITS = tuple(_UNITS)
"""The unit spellings a duration's text may use (any case; ``M`` alone is refused)."""

CHANGED_AT = 1000
"""A bare number given to a keyword that read milliseconds before, from this size on, is
warned about (:class:`~cutline.DurationWarning`)."""


class DurationWarning(UserWarning):
    """A bare number given to a keyword that read it as milliseconds before this version and
    reads it as seconds now, large enough (1,000 or more) to have been meant as milliseconds.
    Given once per keyword per process; text with a unit (``"1500ms"``, ``"1500s"``) is never
    warned about."""


_warned: set[str] = set()
"""The keywords warned about in this process (:class:`~cutline.DurationWarning`: once each)."""


def _shape(what: str, value: object) -> str:
    return (
        f"{what}={value!r} is not a duration: give text with a unit ('500ms', '3s', '1 min', "
        "'2h', '1d'), a datetime.timedelta, or a number of seconds"
    )


def _exact_seconds(value: object, what: str) -> Decimal | None:
    """``value`` in seconds, exactly as written (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(_shape(what, value))
    if isinstance(value, dt.timedelta):
        return Decimal(value // dt.timedelta(microseconds=1)) / 1_000_000
    if isinstance(value, Real):
        real = float(value)
        if math.isnan(real):
            raise ValueError(_shape(what, value))
        if math.isinf(real):
            return Decimal(real)
        return Decimal(str(value)) if isinstance(value, int | float) else Decimal(real)
    if isinstance(value, str):
        match = _TEXT.fullmatch(value)
        if match is None:
            raise ValueError(_shape(what, value))
        number, unit = match.groups()
        if not unit:
            raise ValueError(
                f"{what}={value!r} has no unit: write '{number}s' (or '{number}ms', "
                f"'{number}min'...), or the number {number} for seconds"
            )
        if unit == "M":
            raise ValueError(
                f"{what}={value!r}: 'M' may be read as months or minutes: write '{number}min' "
                "for minutes (cutline's durations go up to days)"
            )
        size = _UNITS.get(unit.lower())
        if size is None:
            raise ValueError(
                f"{what}={value!r}: unknown unit {unit!r} (use ms, s, min, h or d, e.g. "
                f"'{number}s')"
            )
        return Decimal(number) * size
    raise ValueError(_shape(what, value))


def seconds(value: Duration | None, what: str, *, was_ms: bool = False) -> float | None:
    """A wall-clock duration in seconds (``float``; ``None`` stays ``None``): ``1.5``,
    ``"1s"``, ``"500ms"``, ``"2 min"``, ``timedelta(seconds=3)``; anything else is a
    ``ValueError`` naming ``what``. Its bounds (positive, finite) are the caller's to check.
    ``was_ms``: the keyword read a bare number as milliseconds before (a large one is warned
    about, :class:`~cutline.DurationWarning`)."""
    exact = _exact_seconds(value, what)
    if exact is None:
        return None
    if was_ms:
        _warn_if_meant_ms(value, what)
    return float(exact)


def milliseconds(
    value: Duration,
    what: str,
    *,
    zero: bool = False,
    keyword: str | None = None,
    error: type[ValueError] = ValueError,
) -> int:
    """An event-time duration in whole milliseconds (``int``): ``"10s"``, ``"1 min"``,
    ``"500ms"``, ``timedelta(seconds=2)``, ``2`` (seconds). ``what`` names the setting in the
    error (raised as ``error``), which a duration finer than a millisecond, negative, or zero
    (unless ``zero``) is. Every keyword that takes one read a bare integer as milliseconds
    before: a bare number of 1,000 or more is warned about once per ``keyword`` (``what``
    when not given)."""
    try:
        exact = _exact_seconds(value, what)
    except ValueError as exc:
        raise error(str(exc)) from None
    if exact is None or not exact.is_finite():
        raise error(f"{what}={value!r}: give a finite duration ('10s', '500ms')")
    ms = exact * 1000
    if ms != ms.to_integral_value():
        raise error(f"{what}={value!r} is not a whole number of milliseconds")
    if ms < 0 or (ms == 0 and not zero):
        raise error(f"{what}={value!r} must be {'0 or more' if zero else 'positive'}")
    _warn_if_meant_ms(value, keyword or what)
    return int(ms)


def _warn_if_meant_ms(value: object, keyword: str) -> None:
    """Warn (once per ``keyword``) of a bare number that was probably meant as ms."""
    if isinstance(value, bool) or not isinstance(value, Real) or not float(value) >= CHANGED_AT:
        return
    if keyword in _warned:
        return
    _warned.add(keyword)
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    warnings.warn(
        f"{keyword}={shown} is read as {said(float(value))} (a bare number is seconds; it "
        f"was milliseconds before): probably meant as ms: write '{shown}ms' (or "
        f"'{shown}s' to keep seconds and silence this)",
        DurationWarning,
        stacklevel=callers_level(),
    )


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def callers_level() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called by the caller of this function that
    points at the first frame outside cutline: the user's line."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and _ours(frame.f_code):
        frame, level = frame.f_back, level + 1
    return level


def _ours(code: CodeType) -> bool:
    """Whether code is cutline's (a dataclass's ``__init__`` is made from a string)."""
    name = code.co_filename
    return name.startswith(_PACKAGE) or (name == "<string>" and code.co_name == "__init__")


def said(value: float) -> str:
    """Seconds for people: ``0.5 s``, ``1 min``, ``1.5 h``."""
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if value >= size and value % (size / 10) == 0:
            return f"{value / size:g} {unit}"
    return f"{value:g} s"


def said_ms(ms: int) -> str:
    """Milliseconds for people, as the grammar reads them back: ``1h``, ``5min``, ``2s``,
    ``1500ms``."""
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def offset_milliseconds(value: Duration, what: str) -> int:
    """An event-time *offset* in whole milliseconds, which may be negative (an interval join's
    bounds: ``"-10 min"``, ``"0s"``, ``timedelta(minutes=-10)``, ``-600`` seconds): a
    duration (:func:`milliseconds`, zero allowed) with an optional leading ``-``."""
    if isinstance(value, str) and value.strip().startswith("-"):
        return -milliseconds(value.strip()[1:], what, zero=True)
    if isinstance(value, dt.timedelta) and value < dt.timedelta(0):
        return -milliseconds(-value, what, zero=True)
    if isinstance(value, Real) and not isinstance(value, bool) and value < 0:
        return -milliseconds(-value, what, zero=True)
    return milliseconds(value, what, zero=True)
