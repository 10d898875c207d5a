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

import os
import re
import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Unpack

import pyarrow as pa

from cutline.api.columns import check_flat, has_column
from cutline.api.dataflow import Dataflow
from cutline.api.event_time import (
    EventTime,
    OldEventTimeKeywords,
    common_time,
    event_time_of,
    strategy,
)
from cutline.api.joins import JoinedStream, Joins
from cutline.api.outputs import Outputs
from cutline.api.settings import location
from cutline.api.window_all import ALL
from cutline.connectors.sink import FunctionSink, Sink
from cutline.runtime.eventtime.assign import AssignTimestampsLogic
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.timers import TimeDomain
from cutline.runtime.eventtime.timestamps import TimeColumn
from cutline.runtime.graph import Edge, GraphError, Operator
from cutline.runtime.io.file_formats import (
    JSONL,
    CsvFormat,
    OutputFormat,
    ParquetCompression,
    ParquetFormat,
)
from cutline.runtime.io.formats import CsvOptions
from cutline.runtime.io.partitions import check_columns, check_schema
from cutline.runtime.io.sinks import CollectSink, FileSink
from cutline.runtime.operators import (
    FilterLogic,
    FlatMapLogic,
    Logic,
    MapBatchesLogic,
    MapLogic,
    OnError,
    PassLogic,
    function_name,
)
from cutline.runtime.sink_operator import SinkLogic

if TYPE_CHECKING:
    from cutline.api.connected import BroadcastStream, ConnectedStreams
    from cutline.api.keyed import KeyedStream
    from cutline.api.windowed import WindowedStream


