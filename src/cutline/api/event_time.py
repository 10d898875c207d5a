"""Event time as one value: :class:`EventTime`, which every source (``event_time=``) and
:meth:`~cutline.DataStream.assign_timestamps` take, checked here when it is made, and
made into the runtime's :class:`~cutline.runtime.eventtime.watermarks.WatermarkStrategy`
against the stream's columns when the job is built (:func:`strategy`). The event-time
keywords the sources took one by one before (``max_out_of_orderness=``, ``idle_timeout=``,
``event_time_unit=``, ``max_watermark_jump=``, ``watermarks=``) are read here too, as
deprecated aliases (:func:`event_time_of`)."""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final, Literal, TypeAlias, TypedDict

import pyarrow as pa

from cutline.runtime.durations import Duration, callers_level, milliseconds, seconds
from cutline.runtime.eventtime.timestamps import UNITS, EventTimeError, TimeColumn, TimeUnit
from cutline.runtime.eventtime.watermarks import WatermarkGenerator, WatermarkStrategy
from cutline.runtime.operators import function_name


class _Default(enum.Enum):
    SOURCE = "the source's default"

    def __repr__(self) -> str:
        return "<the source's default>"


SOURCE_DEFAULT: Final = _Default.SOURCE
"""``EventTime(idle_timeout=)`` left out: the source's own default (10 s for ``read_kafka``
and ``read_delta``, never for the others)."""

IdleTimeout: TypeAlias = Duration | Literal[_Default.SOURCE] | None


