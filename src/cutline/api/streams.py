"""Building a job's graph: :class:`DataStream`, :class:`KeyedStream`, and the
:class:`Dataflow` that holds their operators.

Every operator is added on one path: :meth:`DataStream.transform` (or
:meth:`KeyedStream.transform`, whose records are partitioned by key) with a *label* (how
messages call it: ``"map(parse)"``) and a picklable :class:`~cutline.runtime.operators.Logic`
(what it does in each subtask). ``map``, ``sum``, ``process``, the sinks and the rest are
that call with a logic of cutline's own, and an operator of a user's own is the same call::

    class Scale(Logic):
        def __init__(self, factor):
            self.factor = factor

        def open(self, ctx, state):
            return ScaleRunning(self.factor)   # a RunningOperator: process(batch) -> batch

    env.from_sequence(0, 100).transform("scale(10)", Scale(10)).collect()

**Operator ids.** Checkpoints know an operator's state by its id. ``name=`` gives the id (and
the name messages use); an unnamed operator's id is its label made safe for file names and a
digest of what makes the operator what it is: its label (its kind and its function's name;
a lambda, which has no name, is told by the constants and names in its code), what a source
reads, and its inputs' ids and partitioning, e.g. ``sum_value-1f0c93ab``. So an
operator keeps its id when operators are added, removed or reordered elsewhere in the job,
and changes it when its own function or anything upstream of it changes: name the stateful
operators you mean to restore across changes. Two unnamed operators that would get one id (a
second ``map(parse)`` on the same stream) are refused here, asking for ``name=``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import pyarrow as pa

from cutline.api.columns import has_column, numeric_column, window_result_schema, with_count
from cutline.api.dataflow import Dataflow
from cutline.api.event_time import common_time, watermark_generator
from cutline.api.outputs import Outputs
from cutline.api.settings import location
from cutline.api.window_all import (
    ALL,
    ALL_COLUMN,
    with_window_all_key,
    without_window_all_key,
)
from cutline.connectors.sink import FunctionSink, Sink
from cutline.runtime.eventtime.aggregations import AggregateFunction, Aggregation, Kind
from cutline.runtime.eventtime.assign import AssignTimestampsLogic
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling, Window
from cutline.runtime.eventtime.logic import WindowLogic
from cutline.runtime.eventtime.output import LATE
from cutline.runtime.eventtime.timestamps import EventTime, EventTimeError, duration_ms
from cutline.runtime.eventtime.watermarks import WatermarkGenerator, WatermarkStrategy
from cutline.runtime.graph import Edge, GraphError, Operator, Partitioning
from cutline.runtime.io.file_formats import JSONL, PARQUET, OutputFormat
from cutline.runtime.io.sinks import CollectSink, FileSink
from cutline.runtime.keyed_operators import KeyedProcessFunction, ProcessLogic, RollingLogic
from cutline.runtime.operators import (
    FilterLogic,
    FlatMapLogic,
    Logic,
    MapBatchesLogic,
    MapLogic,
    PassLogic,
    SinkLogic,
    function_name,
)


class _Operators:
    """The operators of :class:`DataStream` and :class:`KeyedStream` alike: each is a
    :meth:`transform` (on a keyed stream, of records partitioned by key: every batch holds only
    keys of one subtask)."""

    def transform(
        self, label: str, logic: Logic, *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """Add an operator: ``logic`` (a :class:`~cutline.runtime.operators.Logic`) run on
        every subtask's records, returning the stream of what it emits.

        :param label: what messages, dead letters and the progress call it (``"dedupe(id)"``)
            when it has no ``name``; an unnamed operator's id is derived from it (see the
            module's docstring).
        :param logic: picklable; ``logic.open(ctx, state)`` is called in each subtask and
            returns a :class:`~cutline.runtime.operators.RunningOperator` whose ``process(batch)``
            returns the records it emits (or ``None``) and whose ``snapshot(checkpoint_id)``
            returns the state a checkpoint keeps (``state`` at a restore). A keyed logic
            (``keyed = True``, on a :class:`KeyedStream`) keeps its state in a backend of
            the subtask's key groups, as cutline's own keyed operators do.
        :param name: the operator's stable id in checkpoints, and its name in messages.
        :param on_error: ``"fail"`` or ``"dead_letter"`` (what ``ctx.fail(record, exc)``
            does with a record the operator cannot process).
        """
        raise NotImplementedError

    def map(
        self, fn: Callable[[Any], Any], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """One record out for every record in: ``fn(record)``."""
        return self.transform(*_per_record("map", MapLogic, fn), name=name, on_error=on_error)

    def flat_map(
        self, fn: Callable[[Any], Iterable[Any]], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """Any number of records out for every record in: ``fn(record)`` returns an iterable."""
        return self.transform(
            *_per_record("flat_map", FlatMapLogic, fn), name=name, on_error=on_error
        )

    def filter(
        self, fn: Callable[[Any], bool], *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        """The records for which ``fn(record)`` is true."""
        stream = self.transform(
            *_per_record("filter", FilterLogic, fn), name=name, on_error=on_error
        )
        stream.schema = self._schema()
        return stream

    def _schema(self) -> pa.Schema | None:
        """The columns of the records this operator reads (see :mod:`~cutline.api.columns`)."""
        raise NotImplementedError

    def map_batches(
        self,
        fn: Callable[[pa.RecordBatch], pa.RecordBatch | pa.Table],
        *,
        name: str | None = None,
        on_error: str = "fail",
    ) -> DataStream:
        """The vectorized path: ``fn`` gets a ``pyarrow.RecordBatch`` and returns a batch or
        table. (Records that are dicts are turned into a batch first.)"""
        return self.transform(
            *_per_record("map_batches", MapBatchesLogic, fn), name=name, on_error=on_error
        )


class DataStream(_Operators, Outputs):
    """A stream of records: the output of one operator."""

    def __init__(
        self,
        env: Dataflow,
        operator: Operator,
        event_time: EventTime | None = None,
        schema: pa.Schema | None = None,
    ):
        self.env = env
        self.operator = operator
        self.event_time = event_time
        """Where its records' event time is (``None``: it has none; see ``event_time=`` of the
        sources, :meth:`assign_timestamps`). Operators that change records keep it: a record
        that lost the column fails in the window that needs it."""
        self.schema = schema
        """Its records' columns, when known as the job is built (:mod:`~cutline.api.columns`:
        a key or a field that is not there is refused then); ``None``: unknown."""
        self.window_all_keyed: DataStream | None = None
        """Its records with the key column of ``window_all``, once a built-in needs it."""

    def transform(
        self, label: str, logic: Logic, *, name: str | None = None, on_error: str = "fail"
    ) -> DataStream:
        return self._through(Edge(self.operator.uid), label, logic, name, on_error)

    def _schema(self) -> pa.Schema | None:
        return self.schema

    def _through(
        self, edge: Edge, label: str, logic: Logic, name: str | None, on_error: str
    ) -> DataStream:
        """The operator ``label`` reading this stream over ``edge``."""
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"transform: the label must be a non-empty string, not {label!r}")
        if not isinstance(logic, Logic):
            raise TypeError(
                f"{label}: transform takes a cutline.runtime.operators.Logic, not "
                f"{type(logic).__name__}"
            )
        operator = self.env._add(label, logic, [edge], name, on_error)
        return DataStream(self.env, operator, self.event_time)

    def assign_timestamps(
        self,
        column_or_fn: str | Callable[[Any], Any],
        *,
        max_out_of_orderness: Any = 0,
        idle_timeout: Any = None,
        event_time_unit: str | None = None,
        watermarks: WatermarkGenerator | None = None,
        name: str | None = None,
    ) -> DataStream:
        """This stream's records with event time, and watermarks made from it (for a stream
        after a ``map``; a source takes ``event_time=`` instead, per split).

        :param column_or_fn: the column holding the event time (an Arrow timestamp, a
            ``datetime`` or integers of epoch milliseconds, or of ``event_time_unit``), or a
            function of the record that
            returns it (records must be dicts: it is stored in their ``event_time`` field).
        :param max_out_of_orderness: how late a record may come after a later one (a duration:
            ``"2s"``, a ``timedelta`` or milliseconds). Each subtask makes its own watermarks
            from the records it sees; those from upstream stop here (but the end's).
        :param idle_timeout: a subtask that saw no record that long (processing time) stops
            holding the watermark back downstream until it has records again (default: never).
        """
        what = name or "assign_timestamps"
        bound = duration_ms(max_out_of_orderness or 0, f"{what}: max_out_of_orderness", zero=True)
        if isinstance(column_or_fn, str):
            if not column_or_fn:
                raise ValueError(f"{what}: the event-time column must be a non-empty name")
            column, fn, label = column_or_fn, None, f"assign_timestamps({column_or_fn})"
        elif callable(column_or_fn):
            column, fn = "event_time", column_or_fn
            label = f"assign_timestamps({function_name(column_or_fn)})"
        else:
            raise TypeError(
                f"{what}: assign_timestamps takes a column name or a function, not "
                f"{type(column_or_fn).__name__}"
            )
        idle = None if idle_timeout is None else duration_ms(idle_timeout, f"{what}: idle_timeout")
        generator = watermark_generator(what, watermarks, bound)
        try:
            strategy = WatermarkStrategy(
                EventTime(column, unit=event_time_unit),
                bound,
                None if idle is None else idle / 1000,
                generator=generator,
            )
            if fn is None:
                has_column(self.schema, column, what)
                if self.schema is not None:
                    found = self.schema.field(column).type
                    typed = EventTime(column, 0, found, event_time_unit)
                    strategy = dataclasses.replace(strategy, event_time=typed)
        except EventTimeError as exc:
            raise EventTimeError(f"{what}: {exc}") from None
        stream = self.transform(label, AssignTimestampsLogic(strategy, fn), name=name)
        stream.event_time = strategy.event_time
        stream.schema = self.schema if fn is None else None
        return stream

    def key_by(self, key: str | Callable[[Any], Hashable]) -> KeyedStream:
        """Partition by key: a column name (records are dicts or columns) or a function."""
        if not (isinstance(key, str) or callable(key)):
            raise TypeError(f"key_by takes a column name or a function, not {key!r}")
        if isinstance(key, str):
            has_column(self.schema, key, f"key_by({key!r})")
        return KeyedStream(self, key)

    def window_all(
        self,
        assigner: Tumbling | Sliding | Session,
        *,
        allowed_lateness: Any = 0,
        time: str = "event",
        early: Any = None,
        early_records: int | None = None,
    ) -> WindowedStream:
        """Windows of the whole stream, not per key (Flink's ``windowAll``): each window's
        result is one record, ``window_start``, ``window_end`` and the result (a ``process``
        function is given ``None`` as the key). Every record goes to one subtask of the
        window operator, as in Flink: windows of a key are the way to scale. Otherwise as
        :meth:`KeyedStream.window`."""
        windowed = KeyedStream(self, ALL).window(
            assigner,
            allowed_lateness=allowed_lateness,
            time=time,
            early=early,
            early_records=early_records,
        )
        windowed.whole = True
        return windowed

    def union(self, *others: DataStream, name: str | None = None) -> DataStream:
        """The records of this stream and of ``others``, interleaved."""
        streams = [self, *others]
        if not others:
            raise ValueError("union needs at least one other stream")
        if any(s.env is not self.env for s in streams):
            raise ValueError("union of streams from different StreamEnvironments")
        if len({s.operator.uid for s in streams}) != len(streams):
            raise ValueError("union of a stream with itself: every record would come twice")
        inputs = [Edge(s.operator.uid) for s in streams]
        event_time = common_time([s.event_time for s in streams])
        schemas = [s.schema for s in streams]
        same = schemas[0] if all(x is not None and x.equals(schemas[0]) for x in schemas) else None
        operator = self.env._add("union", PassLogic(), inputs, name)
        return DataStream(self.env, operator, event_time, same)

    def iterate(
        self,
        body: Callable[[DataStream], tuple[DataStream, DataStream]],
        *,
        name: str | None = None,
    ) -> DataStream:
        """A loop, for iterative algorithms (label propagation, graph search, PageRank).

        ``body(loop)`` receives the stream of records entering the loop: this stream's records
        and every record fed back. It returns ``(feedback, output)``: ``feedback`` goes round
        to the loop's head again, ``output`` leaves the loop (the value returned here). A
        record circulates until the body stops feeding it back. Checkpoints of every mode stay
        consistent: records that travel the back edge while a checkpoint goes round are
        stored with it and replayed after a restore; the final checkpoint of bounded input
        waits until nothing circulates any more.
        """
        if not callable(body):
            raise TypeError(f"iterate needs a function of the loop's stream, not {body!r}")
        head = self.env._add("iterate", PassLogic(), [Edge(self.operator.uid)], name)
        returned = body(DataStream(self.env, head))
        if (
            not isinstance(returned, tuple)
            or len(returned) != 2
            or not all(isinstance(s, DataStream) for s in returned)
        ):
            raise TypeError(
                f"the body of iterate must return (feedback, output), two streams, not {returned!r}"
            )
        feedback, output = returned
        if feedback.env is not self.env or output.env is not self.env:
            raise ValueError("iterate: the body returned a stream of another StreamEnvironment")
        try:
            self.env.graph.close_loop(head.uid, feedback.operator.uid)
        except GraphError as exc:
            raise ValueError(f"iterate: {exc}") from None
        return output

    def write_parquet(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        """Exactly-once Parquet output: part files appear in ``path`` when the checkpoint that
        covers them completes (pending ones wait in ``path/_pending``, which readers skip)."""
        self._file_sink(location(path), PARQUET, name)

    def write_jsonl(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        """Exactly-once JSON-lines output (as :meth:`write_parquet`)."""
        self._file_sink(location(path), JSONL, name)

    def _file_sink(self, path: str, fmt: OutputFormat, name: str | None) -> None:
        what = f"write_{fmt}({path})"
        self.env._check_output(path, what)
        sink = FileSink(path, fmt, self.env.settings.storage_options)
        operator = self.transform(what, SinkLogic(sink), name=name).operator
        self.env._outputs[operator.uid] = path

    def sink_to(
        self, sink: Sink | Callable[[Any], Any], *, name: str | None = None, on_error: str = "fail"
    ) -> None:
        """Write the records to ``sink``: a connector of the API (exactly once when its
        writer commits as the API says), or a function ``fn(batch)`` called for every batch
        (Arrow, or a list of records): **at least once**, since after a failure the batches
        since the restored checkpoint come again. ``name`` it to keep its id whatever the
        function. ``on_error``: for a record the writer refuses (``RecordError``)."""
        if not isinstance(sink, Sink):
            _callable(sink, "sink_to")
        label = f"sink_to({type(sink).__name__ if isinstance(sink, Sink) else function_name(sink)})"
        sink = sink if isinstance(sink, Sink) else FunctionSink(sink)
        self.transform(label, SinkLogic(sink), name=name, on_error=on_error)

    def collect(self, name: str = "collect") -> None:
        """Keep the records: ``execute()`` returns them (``result.output``), exactly once."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"collect name {name!r}: use letters, digits, '_', '-' and '.'")
        if name in self.env._collect:
            raise ValueError(f"two collect sinks are named {name!r}")
        logic = SinkLogic(CollectSink(name))  # (in the checkpoint directory, when the job runs)
        operator = self.transform(f"collect({name})", logic).operator
        self.env._collect[name] = operator.uid


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
        lateness = duration_ms(allowed_lateness or 0, "allowed_lateness", zero=True)
        if time == "processing":
            if lateness:
                raise ValueError("allowed_lateness is for event time: no record is late here")
            clock = EventTime("processing_time")
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
                    f"the unit of the times of {event_time.column!r} (event_time_unit='s'): "
                    "window_start and window_end could not say it"
                )
        return _early(WindowedStream(self, assigner, event_time, lateness), early, early_records)


class WindowedStream:
    """A keyed stream cut into windows (``keyed.window(...)``): say what each window
    computes. Every method returns a :class:`WindowedResult`: one record per key and window
    (``key, window_start, window_end``, then the result), whose ``.late()`` is the stream of
    the records too late for their windows."""

    def __init__(
        self,
        keyed: KeyedStream,
        assigner: Tumbling | Sliding | Session,
        event_time: EventTime,
        lateness: int,
        time: str = "event",
    ) -> None:
        self.keyed = keyed
        self.assigner = assigner
        self.event_time = event_time
        self.lateness = lateness
        self.time = time

    def count(self, *, name: str | None = None, on_error: str = "fail") -> WindowedResult:
        """The number of records of each window, in a ``count`` column. ``on_error``: what
        a record without event time (or key) does: ``"fail"`` or ``"dead_letter"``."""
        return self._apply(Aggregation(Kind.COUNT), "count", name, on_error)

    def sum(self, field: str, *, name: str | None = None, on_error: str = "fail") -> WindowedResult:
        """The sum of ``field`` over each window, in a column of that name (a record whose
        ``field`` is no number fails, or goes to the dead letters)."""
        return self._builtin("sum", field, name, on_error)

    def min(self, field: str, *, name: str | None = None, on_error: str = "fail") -> WindowedResult:
        """The smallest ``field`` of each window."""
        return self._builtin("min", field, name, on_error)

    def max(self, field: str, *, name: str | None = None, on_error: str = "fail") -> WindowedResult:
        """The largest ``field`` of each window."""
        return self._builtin("max", field, name, on_error)

    def mean(
        self, field: str, *, name: str | None = None, on_error: str = "fail"
    ) -> WindowedResult:
        """The mean of ``field`` over each window (a float)."""
        return self._builtin("mean", field, name, on_error)

    def aggregate(
        self, fn: AggregateFunction, *, name: str | None = None, on_error: str = "fail"
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
        self, fn: Callable[[Any, Any], Any], *, name: str | None = None, on_error: str = "fail"
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
        on_error: str = "fail",
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
        on_error: str = "fail",
    ) -> WindowedResult:
        """The vectorized ``process``: ``fn(key, window, table)`` gets all of a window's
        records as one ``pyarrow.Table`` once it fires, and returns a table, a batch or records
        (or ``None``). The window keeps its records as Arrow batches (records that are dicts
        are turned into batches first)."""
        _callable(fn, "process_batches")
        label = f"process_batches({function_name(fn)})"
        return self._apply(Aggregation(Kind.PROCESS_BATCHES, fn=fn), label, name, on_error)

    def _builtin(self, kind: str, field: str, name: str | None, on_error: str) -> WindowedResult:
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
        self, aggregation: Aggregation, what: str, name: str | None, on_error: str = "fail"
    ) -> WindowedResult:
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
        result_time = EventTime("window_end", -1, self.event_time.type, self.event_time.unit)
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


def _per_record(what: str, logic: Callable[[Any], Logic], fn: Any) -> tuple[str, Logic]:
    """The label and logic of a ``map``, ``flat_map``, ``filter`` or ``map_batches``
    (``what``) of ``fn``."""
    _callable(fn, what)
    return f"{what}({function_name(fn)})", logic(fn)


def _callable(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} takes a function, not {type(fn).__name__}")


def _early(windowed: WindowedStream, early: Any, early_records: Any = None) -> WindowedStream:
    """``windowed`` firing early every ``early`` (a duration) and every ``early_records``
    records of a window, when given."""
    if early is not None:
        windowed.early = duration_ms(early, f"window({windowed.assigner}): early")
    if early_records is not None:
        if type(early_records) is not int or early_records < 1:
            raise ValueError(
                f"window({windowed.assigner}): early_records={early_records!r} must be a "
                "positive integer (a window's result so far every that many of its records)"
            )
        windowed.early_records = early_records
    return windowed