class _Operators:
    """The operators of :class:`DataStream` and :class:`KeyedStream` alike: each is a
    :meth:`transform` (on a keyed stream, of records partitioned by key: every batch holds only
    keys of one subtask)."""

    def transform(
        self, label: str, logic: Logic, *, name: str | None = None, on_error: OnError = "fail"
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
        self, fn: Callable[[Any], Any], *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        """One record out for every record in: ``fn(record)``."""
        return self.transform(*_per_record("map", MapLogic, fn), name=name, on_error=on_error)

    def flat_map(
        self,
        fn: Callable[[Any], Iterable[Any]],
        *,
        name: str | None = None,
        on_error: OnError = "fail",
    ) -> DataStream:
        """Any number of records out for every record in: ``fn(record)`` returns an iterable."""
        return self.transform(
            *_per_record("flat_map", FlatMapLogic, fn), name=name, on_error=on_error
        )

    def filter(
        self, fn: Callable[[Any], bool], *, name: str | None = None, on_error: OnError = "fail"
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
        on_error: OnError = "fail",
    ) -> DataStream:
        """The vectorized path: ``fn`` gets a ``pyarrow.RecordBatch`` and returns a batch or
        table. (Records that are dicts are turned into a batch first.)"""
        return self.transform(
            *_per_record("map_batches", MapBatchesLogic, fn), name=name, on_error=on_error
        )


class DataStream(_Operators, Outputs, Joins):
    """A stream of records: the output of one operator."""

    def __init__(
        self,
        env: Dataflow,
        operator: Operator,
        event_time: TimeColumn | None = None,
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
        self, label: str, logic: Logic, *, name: str | None = None, on_error: OnError = "fail"
    ) -> DataStream:
        return self._through(Edge(self.operator.uid), label, logic, name, on_error)

    def _schema(self) -> pa.Schema | None:
        return self.schema

    def _through(
        self, edge: Edge, label: str, logic: Logic, name: str | None, on_error: OnError
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
        event_time: EventTime | str | Callable[[Any], Any] | None = None,
        *,
        name: str | None = None,
        on_error: OnError = "fail",
        **deprecated: Unpack[OldEventTimeKeywords],
    ) -> DataStream:
        """This stream's records with event time, and watermarks made from it per subtask:
        for a stream whose time is known only after a ``map`` (a source takes
        ``event_time=`` instead, and makes them per split). Watermarks from upstream stop
        here (but the end's).

        :param event_time: :class:`~cutline.EventTime`, its column or a function of the
            record; or a column's name or a function, short for ``EventTime(it)``. Its
            ``idle_timeout`` left out is never.
        :param name: the operator's name (and uid, which checkpoints know it by).
        :param on_error: a record without event time (or whose function fails) fails the
            job with ``"fail"``, or goes to the dead letters with ``"dead_letter"``, as does
            then a record whose time jumps past ``EventTime(max_jump=)`` (with ``"fail"`` it
            is warned about, and kept).
        :param deprecated: ``max_out_of_orderness=``, ``idle_timeout=``,
            ``event_time_unit=``, ``watermarks=``, and ``column_or_fn=`` (the first
            argument's name before): deprecated, give them in :class:`~cutline.EventTime`.
        """
        what = name or "assign_timestamps"
        old: dict[str, Any] = dict(deprecated)
        if "column_or_fn" in old:
            if event_time is not None:
                raise TypeError(f"{what}: give the event time once (column_or_fn= is its old name)")
            event_time = old.pop("column_or_fn")
            warnings.warn(
                "assign_timestamps(column_or_fn=...) is deprecated: pass the column or "
                "EventTime(...) as the first argument",
                DeprecationWarning,
                stacklevel=2,
            )
        if event_time is None:
            raise TypeError(
                f"{what}: assign_timestamps needs the event time: EventTime('column', ...), "
                "a column's name or a function of the record"
            )
        time = event_time_of(what, event_time, old, written="assign_timestamps({})", functions=True)
        assert time is not None
        if time.column is not None:
            has_column(self.schema, time.column, what)
        made = strategy(what, time, self.schema, functions=True)
        assert made is not None
        given = time.column_or_function
        function = None if isinstance(given, str) else given
        label = f"assign_timestamps({time.label})"
        logic = AssignTimestampsLogic(made, function)
        stream = self.transform(label, logic, name=name, on_error=on_error)
        stream.event_time = made.column
        stream.schema = self.schema if function is None else None
        return stream

    def key_by(self, key: str | Callable[[Any], Hashable]) -> KeyedStream:
        """Partition by key: a column name (records are dicts or columns) or a function."""
        if not (isinstance(key, str) or callable(key)):
            raise TypeError(f"key_by takes a column name or a function, not {key!r}")
        from cutline.api.keyed import KeyedStream  # (it builds on this module)

        if isinstance(key, str):
            has_column(self.schema, key, f"key_by({key!r})")
        return KeyedStream(self, key)

    def broadcast(self) -> BroadcastStream:
        """This stream as the broadcast side of a :meth:`connect`: every record goes to every
        subtask of the operator that reads it (the rules every subtask needs)."""
        from cutline.api.connected import BroadcastStream

        return BroadcastStream(self)

    def connect(self, other: BroadcastStream) -> ConnectedStreams:
        """This stream with a broadcast one, in one operator
        (:class:`~cutline.BroadcastProcessFunction`): ``other`` is ``stream.broadcast()``.
        Each subtask reads its part of this stream and every record of ``other``. (Two keyed
        streams connect with :meth:`KeyedStream.connect`.)"""
        from cutline.api.connected import connect_broadcast

        return connect_broadcast(self, other)

    def window_all(
        self,
        assigner: Tumbling | Sliding | Session,
        *,
        allowed_lateness: Any = 0,
        time: TimeDomain = "event",
        early: Any = None,
        early_records: int | None = None,
    ) -> WindowedStream:
        """Windows of the whole stream, not per key (Flink's ``windowAll``): each window's
        result is one record, ``window_start``, ``window_end`` and the result (a ``process``
        function is given ``None`` as the key). Every record goes to one subtask of the
        window operator, as in Flink: windows of a key are the way to scale. Otherwise as
        :meth:`KeyedStream.window`."""
        from cutline.api.keyed import KeyedStream  # (it builds on this module)

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

    def write_parquet(
        self,
        path: str | os.PathLike[str],
        *,
        compression: ParquetCompression = "snappy",
        partition_by: Sequence[str] | None = None,
        name: str | None = None,
    ) -> None:
        """Write the records to Parquet files in the directory ``path`` (a local path or any
        fsspec URL), **exactly once**: each subtask writes its records since the last
        checkpoint into a part file under ``path/_pending`` (which readers skip: its name
        starts with ``_``) and moves it into ``path`` when the checkpoint that covers them
        completes; after a failure, the parts of the restored checkpoint are published (once)
        and the later ones deleted. A part file is named ``part-<subtask>-<checkpoint>-...``;
        a checkpoint without records of a subtask makes none.

        :param compression: the files' codec: ``"snappy"`` (the default), ``"zstd"``,
            ``"gzip"``, ``"brotli"``, ``"lz4"`` or ``"none"``.
        :param partition_by: columns whose values sort the records into Hive-style folders,
            ``path/<column>=<value>/`` (nested in the order given), the files there without
            those columns, as :meth:`write_delta` does: ``pyarrow.dataset`` (with
            ``partitioning="hive"``), Spark and DuckDB read them back as columns. A column of
            text, integers, bools or dates (``YYYY-MM-DD``); a value is percent-encoded in
            the folder's name (``a%2Fb``), a null is ``__HIVE_DEFAULT_PARTITION__``. A column
            the records are known not to have, or of another type, is refused here; one found
            missing while the job runs fails it.
        :param name: the sink's stable id in checkpoints (and its name in messages)."""
        what = f"write_parquet({location(path)})"
        columns = check_columns(partition_by or (), what)
        check_schema(self.schema, columns, what)
        try:
            fmt = ParquetFormat(compression)
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
        self._file_sink(path, fmt, name, columns)

    def write_csv(
        self,
        path: str | os.PathLike[str],
        *,
        delimiter: str = ",",
        header: bool = True,
        null_value: str = "",
        name: str | None = None,
    ) -> None:
        """Write the records to CSV files in the directory ``path``, **exactly once**, as
        :meth:`write_parquet` (part files published when the checkpoint that covers them
        completes). Each part file starts with a line of the column names (``header``), then
        a line per record; a value that holds the delimiter, a quote or a line break is
        quoted with ``"`` (a quote in it doubled); times as ISO 8601. What it writes,
        :meth:`~cutline.StreamEnvironment.read_csv` reads back with the same
        ``delimiter``, ``header`` and ``null_values=[null_value]``. Records of nested values
        (lists, dicts) cannot be written: refused here when the stream's columns are known,
        else they fail the job.

        :param delimiter: the field separator (one character, not a quote or a line break).
        :param header: whether each file's first line names the columns.
        :param null_value: what a null is written as (the empty field by default; it must not
            hold the delimiter, a quote or a line break).
        :param name: the sink's stable id in checkpoints (and its name in messages)."""
        what = f"write_csv({location(path)})"
        try:
            options = CsvOptions(delimiter=delimiter, header=header, null_values=(null_value,))
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
        if not isinstance(null_value, str) or any(c in null_value for c in f'"\r\n{delimiter}'):
            raise ValueError(
                f"{what}: null_value must be text without the delimiter, a quote or a line "
                f"break, not {null_value!r}"
            )
        check_flat(self.schema, what)
        self._file_sink(path, CsvFormat(options), name)

    def write_jsonl(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        """Write the records to JSON-lines files in the directory ``path`` (a JSON object per
        line, values JSON cannot hold as their text), **exactly once**, as
        :meth:`write_parquet`."""
        self._file_sink(path, JSONL, name)

    def _file_sink(
        self,
        path: str | os.PathLike[str],
        fmt: OutputFormat,
        name: str | None,
        partition_by: tuple[str, ...] = (),
    ) -> None:
        where = location(path)
        what = f"write_{fmt}({where})"
        self.env._check_output(where, what)
        sink = FileSink(where, fmt, self.env.settings.storage_options, partition_by)
        operator = self.transform(what, SinkLogic(sink), name=name).operator
        self.env._outputs[operator.uid] = where

    def sink_to(
        self,
        sink: Sink | Callable[[Any], Any],
        *,
        name: str | None = None,
        on_error: OnError = "fail",
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


class JoinResult(DataStream, JoinedStream):
    """The results of a join; :meth:`late` is the side output of each input's late records."""


def _per_record(what: str, logic: Callable[[Any], Logic], fn: Any) -> tuple[str, Logic]:
    """The label and logic of a ``map``, ``flat_map``, ``filter`` or ``map_batches``
    (``what``) of ``fn``."""
    _callable(fn, what)
    return f"{what}({function_name(fn)})", logic(fn)


def _callable(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} takes a function, not {type(fn).__name__}")