@dataclass(frozen=True)
class EventTime:
    """Where each record's **event time** is, and how the **watermarks** that windows and
    timers fire on are made from it (Flink's ``WatermarkStrategy``, Bytewax's
    ``EventClock``). Give it as ``event_time=`` to a source (``read_parquet``, ``read_csv``,
    ``read_jsonl``, ``read_kafka``, ``read_delta``, ``from_source``, ``from_sequence``),
    which then makes watermarks per split (a file, a partition), or to
    :meth:`~cutline.DataStream.assign_timestamps`, which makes them per subtask.
    ``event_time="ts"`` is short for ``event_time=EventTime("ts")``::

        env.read_parquet("clicks/", event_time=EventTime("ts", max_out_of_orderness="3s"))

    A watermark *t* promises that no record at or before *t* is to come: it is the latest
    event time of a split, minus ``max_out_of_orderness``, minus 1 ms; a subtask's watermark
    is the least of its splits'. A record that comes with a time its windows' watermark has
    passed is **late** (see ``allowed_lateness`` of ``window``).

    Every argument is checked when the value is made: a wrong one raises
    :class:`~cutline.EventTimeError` (a ``ValueError``) or ``TypeError`` naming it and its
    value. Durations are text with a unit (``"500ms"``, ``"3s"``, ``"1 min"``), a
    ``timedelta``, or a number of **seconds** (:mod:`cutline.runtime.durations`).

    :param column_or_function: the column (or a record's field) holding the event time: an
        Arrow timestamp of any unit and time zone, a ``datetime``, or integers counting
        ``unit`` since the epoch (a column that is neither is refused when the job is built,
        naming its type). For ``assign_timestamps`` only, a function of the record returning
        that time instead (records must be dicts: it is stored in their ``event_time``
        field).
    :param max_out_of_orderness: how long after a later record of its split a record may
        still come and not be late (a duration; default 0: records come in time order).
    :param idle_timeout: a split that had no record for this long (processing time) stops
        holding the watermark back, until it has records again (a duration, or ``None``:
        never). Left out: the source's default, 10 s for ``read_kafka`` and ``read_delta``
        (whose partitions can go quiet), never for the others.
    :param unit: what integer times count since the epoch: ``"s"``, ``"ms"``, ``"us"`` or
        ``"ns"``. ``None``: milliseconds; integers that look like seconds read as
        milliseconds (times in 1970) are then warned about. Not for a timestamp column,
        which says its unit itself.
    :param max_jump: a record whose time is more than this ahead of its split's latest so
        far (one from the year 9999 among today's), with nothing in between, is a **jump**:
        it would move the watermark and make every later record late. It is warned about,
        or with ``on_error="dead_letter"`` sent to the dead letters, and never moves the
        watermark (a duration; ``None``: any distance is believed).
    :param watermarks: a :class:`~cutline.WatermarkGenerator` instead of
        ``max_out_of_orderness``: ``Monotonous()``, ``BoundedOutOfOrderness("2s")``, or one
        of your own (``on_event`` or ``on_events``, and ``on_periodic_emit``), a copy per
        split; not with ``max_out_of_orderness``.
    """

    column_or_function: str | Callable[[Any], Any]
    _: KW_ONLY
    max_out_of_orderness: Duration = 0
    idle_timeout: IdleTimeout = SOURCE_DEFAULT
    unit: TimeUnit | None = None
    max_jump: Duration | None = None
    watermarks: WatermarkGenerator | None = None
    bound_ms: int = field(init=False, repr=False, compare=False)
    """``max_out_of_orderness`` in milliseconds."""
    idle_timeout_s: float | Literal[_Default.SOURCE] | None = field(
        init=False, repr=False, compare=False
    )
    """``idle_timeout`` in seconds (``None``: never; ``SOURCE_DEFAULT``: the source's)."""
    max_jump_ms: int | None = field(init=False, repr=False, compare=False)
    """``max_jump`` in milliseconds (``None``: any distance)."""

    def __post_init__(self) -> None:
        given = self.column_or_function
        if isinstance(given, str):
            if not given:
                raise EventTimeError("EventTime: the event-time column must be a non-empty name")
        elif not callable(given):
            raise TypeError(
                "EventTime takes a column name (or, for assign_timestamps, a function of the "
                f"record), not {type(given).__name__} {given!r:.100}"
            )
        bound = self.max_out_of_orderness
        bound_ms = _ms(0 if bound is None else bound, "max_out_of_orderness", zero=True)
        object.__setattr__(self, "bound_ms", bound_ms)
        object.__setattr__(self, "idle_timeout_s", _idle(self.idle_timeout))
        jump = None if self.max_jump is None else _ms(self.max_jump, "max_jump")
        object.__setattr__(self, "max_jump_ms", jump)
        if self.unit is not None and self.unit not in UNITS:
            raise EventTimeError(
                f"EventTime: unit={self.unit!r}: use 's', 'ms', 'us' or 'ns' (what the "
                f"integer times of {self.label!r} count since the epoch)"
            )
        if self.watermarks is not None:
            if not isinstance(self.watermarks, WatermarkGenerator):
                raise TypeError(
                    "EventTime: watermarks= takes a WatermarkGenerator (BoundedOutOfOrderness"
                    f"('2s'), Monotonous(), or a subclass of your own), not "
                    f"{type(self.watermarks).__name__}"
                )
            if bound_ms:
                raise EventTimeError(
                    "EventTime: give max_out_of_orderness= or watermarks=, not both (a "
                    "generator says how far out of order the records come)"
                )

    def __repr__(self) -> str:
        given = [repr(self.column_or_function)]
        for name in ("max_out_of_orderness", "idle_timeout", "unit", "max_jump", "watermarks"):
            value = getattr(self, name)
            if value != _DEFAULTS[name]:
                given.append(f"{name}={value!r}")
        return f"EventTime({', '.join(given)})"

    @property
    def column(self) -> str | None:
        """The event-time column (``None`` for a function)."""
        given = self.column_or_function
        return given if isinstance(given, str) else None

    @property
    def label(self) -> str:
        """The column, or the function's name: what messages call it."""
        given = self.column_or_function
        return given if isinstance(given, str) else function_name(given)

    def idle_s(self, default: Duration | None) -> float | None:
        """``idle_timeout`` in seconds, ``default`` when it was left out."""
        idle = _idle(default) if isinstance(self.idle_timeout_s, _Default) else self.idle_timeout_s
        assert not isinstance(idle, _Default)
        return idle


