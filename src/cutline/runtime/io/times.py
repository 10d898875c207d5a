"""ISO-8601 text as Arrow timestamps: one column may mix values with ``Z``, with an offset and
without a zone, with or without fractions of a second, ``T`` or a space between date and time.

Every value is read as the instant it names: an offset is shifted to UTC, and a value without
a zone is taken as UTC. The column's type only says how the instants are held: in its unit
(a value with more digits than the unit holds is refused, unless they are zeros, rather than
rounded) and with its time zone, if any (a column without one holds UTC wall times, as
pyarrow.json reads such text). The work is pyarrow's, a column at a time (:func:`convert`):
one cast when the column has one form throughout, else the values with a zone and those
without cast apart; only when that fails (``t`` and ``z`` in lower case, a decimal comma,
more digits than the unit holds, text that is no time), each value is taken apart by a
regular expression and put back in the form Arrow's parser reads
(``2024-05-01T12:00:30.5Z``), which also finds the values that are no time, each with its
reason. Not read: the basic format without dashes (``20240501T120030Z``), week and ordinal
dates, and leap seconds (``23:59:60``), which Arrow's parser does not read either.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}
"""Digits of a second each unit holds."""

_ZONED = r"[T ].*(?:Z|[+-]\d\d(?::?\d\d)?)$"
"""A date-time with a zone (``Z`` or an offset) after its time (a date alone has none)."""

_PROBE = 1024
"""How many values of a column :func:`convert` looks at to guess its form."""

_PARTS = (
    r"^(?P<date>\d{4}-\d\d-\d\d)"
    r"(?:[T ](?P<time>\d\d(?::?\d\d(?::?\d\d)?)?)"
    r"(?:[.,](?P<fraction>\d+))?"
    r"(?P<zone>Z|[+-]\d\d(?::?\d\d)?)?)?$"
)
"""An ISO-8601 date or date-time (upper case), in its parts."""


def to_timestamps(
    text: pa.Array, target: pa.TimestampType, column: str = "value"
) -> tuple[pa.Array, dict[int, str]]:
    """``text`` (strings) as timestamps of type ``target``, with a null for each value that is
    no time; returns them and, for each of those (by index), why, to follow the value in a
    message (``is not a timestamp[us]``, or the unit that would hold it, as a ``schema=`` of
    ``column``)."""
    try:
        return convert(text, target), {}
    except pa.ArrowInvalid:
        pass
    upper = pc.ascii_upper(text)
    parts = pc.extract_regex(upper, _PARTS)
    digits = DIGITS[str(target.unit)]
    finer = pc.fill_null(
        pc.match_substring_regex(_fraction(parts), rf"^\d{{{digits}}}\d*[1-9]"), False
    )
    failed: dict[int, str] = {}
    written = pc.is_valid(text)
    shaped = pc.and_(pc.is_valid(parts), pc.invert(finer))
    for i in pc.indices_nonzero(pc.and_(written, pc.invert(shaped))).to_pylist():
        failed[i] = _why(upper[i].as_py(), target, column, bool(finer[i].as_py()))
    normal = pc.if_else(shaped, _assembled(parts, digits), pa.scalar(None, pa.string()))
    utc = pa.timestamp(target.unit, "UTC")
    try:
        stamps = normal.cast(utc)
    except pa.ArrowInvalid:
        refused = halving(normal, lambda part: part.cast(utc))
        for i in refused:
            failed[i] = _why(upper[i].as_py(), target, column, False)
        keep = pc.invert(pa.array(_mask(len(text), refused)))
        stamps = pc.if_else(keep, normal, pa.scalar(None, pa.string())).cast(utc)
    return stamps.cast(target), failed


def convert(text: pa.Array, target: pa.TimestampType) -> pa.Array:
    """``text`` as timestamps of type ``target``, or ``ArrowInvalid`` if a value is no time
    (the first two ways of :func:`to_timestamps`: no value taken apart).

    Which values have a zone is looked at in the first values first: a column of one form
    throughout is then one cast. Only when they mix, or the guess fails, is every value
    looked at (a regular expression, some 35 ns a value), to cast those with a zone and those
    without apart: a cast of text with a zone to a type without one costs Arrow ten times
    more to fail than the expression, and is never tried."""
    utc = pa.timestamp(target.unit, "UTC")
    naive = pa.timestamp(target.unit)
    head = pc.match_substring_regex(text.slice(0, _PROBE), _ZONED)
    zoned = pc.sum(head).as_py() or 0
    if zoned == len(head) - head.null_count:
        try:
            return text.cast(utc).cast(target)
        except pa.ArrowInvalid:
            pass
    elif zoned == 0:
        try:
            return text.cast(naive).cast(utc).cast(target)
        except pa.ArrowInvalid:
            pass
    every = pc.match_substring_regex(text, _ZONED)
    none = pa.scalar(None, pa.string())
    aware = pc.if_else(every, text, none).cast(utc)
    local = pc.if_else(every, none, text).cast(naive).cast(utc)
    return pc.coalesce(aware, local).cast(target)


def time_unit(text: pa.Array) -> str | None:
    """The unit a column of text is inferred as when every value in it is an ISO-8601 date or
    date-time (``us``, or ``ns`` when a value has more digits of a second than microseconds
    hold), else ``None``."""
    shaped = pc.match_substring_regex(text, _PARTS, ignore_case=True)
    if pc.all(shaped).as_py() is False:  # (no value taken apart, no cast that fails)
        return None
    for unit in ("us", "ns"):
        try:
            convert(text, pa.timestamp(unit))
        except pa.ArrowInvalid:
            continue
        return unit
    for unit in ("us", "ns"):
        if not to_timestamps(text, pa.timestamp(unit))[1]:
            return unit
    return None


def _fraction(parts: pa.Array) -> pa.Array:
    return pc.struct_field(parts, "fraction")


def _assembled(parts: pa.Array, digits: int) -> pa.Array:
    """The parts put back in the form Arrow's parser reads: ``T`` between date and time,
    ``00:00`` for a date alone, the fraction to ``digits`` digits (those after are zeros),
    ``Z`` when there was no zone."""
    time = pc.struct_field(parts, "time")
    fraction = pc.utf8_slice_codeunits(_fraction(parts), 0, digits)
    dot = pc.if_else(pc.greater(pc.utf8_length(fraction), 0), ".", "")
    zone = pc.struct_field(parts, "zone")
    pieces = [
        pc.struct_field(parts, "date"),
        pa.scalar("T"),
        pc.if_else(pc.greater(pc.utf8_length(time), 0), time, "00:00"),
        dot,
        fraction,
        pc.if_else(pc.greater(pc.utf8_length(zone), 0), zone, "Z"),
    ]
    return pc.binary_join_element_wise(*pieces, "")


def _why(value: str, target: pa.TimestampType, column: str, finer: bool) -> str:
    """Why ``value`` (upper case) is not a time of type ``target``: finer than its unit (and
    the unit that holds it), out of its range, or no time at all."""
    if finer:
        fraction = pc.struct_field(pc.extract_regex(pa.array([value]), _PARTS), "fraction")
        needed = len(str(fraction[0].as_py()).rstrip("0"))
        unit = next((u for u, d in DIGITS.items() if d >= needed), None)
        if unit is None:
            return "is finer than a nanosecond, the finest unit of a timestamp"
        wanted = str(pa.timestamp(unit, target.tz))
        return f"is finer than a {target} holds (give schema={{{column!r}: {wanted!r}}})"
    if target.unit == "ns" and not to_timestamps(pa.array([value]), pa.timestamp("us"))[1]:
        return f"is out of the range of a {target} (the years 1677 to 2262)"
    return f"is not a {target}"


def _mask(length: int, indices: list[int]) -> list[bool]:
    mask = [False] * length
    for i in indices:
        mask[i] = True
    return mask


def halving(column: pa.Array, check: Callable[[pa.Array], object]) -> list[int]:
    """The indices of the values of ``column`` that ``check`` refuses (raises
    ``ArrowInvalid``), by halving: a few checks per refused value, not one per value (the
    readers find their rejected rows so too)."""
    found: list[int] = []

    def visit(part: pa.Array, start: int) -> None:
        try:
            check(part)
            return
        except pa.ArrowInvalid:
            if len(part) == 1:
                found.append(start)
                return
        half = len(part) // 2
        visit(part.slice(0, half), start)
        visit(part.slice(half), start + half)

    visit(column, 0)
    return found
