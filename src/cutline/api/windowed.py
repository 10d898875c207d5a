"""A keyed stream cut into windows: :class:`WindowedStream` (say what each window computes)
and :class:`WindowedResult` (its results, and the side output of its late records)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cutline.api.columns import numeric_column, window_result_schema
from cutline.api.streams import DataStream, _callable
from cutline.api.window_all import ALL_COLUMN, with_window_all_key, without_window_all_key
from cutline.runtime.durations import milliseconds
from cutline.runtime.eventtime.aggregations import AggregateFunction, Aggregation, Kind
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling, Window
from cutline.runtime.eventtime.logic import WindowLogic
from cutline.runtime.eventtime.output import LATE
from cutline.runtime.eventtime.timers import TimeDomain
from cutline.runtime.eventtime.timestamps import EventTimeError, TimeColumn
from cutline.runtime.graph import Edge
from cutline.runtime.operators import MapBatchesLogic, OnError, PassLogic, function_name

if TYPE_CHECKING:
    from cutline.api.keyed import KeyedStream


class WindowedStream:
    """A keyed stream cut into windows (``keyed.window(...)``): say what each window
    computes. Every method returns a :class:`WindowedResult`: one record per key and window
    (``key, window_start, window_end``, then the result), whose ``.late()`` is the stream of
    the records too late for their windows."""

    def __init__(
        self,
        keyed: KeyedStream,
        assigner: Tumbling | Sliding | Session,
        event_time: TimeColumn,
        lateness: int,
        time: TimeDomain = "event",
    ) -> None:
        self.keyed = keyed
        self.assigner = assigner
        self.event_time = event_time
        self.lateness = lateness
        self.time = time

    def count(self, *, name: str | None = None, on_error: OnError = "fail") -> WindowedResult:
        """The number of records of each window, in a ``count`` column. ``on_error``: what
        a record without event time (or key) does: ``"fail"`` or ``"dead_letter"``."""
        return self._apply(Aggregation(Kind.COUNT), "count", name, on_error)

    def sum(
        self, field: str, *, name: str | None = None, on_error: OnError = "fail"
    ) -> WindowedResult:
        """The sum of ``field`` over each window, in a column of that name (a record whose
        ``field`` is no number fails, or goes to the dead letters)."""
        return self._builtin("sum", field, name, on_error)

    def min(
        self, field: str, *, name: str | None = None, on_error: OnError = "fail"
    ) -> WindowedResult:
        """The smallest ``field`` of each window, in a column of that name (a record whose
        ``field`` is no number fails, or goes to the dead letters)."""
        return self._builtin("min", field, name, on_error)

    def max(
        self, field: str, *, name: str | None = None, on_error: OnError = "fail"
    ) -> WindowedResult:
        """The largest ``field`` of each window, in a column of that name (a record whose
        ``field`` is no number fails, or goes to the dead letters)."""
        return self._builtin("max", field, name, on_error)

    def mean(
        self, field: str, *, name: str | None = None, on_error: OnError = "fail"
    ) -> WindowedResult:
        """The mean of ``field`` over each window, a float in a column of that name (a record
        whose ``field`` is no number fails, or goes to the dead letters)."""
        return self._builtin("mean", field, name, on_error)

    def aggregate(
        self, fn: AggregateFunction, *, name: str | None = None, on_error: OnError = "fail"
    ) -> WindowedResult:
        """An incremental aggregation (an :class:`AggregateFunction`: ``create_accumulator``,
        ``add``, ``merge``, ``get_result``); a dict result's fields go into the output
        record, another value into a ``result`` field."""
        if not isinstance(fn, AggregateFunction):
            raise TypeError(
                "aggregate takes an instance of an AggregateFunction subclass, not "
                f"{type(fn).__name__}"
            )
        label = f"aggregate({type(fn).__name__})"
        return self._apply(Aggregation(Kind.AGGREGATE, fn=fn), label, name, on_error)

    def reduce(
        self, fn: Callable[[Any, Any], Any], *, name: str | None = None, on_error: OnError = "fail"
    ) -> WindowedResult:
        """``fn(a, b)`` folds each window's records into one (a dict: the output record,
        with the key, ``window_start`` and ``window_end``)."""
        _callable(fn, "reduce")
        label = f"reduce({function_name(fn)})"
        return self._apply(Aggregation(Kind.REDUCE, fn=fn), label, name, on_error)

    def process(
        self,
        fn: Callable[[Any, Window, list[Any]], Iterable[Any] | None],
        *,
        name: str | None = None,
        on_error: OnError = "fail",
    ) -> WindowedResult:
        """``fn(key, window, records)`` with all of a window's records once it fires
        (``window.start``, ``window.end``); it returns (or yields) the records to emit."""
        _callable(fn, "process")
        label = f"process({function_name(fn)})"
        return self._apply(Aggregation(Kind.PROCESS, fn=fn), label, name, on_error)

    def process_batches(
        self,
        fn: Callable[[Any, Window, pa.Table], Any],
        *,
        name: str | None = None,
        on_error: OnError = "fail",
    ) -> WindowedResult:
        """The vectorized ``process``: ``fn(key, window, table)`` gets all of a window's
        records as one ``pyarrow.Table`` once it fires, and returns a table, a batch or records
        (or ``None``). The window keeps its records as Arrow batches (records that are dicts
        are turned into batches first)."""
        _callable(fn, "process_batches")
        label = f"process_batches({function_name(fn)})"
        return self._apply(Aggregation(Kind.PROCESS_BATCHES, fn=fn), label, name, on_error)

    def _builtin(
        self, kind: str, field: str, name: str | None, on_error: OnError
    ) -> WindowedResult:
        if not isinstance(field, str) or not field:
            raise TypeError(f"{kind} of a window takes a column name, not {field!r}")
        what = f"window({self.assigner}).{kind}({field!r})"
        numeric_column(self.keyed.stream.schema, field, what, kind)
        return self._apply(Aggregation(Kind(kind), field), f"{kind}({field})", name, on_error)

    whole = False
    """Windows of the whole stream (``window_all``)."""
    early: int | None = None
    """Every this many ms of processing time, the open windows' results so far."""
    early_records: int | None = None
    """Every this many records of a window (per key), its result so far."""

    def _apply(
        self, aggregation: Aggregation, what: str, name: str | None, on_error: OnError = "fail"
    ) -> WindowedResult:
        from cutline.api.keyed import KeyedStream  # (it builds on this module)

        keyed = self.keyed
        if self.whole and aggregation.builtin:  # (a key column: the vectorized path)
            source = keyed.stream
            if source.window_all_keyed is None:  # (one for every window_all of the stream)
                source.window_all_keyed = source.map_batches(with_window_all_key)
            keyed = KeyedStream(source.window_all_keyed, ALL_COLUMN)
        logic = WindowLogic(
            self.assigner,
            aggregation,
            keyed.key,
            self.event_time,
            self.lateness,
            self.time,
            early=self.early,
            early_records=self.early_records,
            keyless=self.whole,
        )
        clock = "" if self.time == "event" else ", processing time"
        kind = "window_all" if self.whole else "window"
        label = f"{kind}({self.assigner}{clock}).{what}"
        stream = keyed.transform(label, logic, name=name, on_error=on_error)
        # results carry event time window_end - 1 (Flink's): a second window regroups them
        result_time = TimeColumn("window_end", -1, self.event_time.type, self.event_time.unit)
        schema = None
        if aggregation.builtin and not self.whole:
            schema = window_result_schema(
                keyed.stream.schema, keyed.key, aggregation.kind, aggregation.field, result_time
            )
        result = WindowedResult(stream.env, stream.operator, result_time, schema)
        result.input_schema = self.keyed.stream.schema
        result.marked = keyed.key == ALL_COLUMN
        return result