_DEFAULTS: dict[str, Any] = {
    "max_out_of_orderness": 0,
    "idle_timeout": SOURCE_DEFAULT,
    "unit": None,
    "max_jump": None,
    "watermarks": None,
}


def _ms(value: Duration, keyword: str, *, zero: bool = False) -> int:
    what = f"EventTime: {keyword}"
    return milliseconds(value, what, zero=zero, keyword=keyword, error=EventTimeError)


def _idle(value: IdleTimeout) -> float | Literal[_Default.SOURCE] | None:
    if value is None or isinstance(value, _Default):
        return value
    try:
        idle = seconds(value, "EventTime: idle_timeout", was_ms=True)
    except ValueError as exc:
        raise EventTimeError(str(exc)) from None
    if idle is None or not 0 < idle < math.inf:
        raise EventTimeError(
            f"EventTime: idle_timeout={value!r} must be a positive duration (or None: never)"
        )
    return idle


# ------------------------------------------------------------------ the deprecated keywords


class OldEventTimeKeywords(TypedDict, total=False):
    """Deprecated: the event-time keywords the sources (and ``assign_timestamps``) took one by
    one before :class:`EventTime`; each is read into it, with a ``DeprecationWarning`` saying
    the ``EventTime(...)`` to write. A bare number is seconds here too."""

    max_out_of_orderness: Duration
    """``EventTime(max_out_of_orderness=)``."""
    idle_timeout: Duration | None
    """``EventTime(idle_timeout=)``."""
    event_time_unit: TimeUnit | None
    """``EventTime(unit=)``."""
    max_watermark_jump: Duration | None
    """``EventTime(max_jump=)``."""
    watermarks: WatermarkGenerator | None
    """``EventTime(watermarks=)``."""


_OLD = {
    "max_out_of_orderness": "max_out_of_orderness",
    "idle_timeout": "idle_timeout",
    "event_time_unit": "unit",
    "max_watermark_jump": "max_jump",
    "watermarks": "watermarks",
}
"""The deprecated keywords, and the fields of :class:`EventTime` they are."""


def event_time_of(
    what: str,
    event_time: EventTime | str | Callable[[Any], Any] | None,
    old: Mapping[str, Any] | None = None,
    *,
    written: str = "event_time={}",
    functions: bool = False,
) -> EventTime | None:
    """``event_time=`` as a source was given it: an :class:`EventTime`, or a column's name
    (its shorthand; with ``functions``, a function of the record too), or ``None``; ``old``:
    the deprecated keywords given (:class:`OldEventTimeKeywords`), read into it with a
    ``DeprecationWarning`` saying the ``EventTime(...)`` to write (``written``: where)."""
    given = dict(old or {})
    unknown = [k for k in given if k not in _OLD]
    if unknown:
        raise TypeError(f"{what}() got an unexpected keyword argument {unknown[0]!r}")
    shorthand = isinstance(event_time, str) or (functions and callable(event_time))
    if event_time is not None and not (shorthand or isinstance(event_time, EventTime)):
        takes = "a column's name or a function" if functions else "a column's name"
        raise TypeError(
            f"{what}: {written.format('')} takes EventTime(...) or {takes}, not "
            f"{type(event_time).__name__} {event_time!r:.100}"
        )
    if isinstance(event_time, str) and not event_time:
        raise EventTimeError(f"{what}: event_time='' names no column")
    if not given:
        if event_time is None or isinstance(event_time, EventTime):
            return event_time
        return EventTime(event_time)
    keywords = ", ".join(f"{k}=" for k in given)
    if event_time is None:
        wanted = written.format(f"EventTime('column', {_written(given)})")
        raise ValueError(
            f"{what}: {keywords} need event_time=: write {wanted} (the column of each "
            "record's event time)"
        )
    if isinstance(event_time, EventTime):
        raise ValueError(
            f"{what}: {keywords} and EventTime(...) both say how event time is made: put "
            f"them inside the EventTime ({_written(given)})"
        )
    made = EventTime(event_time, **{_OLD[k]: v for k, v in given.items()})
    shown = repr(event_time) if isinstance(event_time, str) else made.label
    wanted = written.format(f"EventTime({shown}, {_written(given)})")
    warnings.warn(
        f"{what}: {keywords} are deprecated: write {wanted}",
        DeprecationWarning,
        stacklevel=callers_level(),
    )
    return made


