"""A stream partitioned by key (:meth:`DataStream.key_by`): :class:`KeyedStream`, its keyed
state and rolling aggregations, and its windows (:mod:`cutline.api.windowed`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cutline.api.columns import numeric_column, with_count, with_float
from cutline.api.connected import ConnectedStreams
from cutline.api.streams import DataStream, _callable, _Operators
from cutline.api.windowed import WindowedStream, _early
from cutline.runtime.durations import milliseconds
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.timers import TimeDomain
from cutline.runtime.eventtime.timestamps import EventTimeError, TimeColumn
from cutline.runtime.graph import Edge, Partitioning
from cutline.runtime.keyed_operators import (
    KeyedProcessFunction,
    ProcessLogic,
    Rolling,
    RollingLogic,
)
from cutline.runtime.operators import Logic, OnError, function_name


class KeyedStream(_Operators):
    """A stream partitioned by key: keyed state and rolling aggregations per key."""

    def __init__(self, stream: DataStream, key: str | Callable[[Any], Hashable]) -> None:
        self.stream = stream
        self.key = key

    def transform(
        self, label: str, logic: Logic, *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        edge = Edge(self.stream.operator.uid, Partitioning.HASH, self.key)
        return self.stream._through(edge, label, logic, name, on_error)

    def _schema(self) -> pa.Schema | None:
        return self.stream.schema

    def process(
        self, function: KeyedProcessFunction, *, name: str | None = None, on_error: OnError = "fail"
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

    def connect(self, other: KeyedStream) -> ConnectedStreams:
        """This keyed stream and ``other`` (keyed too) in one operator
        (:class:`~cutline.KeyedCoProcessFunction`): a record of either side with key ``k``
        sees the state and timers of ``k``, shared by both sides. Keys of both sides must be
        of one kind (refused now when the columns' types are known to differ)."""
        from cutline.api.connected import connect_keyed

        return connect_keyed(self, other)

    def broadcast(self) -> Any:
        """(A keyed stream cannot be broadcast: every record goes to every subtask.)"""
        raise TypeError(
            "broadcast: a keyed stream cannot be the broadcast side (its records go to the "
            "subtask of their key, a broadcast stream's to every one): broadcast the stream "
            "before key_by"
        )

    def reduce(
        self, fn: Callable[[Any, Any], Any], *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        """For every record, as it comes, emit ``fn(previous result of its key, record)``, which
        becomes the key's result (the first record of a key is emitted as it is). The results
        are keyed state: checkpointed, and restored after a failure or at another
        parallelism."""
        _callable(fn, "reduce")
        logic = RollingLogic(Rolling.REDUCE, self.key, fn=fn)
        return self.transform(f"reduce({function_name(fn)})", logic, name=name, on_error=on_error)

    # The rolling aggregations (Flink's names, ``sum`` ..., are aliases). An operator's label
    # is Flink's name, ``sum(value)``, whichever is called: an unnamed operator keeps its id
    # (the state in checkpoints made before the ``running_`` names).

    def running_sum(
        self, field: str, *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        """For every record, as it comes: the record with ``field`` replaced by the sum of
        ``field`` over its key's records so far (this one included). One record out for every
        record in; the running sums are keyed state, checkpointed, and restored after a
        failure or at another parallelism.

        :param field: a column of numbers (refused now if the stream's columns are known and
            it is not one of them, or holds no numbers).
        :param name: the operator's stable id in checkpoints, and its name in messages.
        :param on_error: what a record whose ``field`` is missing or no number (a bool is
            none) does: ``"fail"`` the job, or go to the ``"dead_letter"`` output (nothing is
            emitted for it, and its key's sum stays as it was)."""
        return self._rolling(Rolling.SUM, field, name, on_error)

    def running_min(
        self, field: str, *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        """For every record, as it comes: the record with ``field`` replaced by the smallest
        ``field`` of its key's records so far (this one included). Otherwise as
        :meth:`running_sum`."""
        return self._rolling(Rolling.MIN, field, name, on_error)

    def running_max(
        self, field: str, *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        """For every record, as it comes: the record with ``field`` replaced by the largest
        ``field`` of its key's records so far (this one included). Otherwise as
        :meth:`running_sum`."""
        return self._rolling(Rolling.MAX, field, name, on_error)

    def running_mean(
        self, field: str, *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        """For every record, as it comes: the record with ``field`` replaced by the mean of
        ``field`` over its key's records so far (this one included), a float. The state of a
        key is its sum and its count (checkpointed and restored as :meth:`running_sum`'s).
        Otherwise as :meth:`running_sum`."""
        return self._rolling(Rolling.MEAN, field, name, on_error)

    def running_count(self, *, name: str | None = None, on_error: OnError = "fail") -> DataStream:
        """For every record, as it comes: the record with a ``count`` field (replacing one it
        has) holding the number of its key's records so far, this one included (1 for the
        first). ``on_error``: what a record whose key cannot be read does. Otherwise as
        :meth:`running_sum`."""
        stream = self.transform(
            "count", RollingLogic(Rolling.COUNT, self.key), name=name, on_error=on_error
        )
        stream.schema = with_count(self.stream.schema)
        return stream

    def sum(
        self, field: str | int, *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        """Flink's name of :meth:`running_sum` (the same operator). A field given by its
        position in tuple or list records (an ``int``) is deprecated."""
        return self._rolling(Rolling.SUM, _column(field, "sum"), name, on_error)

    def min(
        self, field: str | int, *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        """Flink's name of :meth:`running_min` (the same operator). A field given by its
        position in tuple or list records (an ``int``) is deprecated."""
        return self._rolling(Rolling.MIN, _column(field, "min"), name, on_error)

    def max(
        self, field: str | int, *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        """Flink's name of :meth:`running_max` (the same operator). A field given by its
        position in tuple or list records (an ``int``) is deprecated."""
        return self._rolling(Rolling.MAX, _column(field, "max"), name, on_error)

    def count(self, *, name: str | None = None, on_error: OnError = "fail") -> DataStream:
        """Flink's name of :meth:`running_count` (the same operator)."""
        return self.running_count(name=name, on_error=on_error)

    def _rolling(
        self, how: Rolling, field: str | _Position, name: str | None, on_error: OnError
    ) -> DataStream:
        if isinstance(field, _Position):
            column: str | int = field.index
        elif isinstance(field, str) and field:
            column = field
            numeric_column(self.stream.schema, field, f"{how}({field!r})", how)
        else:
            raise TypeError(f"running_{how} takes a column name, not {field!r}")
        logic = RollingLogic(how, self.key, column)
        stream = self.transform(f"{how}({column})", logic, name=name, on_error=on_error)
        stream.schema = self.stream.schema  # (the record, its field replaced: a mean's by a float)
        if how is Rolling.MEAN and isinstance(column, str):
            stream.schema = with_float(stream.schema, column)
        return stream

    def window(
        self,
        assigner: Tumbling | Sliding | Session,
        *,
        allowed_lateness: Any = 0,
        time: TimeDomain = "event",
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


@dataclass(frozen=True)
class _Position:
    """A field given by its position in tuple or list records (deprecated)."""

    index: int


def _column(field: str | int, how: str) -> str | _Position:
    """The field of Flink's ``sum``, ``min``, ``max``: a column name, or a position (which
    warns: deprecated)."""
    if isinstance(field, int) and not isinstance(field, bool):
        warnings.warn(
            f"{how}({field}): a field given by its position is deprecated: make the records "
            f"dicts (.map(...)) and name the column: running_{how}('column')",
            DeprecationWarning,
            stacklevel=3,
        )
        return _Position(field)
    if isinstance(field, str):
        return field
    raise TypeError(f"{how} takes a column name, not {field!r}")
