"""A stream partitioned by key (:meth:`DataStream.key_by`): :class:`KeyedStream`, its keyed
state and rolling aggregations, and its windows (:mod:`cutline.api.windowed`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pyarrow as pa

from cutline.api.columns import numeric_column, with_count
from cutline.api.streams import DataStream, _callable, _Operators
from cutline.api.windowed import WindowedStream, _early
from cutline.runtime.durations import milliseconds
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.timestamps import EventTimeError, TimeColumn
from cutline.runtime.graph import Edge, Partitioning
from cutline.runtime.keyed_operators import KeyedProcessFunction, ProcessLogic, RollingLogic
from cutline.runtime.operators import Logic, function_name


class KeyedStream(_Operators):
    """A stream partitioned by key: keyed state and rolling aggregations per key."""

    def __init__(self, stream: DataStream, key: str | Callable[[Any], Hashable]) -> None:
        self.stream = stream
        self.key = key

    def transform(
        self, label: str, logic: Logic, *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        edge = Edge(self.stream.operator.uid, Partitioning.HASH, self.key)
        return self.stream._through(edge, label, logic, name, on_error)

    def _schema(self) -> pa.Schema | None:
        return self.stream.schema

    def process(
        self, function: KeyedProcessFunction, *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """Run ``function.process(record, ctx)`` for every record, with keyed state in ``ctx``."""
        if not isinstance(function, KeyedProcessFunction):
            raise TypeError(
                "process takes an instance of a KeyedProcessFunction subclass, not "
                f"{type(function).__name__}"
            )
        label = f"process({type(function).__name__})"
        logic = ProcessLogic(function, self.key)
        return self.transform(label, logic, name=name, on_error=on_error)

    def reduce(
        self, fn: Callable[[Any, Any], Any], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """For every record, emit ``fn(previous result of its key, record)`` (the first record of
        a key is emitted as it is)."""
        _callable(fn, "reduce")
        logic = RollingLogic("reduce", self.key, fn=fn)
        return self.transform(f"reduce({function_name(fn)})", logic, name=name, on_error=on_error)

    def sum(self, field: str | int, *, name: str | None = None) -> DataStream:
        """For every record, the record with ``field`` replaced by its key's running sum."""
        return self._rolling("sum", field, name)

    def min(self, field: str | int, *, name: str | None = None) -> DataStream:
        """For every record, the record with ``field`` replaced by its key's running minimum."""
        return self._rolling("min", field, name)

    def max(self, field: str | int, *, name: str | None = None) -> DataStream:
        """For every record, the record with ``field`` replaced by its key's running maximum."""
        return self._rolling("max", field, name)

    def count(self, *, name: str | None = None) -> DataStream:
        """For every record, the record with a ``count`` field: its key's running count."""
        stream = self.transform("count", RollingLogic("count", self.key), name=name)
        stream.schema = with_count(self.stream.schema)
        return stream

    def _rolling(self, kind: str, field: str | int, name: str | None) -> DataStream:
        if isinstance(field, str):
            numeric_column(self.stream.schema, field, f"{kind}({field!r})", kind)
        logic = RollingLogic(kind, self.key, field)
        stream = self.transform(f"{kind}({field})", logic, name=name)
        stream.schema = self.stream.schema  # (the record, its field replaced)
        return stream

    def window(
        self,
        assigner: Tumbling | Sliding | Session,
        *,
        allowed_lateness: Any = 0,
        time: str = "event",
        early: Any = None,
        early_records: int | None = None,
    ) -> WindowedStream:
        """Windows of event time per key: ``Tumbling("1 min")``, ``Sliding("10 min",
        every="1 min")`` or ``Session(gap="30 min")``; then say what each computes
        (``.count()``, ``.sum("amount")``, ``.aggregate(fn)``, ...).

        A window fires once the watermark passes its end; its result carries ``window_start``
        and ``window_end``. ``allowed_lateness`` (a duration): a record that comes that long
        after its window fired still updates it, and the window fires again; a later one goes
        to ``.late()`` of the result, and is counted.

        ``time="processing"``: windows of the wall-clock time each record reaches the window
        operator, fired by the clock (no watermarks needed, no record ever late; the end of
        the input fires what is left). Results are then not repeatable run to run.

        ``early`` (a duration of processing time, ``"10s"``): every that long, each open
        window's result so far, before its final one; results then have a ``final`` column
        (false for those, true for the last), as Flink's early-firing triggers give.
        ``early_records`` (a count): each time a window of a key has taken that many more
        records, its result so far (at most one per window per batch, after the batch), as
        Flink's ``CountTrigger``; with ``early``, both."""
        if time not in ("event", "processing"):
            raise ValueError(f"window(time={time!r}): use 'event' or 'processing'")
        if not isinstance(assigner, Tumbling | Sliding | Session):
            raise TypeError(
                "window takes Tumbling(size), Sliding(size, every=...) or Session(gap=...), "
                f"not {assigner!r}"
            )
        event_time = self.stream.event_time
        lateness = milliseconds(
            allowed_lateness or 0, "allowed_lateness", zero=True, error=EventTimeError
        )
        if time == "processing":
            if lateness:
                raise ValueError("allowed_lateness is for event time: no record is late here")
            clock = TimeColumn("processing_time")
            windowed = WindowedStream(self, assigner, clock, 0, "processing")
            return _early(windowed, early, early_records)
        if event_time is None:
            raise ValueError(
                f"window({assigner}): the stream has no event time: give the source "
                "event_time='column' (and max_out_of_orderness=...), or call "
                "assign_timestamps(...) on the stream before key_by"
            )
        if event_time.unit == "s":
            lengths = {"size": getattr(assigner, "size", 0), "every": getattr(assigner, "every", 0)}
            lengths |= {
                "offset": getattr(assigner, "offset", 0),
                "gap": getattr(assigner, "gap", 0),
            }
            uneven = {k: v for k, v in lengths.items() if v % 1000}
            if uneven:
                name, value = next(iter(uneven.items()))
                raise ValueError(
                    f"window({assigner}): its {name} ({value} ms) is no whole number of seconds, "
                    f"the unit of the times of {event_time.column!r} (EventTime(unit='s')): "
                    "window_start and window_end could not say it"
                )
        return _early(WindowedStream(self, assigner, event_time, lateness), early, early_records)