def _written(given: Mapping[str, Any]) -> str:
    """The deprecated keywords as :class:`EventTime`'s: a bare number of seconds (which is
    how it is read now) written as text with its unit, so that the meaning shows."""
    parts = []
    for keyword, value in given.items():
        shown = repr(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            shown = repr(f"{value:g}s")
        parts.append(f"{_OLD[keyword]}={shown}")
    return ", ".join(parts)


# -------------------------------------------------------------------------- in the job


FUNCTION_FIELD = "event_time"
"""Where ``assign_timestamps`` keeps what a function of the record returned."""


def strategy(
    what: str,
    event_time: EventTime | None,
    schema: pa.Schema | None,
    *,
    idle_default: Duration | None = None,
    functions: bool = False,
) -> WatermarkStrategy | None:
    """The watermark strategy of a source's records (``None`` without event time): the
    column must be one of ``schema``'s, a timestamp or integers (``schema=None``: not known
    before the records come, which then say). ``idle_default``: the source's
    ``idle_timeout`` when the :class:`EventTime` leaves it out. ``functions``: a function of
    the record may give the time (``assign_timestamps``), kept in :data:`FUNCTION_FIELD`."""
    if event_time is None:
        return None
    column = event_time.column
    if column is None:
        if not functions:
            raise TypeError(
                f"{what}: a source's event time is a column: EventTime('column', ...); a "
                f"function of the record ({event_time.label}) is for assign_timestamps"
            )
        column, schema = FUNCTION_FIELD, None
    return WatermarkStrategy(
        time_column(what, column, schema, event_time.unit),
        event_time.bound_ms,
        event_time.idle_s(idle_default),
        event_time.max_jump_ms,
        event_time.watermarks,
    )


def time_column(
    what: str, column: str, schema: pa.Schema | None, unit: TimeUnit | None
) -> TimeColumn:
    """The runtime's :class:`TimeColumn` of ``column`` in ``schema`` (typed when the schema
    is known), or an :class:`EventTimeError` naming ``what``, the column and the columns
    there are."""
    try:
        if schema is None:
            return TimeColumn(column, unit=unit)
        index = schema.get_field_index(column)
        if index < 0:
            raise EventTimeError(
                f"event_time={column!r}: no such column (columns: "
                f"{', '.join(schema.names) or 'none'})"
            )
        return TimeColumn(column, 0, schema.field(index).type, unit)
    except EventTimeError as exc:
        raise EventTimeError(f"{what}: {exc}") from None


def common_time(times: list[TimeColumn | None]) -> TimeColumn | None:
    """The event time of a union: its inputs' when they all have it in the same column (the
    type when all that know it agree; else it is learned from the records); else none (call
    assign_timestamps after the union)."""
    if any(t is None for t in times):
        return None
    found = [t for t in times if t is not None]
    if len({(t.column, t.offset, t.unit) for t in found}) != 1:
        return None
    types = {t.type for t in found if t.type is not None}
    first = found[0]
    return TimeColumn(
        first.column, first.offset, types.pop() if len(types) == 1 else None, first.unit
    )
