"""A source's (or ``assign_timestamps``') event-time settings checked and made into a
:class:`~cutline.runtime.eventtime.watermarks.WatermarkStrategy` when the job is built."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from cutline.runtime.eventtime.timestamps import EventTime, EventTimeError, duration_ms
from cutline.runtime.eventtime.watermarks import WatermarkGenerator, WatermarkStrategy


def source_strategy(
    what: str,
    schema: pa.Schema | None,
    event_time: str | None,
    bound: Any,
    idle: Any,
    unit: str | None = None,
    jump: Any = None,
    generator: Any = None,
) -> WatermarkStrategy | None:
    """The watermark strategy of a source (``None`` without ``event_time``): the column must
    be one of ``schema``'s, a timestamp or integers (``schema=None``: not known before the
    records come, which then say)."""
    if event_time is None:
        given = (idle, unit, jump, generator)
        if bound not in (0, None) or any(g is not None for g in given):
            raise ValueError(
                f"{what}: max_out_of_orderness=, watermarks=, idle_timeout=, event_time_unit= "
                "and max_watermark_jump= need event_time= (the column of each record's event "
                "time)"
            )
        return None
    if not isinstance(event_time, str) or not event_time:
        raise ValueError(f"{what}: event_time must be a column name, not {event_time!r}")
    bound_ms = duration_ms(bound or 0, f"{what}: max_out_of_orderness", zero=True)
    idle_s = None if idle is None else duration_ms(idle, f"{what}: idle_timeout") / 1000
    most = None if jump is None else duration_ms(jump, f"{what}: max_watermark_jump")
    generator = watermark_generator(what, generator, bound_ms)
    if schema is None:
        try:
            column = EventTime(event_time, unit=unit)
            return WatermarkStrategy(column, bound_ms, idle_s, most, generator)
        except EventTimeError as exc:
            raise EventTimeError(f"{what}: {exc}") from None
    index = schema.get_field_index(event_time)
    if index < 0:
        raise EventTimeError(
            f"{what}: event_time={event_time!r}: no such column (columns: "
            f"{', '.join(schema.names) or 'none'})"
        )
    try:
        column = EventTime(event_time, 0, schema.field(index).type, unit)
    except EventTimeError as exc:
        raise EventTimeError(f"{what}: {exc}") from None
    return WatermarkStrategy(column, bound_ms, idle_s, most, generator)


def watermark_generator(what: str, generator: Any, bound: int) -> WatermarkGenerator | None:
    """``watermarks=`` as given, checked: a :class:`WatermarkGenerator` that can be sent to the
    workers, and not with ``max_out_of_orderness=`` (it says how far out of order)."""
    if generator is None:
        return None
    if not isinstance(generator, WatermarkGenerator):
        raise TypeError(
            f"{what}: watermarks= takes a WatermarkGenerator (BoundedOutOfOrderness('2s'), "
            f"Monotonous(), or a subclass of your own), not {type(generator).__name__}"
        )
    if bound:
        raise ValueError(
            f"{what}: give max_out_of_orderness= or watermarks=, not both (a generator says "
            "how far out of order the records come)"
        )
    return generator  # (the launcher checks that it can be sent to the workers)


def common_time(times: list[EventTime | None]) -> EventTime | None:
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
    return EventTime(
        first.column, first.offset, types.pop() if len(types) == 1 else None, first.unit
    )