class WindowedResult(DataStream):
    """The results of a window operator; :meth:`late` is the side output of its late
    records."""

    def late(self, *, name: str | None = None) -> DataStream:
        """The records that came too late for their windows (after the allowed lateness), as
        they came in: write them anywhere. They are counted in the job's statistics either
        way."""
        edge = Edge(self.operator.uid, side=LATE)
        source_time = self.operator.logic.event_time
        logic = MapBatchesLogic(without_window_all_key) if self.marked else PassLogic()
        stream = self._through(edge, "late", logic, name, "fail")
        stream.event_time = source_time
        stream.schema = self.input_schema
        return stream

    input_schema: pa.Schema | None = None
    """The columns of the records it windows (those of :meth:`late`)."""
    marked = False
    """Its records carry :data:`ALL_COLUMN` (``window_all`` of a built-in), which
    :meth:`late` takes off again."""


def _early(windowed: WindowedStream, early: Any, early_records: Any = None) -> WindowedStream:
    """``windowed`` firing early every ``early`` (a duration) and every ``early_records``
    records of a window, when given."""
    if early is not None:
        windowed.early = milliseconds(
            early, f"window({windowed.assigner}): early", keyword="early", error=EventTimeError
        )
    if early_records is not None:
        if type(early_records) is not int or early_records < 1:
            raise ValueError(
                f"window({windowed.assigner}): early_records={early_records!r} must be a "
                "positive integer (a window's result so far every that many of its records)"
            )
        windowed.early_records = early_records
    return windowed
