"""The sources of a job: integers, Parquet, CSV and JSON-lines files, and any connector.

Each source is an operator without inputs whose positions (per split: a slice of the
integers, one file, a partition) go into every checkpoint, so that a restore reads on exactly
where the checkpoint was taken, at any parallelism. What a source reads is part of its id
unless it is named (``name=``): its range, the files and how they are read, a connector's
class and its ``repr``.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Unpack

import pyarrow as pa

from cutline.api.dataflow import Dataflow
from cutline.api.event_time import EventTime, OldEventTimeKeywords, event_time_of, strategy
from cutline.api.settings import location
from cutline.api.streams import DataStream
from cutline.connectors.source import Source, SourceError
from cutline.runtime.durations import Duration, seconds
from cutline.runtime.eventtime.watermarks import WatermarkStrategy
from cutline.runtime.io.file_formats import JSONL, PARQUET, CsvFormat, InputFormat
from cutline.runtime.io.formats import CsvOptions, InputWarning
from cutline.runtime.io.sources import FileSource, SequenceSource
from cutline.runtime.operators import OnError
from cutline.runtime.source_operator import SourceLogic


class Sources(Dataflow):
    """The sources of :class:`~cutline.api.StreamEnvironment`: each returns a
    :class:`~cutline.api.DataStream` of what it reads."""

    def from_sequence(
        self,
        start: int = 0,
        end: int | None = None,
        *,
        column: str = "value",
        name: str | None = None,
        rate_limit: float | None = None,
        event_time: EventTime | str | None = None,
        **deprecated: Unpack[OldEventTimeKeywords],
    ) -> DataStream:
        """The integers ``start, start+1, ...`` up to ``end`` (excluded; ``None``: unbounded), as
        records with one column.

        :param rate_limit: at most this many records per second (for the whole source: each of
            its subtasks reads its share), e.g. for a demo or a load test; ``None``: as fast as
            the job takes them.
        :param event_time: :class:`~cutline.EventTime` (or a column's name, short for
            ``EventTime(column)``): watermarks per split.
        :param deprecated: deprecated, the event-time keywords of before
            (:class:`~cutline.api.event_time.OldEventTimeKeywords`): give an ``EventTime``.
        """
        if type(start) is not int or (end is not None and type(end) is not int):
            raise ValueError(f"from_sequence needs integers, got start={start!r}, end={end!r}")
        source = SequenceSource(start, end, column)
        what = name or "from_sequence"
        schema = source.record_schema()
        time = strategy(what, event_time_of(what, event_time, deprecated), schema)
        reads = f"{start}..{end} as {column}"
        return self._source(source, "sequence", reads, name, rate_limit, time=time)

    def from_source(
        self,
        source: Source,
        *,
        name: str | None = None,
        event_time: EventTime | str | None = None,
        rate_limit: float | None = None,
        on_error: OnError = "fail",
        **deprecated: Unpack[OldEventTimeKeywords],
    ) -> DataStream:
        """The records of ``source``, any connector's (:mod:`cutline.connectors`): exactly
        once when its reader reads the same records again from a position. ``name`` it: its
        id is then kept whatever the source's arguments (else its class and ``repr``).

        :param event_time: :class:`~cutline.EventTime` (or a column's name, short for
            ``EventTime(column)``): watermarks per split.
        :param rate_limit: as for :meth:`read_parquet`.
        :param on_error: ``"dead_letter"`` gives the reader a place for the records it cannot
            read (``SourceContext.rejected``), and a record whose time jumps past
            ``EventTime(max_jump=)`` goes there; ``"fail"``: the job fails naming it.
        :param deprecated: deprecated, the event-time keywords of before
            (:class:`~cutline.api.event_time.OldEventTimeKeywords`): give an ``EventTime``."""
        if not isinstance(source, Source):
            raise TypeError(
                f"from_source takes a cutline.connectors.Source, not {type(source).__name__} "
                f"{source!r:.100}"
            )
        label = type(source).__name__
        what = name or label
        self._check_on_error(what, on_error)
        time = event_time_of(what, event_time, deprecated)
        try:
            prepared, notes = source.prepare()  # on the driver, now
        except SourceError as exc:
            raise SourceError(f"{what}: {exc}") from None
        if not isinstance(prepared, Source):
            raise TypeError(f"{what}: prepare() returned {prepared!r:.100}, not a Source")
        for note in notes:
            warnings.warn(f"{what}: {note}", InputWarning, stacklevel=2)
        made = strategy(what, time, prepared.record_schema())
        reads = f"{type(source).__module__}.{type(source).__qualname__} {source!r}"
        return self._source(prepared, label, reads, name, rate_limit, on_error, time=made)

    def read_parquet(
        self,
        path: str | os.PathLike[str],
        *,
        schema: pa.Schema | dict[str, Any] | None = None,
        columns: Sequence[str] | None = None,
        on_error: OnError = "fail",
        name: str | None = None,
        rate_limit: float | None = None,
        event_time: EventTime | str | None = None,
        monitor: Duration | None = None,
        **deprecated: Unpack[OldEventTimeKeywords],
    ) -> DataStream:
        """The records of Parquet files, as Arrow batches with one schema.

        :param path: a directory (its ``.parquet`` and ``.pq`` files), one file, or a glob
            pattern (``"events/2024-*.parquet"``: every file it matches; a directory it
            matches gives its Parquet files); a local path or any fsspec URL. Names starting
            with ``.`` or ``_`` are left out of directories and patterns. The files are sorted
            by name and dealt round-robin to the subtasks, one split each. A path that does
            not exist raises ``SourceError`` here; no input file at all is an empty stream and
            an ``InputWarning`` naming the path and the suffixes looked for.
        :param schema: the columns' types. A ``pyarrow.Schema`` is the whole schema: its
            columns only, in its order. A dict of column -> type (``{"n": "int64"}``; a
            pyarrow type or its name, as for :meth:`read_csv`) sets the types of the columns
            it names only: the other columns are found and typed as without ``schema=`` (a
            column no file has is added at the end, with an ``InputWarning``). Without
            ``schema=``, the union of the files' own schemas (their footers, read here), each
            column's types unified (int32 and int64: int64; int64 and double: double; null:
            the other); a column of two irreconcilable types (int64 in one file, string in
            another) raises ``SourceError`` naming both files: give its type in ``schema=``.
            Every file, subtask and restart reads this schema: a column a file lacks is null,
            a column not in the schema is left out, and a file whose column cannot be cast to
            the schema's type at all (a struct for an int64) fails naming the file. A string
            column read as a timestamp takes ISO-8601 text as :meth:`read_csv` does.
        :param columns: read only these columns (their types from ``schema=`` or the files),
            in this order: a stream of the columns a job uses costs less to read and to send
            between subtasks. A name that is not a column raises ``ValueError`` naming the
            columns there are.
        :param on_error: a row with a value that does not cast to its column's type (an
            overflow, when ``schema=`` narrows a type) fails the job naming ``file, row N``
            (1-based) with ``"fail"``, or goes to the dead letters with ``"dead_letter"``
            (the row as the record; ``StreamEnvironment(dead_letter_dir=...)``).
        :param name: the operator's name (and uid, which checkpoints know it by).
        :param rate_limit: at most this many records per second, for the whole source (each
            subtask reads its share); ``None``: as fast as the job takes them.
        :param event_time: :class:`~cutline.EventTime` (or a column's name, short for
            ``EventTime(column)``): watermarks per split (a file).
        :param monitor: a **watched directory**: list ``path`` again every ``monitor`` (a
            duration, ``"5s"``) and read every new file once, exactly once; the job runs
            until stopped (``stop_after``, a savepoint with ``stop=True``, Ctrl-C). Put a file
            there whole: write it under a name starting with ``.`` or ``_`` (never read), then
            rename it into place, as Spark and Flink expect. A file already read is never read
            again, even if it changes. ``schema=`` is needed while the directory is empty.
            A number is seconds, as for ``checkpoint_interval``.
        :param deprecated: deprecated, the event-time keywords of before
            (:class:`~cutline.api.event_time.OldEventTimeKeywords`): give an ``EventTime``.

        Replayable: the offset in each checkpoint is, per file, the rows consumed (handed out
        or rejected); a restore passes over exactly those.
        """
        time = event_time_of(name or "read_parquet", event_time, deprecated)
        return self._files(
            path,
            PARQUET,
            name,
            schema,
            on_error,
            rate_limit,
            time=time,
            columns=columns,
            monitor=monitor,
        )

    def read_csv(
        self,
        path: str | os.PathLike[str],
        *,
        schema: pa.Schema | dict[str, Any] | None = None,
        columns: Sequence[str] | None = None,
        delimiter: str = ",",
        header: bool = True,
        quote: str | None = '"',
        null_values: Iterable[str] = ("",),
        column_names: Iterable[str] | None = None,
        on_error: OnError = "fail",
        name: str | None = None,
        rate_limit: float | None = None,
        event_time: EventTime | str | None = None,
        monitor: Duration | None = None,
        **deprecated: Unpack[OldEventTimeKeywords],
    ) -> DataStream:
        """The records of CSV files, as Arrow batches with one schema.

        :param path: a directory (its ``.csv`` files), one file, or a glob pattern
            (``"logs/2024-*.csv"``: every file it matches, whatever its suffix; a directory it
            matches gives its ``.csv`` files); a local path or any fsspec URL. Names starting
            with ``.`` or ``_`` are left out of directories and patterns. The files are sorted
            by name and dealt round-robin to the subtasks, one split each. A path that does
            not exist raises ``SourceError`` here; no input file at all is an empty stream and
            an ``InputWarning`` naming the path and the suffixes looked for.
        :param schema: the columns' types. A ``pyarrow.Schema`` is the whole schema: its
            columns only, in its order. A dict of column -> type (``{"ts":
            "timestamp[ms]"}``) sets the types of the columns it names only: the other
            columns are found and typed as without ``schema=`` (a column no file has is added
            at the end, with an ``InputWarning``); without a header and ``column_names``, it
            names every column, in its order. A type is a pyarrow type or its name:
            ``"string"``, ``"int64"``, ``"double"``, ``"bool"``, ``"date32"``, and every
            timestamp type as pyarrow writes it (``"timestamp[s]"``, ``"timestamp[ms]"``,
            ``"timestamp[us, tz=UTC]"``, ``"timestamp[ns, tz=+02:00]"``, ``"timestamp[ms,
            tz=Europe/Paris]"``); an unknown one raises ``ValueError`` naming the column.
            Without ``schema=`` it is inferred here, on the driver, from the head of every
            file (its first 1 MiB and at most 10,000 rows; with more than 256 files, 256 MiB
            in all shared between them, at least 64 KiB each): a column is the first of
            int64, double, bool and date32 that all its sampled values cast to (spaces around
            a value do not count), else timestamp[us] if they are all ISO-8601 dates or
            date-times, else string; a column without a value in the samples is string.
            Columns come in the order the files name them, the files' columns united. A
            column whose values mix numbers and text is string, with an ``InputWarning``
            naming it, an example and its ``file:line``: give its type in ``schema=`` to read
            it as numbers, the other rows rejected. Every file, subtask and restart reads
            this schema: a column a file lacks is null, a column not in the schema is left
            out. **Times:** ISO-8601 text, ``2024-05-01T12:00:30Z``,
            ``2024-05-01T12:00:30.250+02:00`` or ``2024-05-01 12:00:31``, mixed in a column
            as they come, is read in a timestamp column as the instant it names: an offset is
            shifted to UTC, a time without a zone is taken as UTC. Inferred, such a column is
            ``timestamp[us]``, UTC without a time zone (as pyarrow.json reads such text;
            ``timestamp[ns]`` if a value has more digits of a second than microseconds);
            ``"timestamp[us, tz=UTC]"`` gives the same instants with their time zone. A value
            finer than the column's unit is rejected naming the unit that holds it; text that
            is no time is rejected as any value that does not fit.
        :param columns: read only these columns (their types from ``schema=`` or the files),
            in this order: a stream of the columns a job uses costs less to read and to send
            between subtasks. A name that is not a column raises ``ValueError`` naming the
            columns there are.
        :param delimiter: the field separator (one character).
        :param header: whether each file's first line names its columns (it is never data).
            Without one, the columns are ``column_names``, else the names of ``schema=`` in
            its order, else ``f0, f1, ...`` (as many as the first record of each file has).
        :param quote: the quote character (``None``: no quoting). As in RFC 4180, a quoted
            value may hold the delimiter, line breaks and the quote (doubled).
        :param null_values: the fields that are null (quoted or not). By default only the
            empty field: ``n/a``, ``NA`` or ``NaN`` are values (``NaN`` a double's).
        :param column_names: the columns' names, in field order (instead of the header's).
        :param on_error: what a rejected row does: a malformed record (more or fewer fields
            than the columns, invalid UTF-8, an unterminated quote) or one with a value that
            does not cast to its column's type (``'abc'`` for an int64). ``"fail"``: the job
            fails (after its restarts) with ``SourceError: FILE:LINE: why``, e.g.
            ``events.csv:3: column 'value': 'abc' is not an int64``. ``"dead_letter"``: the
            row goes to the dead letters (``StreamEnvironment(dead_letter_dir=...)``) with
            the line's text as the record and ``FILE:LINE: why`` as the error, and the job
            goes on. Lines are the file's own, 1-based (the header is line 1); blank lines
            are no rows.
        :param name: the operator's name (and uid, which checkpoints know it by).
        :param rate_limit: at most this many records per second, for the whole source (each
            subtask reads its share); ``None``: as fast as the job takes them.
        :param event_time: :class:`~cutline.EventTime` (or a column's name, short for
            ``EventTime(column)``): watermarks per split (a file).
        :param monitor: a watched directory, as for :meth:`read_parquet`.
        :param deprecated: deprecated, the event-time keywords of before
            (:class:`~cutline.api.event_time.OldEventTimeKeywords`): give an ``EventTime``.

        Replayable: the offset in each checkpoint is, per file, the rows consumed (handed out
        or rejected); a restore parses the file again and passes over exactly those (a
        rejected row is never rejected twice, nor a row lost).
        """
        options = CsvOptions(
            delimiter=delimiter,
            header=header,
            quote=quote,
            null_values=tuple(null_values),
            column_names=tuple(column_names) if column_names is not None else None,
        )
        time = event_time_of(name or "read_csv", event_time, deprecated)
        return self._files(
            path,
            CsvFormat(options),
            name,
            schema,
            on_error,
            rate_limit,
            time=time,
            columns=columns,
            monitor=monitor,
        )

    def read_jsonl(
        self,
        path: str | os.PathLike[str],
        *,
        schema: pa.Schema | dict[str, Any] | None = None,
        columns: Sequence[str] | None = None,
        on_error: OnError = "fail",
        name: str | None = None,
        rate_limit: float | None = None,
        event_time: EventTime | str | None = None,
        monitor: Duration | None = None,
        **deprecated: Unpack[OldEventTimeKeywords],
    ) -> DataStream:
        """The records of JSON-lines files (one JSON object per line), as Arrow batches with
        one schema.

        :param path: a directory (its ``.jsonl`` and ``.json`` files), one file, or a glob
            pattern (every file it matches, whatever its suffix; a directory it matches gives
            its JSON-lines files); a local path or any fsspec URL. Names starting with ``.``
            or ``_`` are left out of directories and patterns. The files are sorted by name
            and dealt round-robin to the subtasks, one split each. A path that does not exist
            raises ``SourceError`` here; no input file at all is an empty stream and an
            ``InputWarning`` naming the path and the suffixes looked for.
        :param schema: the columns' types, as for :meth:`read_csv`: a ``pyarrow.Schema`` is
            the whole schema, a dict (``{"ts": "timestamp[ms]"}``) sets the types of the
            columns it names only, the others found and typed as without ``schema=``. Without
            it, it is inferred here, on the driver, from the head of every file (as
            ``read_csv``: 1 MiB and at most 10,000 lines each) with pyarrow.json's types
            (int64, double, bool, string, structs, lists), unified across lines and files
            (int64 and double: double; null: the other; structs field by field); a column
            whose text is all ISO-8601 date-times, with ``Z``, an offset or no zone, with or
            without fractions of a second, is timestamp[us] (UTC, read as ``read_csv`` reads
            times). A column whose values fit no one type (numbers and text, objects and
            numbers) is string, its values that are not text read as their JSON text; when
            they mix numbers and text an ``InputWarning`` names the column, an example and
            its ``file:line``. A column with nothing but nulls in the samples is string.
            Every file, subtask and restart reads this schema: a field a line lacks is null,
            a field not in the schema is left out.
        :param columns: read only these columns (their types from ``schema=`` or the files),
            in this order: a stream of the columns a job uses costs less to read and to send
            between subtasks. A name that is not a column raises ``ValueError`` naming the
            columns there are.
        :param on_error: what a rejected line does: malformed JSON, a line that is no JSON
            object, or a value that does not fit its column's type (``"abc"`` or ``3.5`` for
            an int64; a string column takes any value, as its JSON text). ``"fail"``: the job
            fails (after its restarts) with ``SourceError: FILE:LINE: why``.
            ``"dead_letter"``: the line goes to the dead letters
            (``StreamEnvironment(dead_letter_dir=...)``) with its text as the record and
            ``FILE:LINE: why`` as the error, and the job goes on. Lines are 1-based; blank
            lines are no rows.
        :param name: the operator's name (and uid, which checkpoints know it by).
        :param rate_limit: at most this many records per second, for the whole source (each
            subtask reads its share); ``None``: as fast as the job takes them.
        :param event_time: :class:`~cutline.EventTime` (or a column's name, short for
            ``EventTime(column)``): watermarks per split (a file).
        :param monitor: a watched directory, as for :meth:`read_parquet`.
        :param deprecated: deprecated, the event-time keywords of before
            (:class:`~cutline.api.event_time.OldEventTimeKeywords`): give an ``EventTime``.

        Replayable: the offset in each checkpoint is, per file, the lines consumed (handed
        out or rejected); a restore passes over exactly those.
        """
        time = event_time_of(name or "read_jsonl", event_time, deprecated)
        return self._files(
            path,
            JSONL,
            name,
            schema,
            on_error,
            rate_limit,
            time=time,
            columns=columns,
            monitor=monitor,
        )

    def _files(
        self,
        path: str | os.PathLike[str],
        fmt: InputFormat,
        name: str | None,
        schema: pa.Schema | dict[str, Any] | None,
        on_error: OnError,
        rate_limit: float | None,
        *,
        time: EventTime | None = None,
        columns: Sequence[str] | None = None,
        monitor: Duration | None = None,
    ) -> DataStream:
        label = f"read_{fmt}"
        what = name or label
        self._check_on_error(what, on_error)  # before the files are sampled
        chosen = _column_names(what, columns)
        options = self.settings.storage_options
        url = location(path)
        every = seconds(monitor, f"{what}: monitor")  # (seconds, or "5s", as every interval)
        if every is not None and not 0 < every < math.inf:
            raise ValueError(f"{what}: monitor must be a positive duration, not {monitor!r}")
        # a dict gives the types of the columns it names; the files give the others
        whole, types = (None, schema) if isinstance(schema, Mapping) else (schema, None)
        source = FileSource(url, fmt, options, schema=whole, types=types, monitor=every)
        # on the driver, now: a missing path is an error here, not inside a Spark task, and
        # the schema every subtask and restart reads is fixed
        source, notes = source.prepare()
        for note in notes:
            warnings.warn(f"{what}({path}): {note}", InputWarning, stacklevel=3)
        assert source.schema is not None
        if chosen is not None:
            column = time.column if time is not None else None
            if column is not None and column not in chosen and column in source.schema.names:
                raise ValueError(
                    f"{what}({path}): event_time={column!r} is not among the columns read "
                    f"(columns={list(chosen)!r}): add it"
                )
            source = replace(source, schema=_projection(what, path, source.schema, chosen))
        assert source.schema is not None
        made = strategy(what, time, source.schema)
        # what it reads, for its id: the files, and how they are read (as given)
        detail = fmt.detail()
        reads = f"{url} schema={schema!r} {detail}" if detail else f"{url} schema={schema!r}"
        if chosen is not None:
            reads += f" columns={list(chosen)!r}"
        return self._source(source, label, reads, name, rate_limit, on_error, time=made)

    def _source(
        self,
        source: Source,
        label: str,
        reads: str,
        name: str | None,
        rate_limit: float | None,
        on_error: OnError = "fail",
        *,
        time: WatermarkStrategy | None = None,
    ) -> DataStream:
        """The source operator ``label`` reading ``source`` (``reads`` says what, for its id;
        event time does not change it), making watermarks with ``time``."""
        if rate_limit is not None and (
            isinstance(rate_limit, bool)
            or not isinstance(rate_limit, int | float)
            or not 0 < rate_limit < math.inf
        ):
            raise ValueError(
                f"{name or label}: rate_limit must be a number of records per second greater "
                f"than zero, not {rate_limit!r}"
            )
        operator = self._add(label, SourceLogic(source, time), [], name, on_error, reads)
        if rate_limit is not None:
            self._rate_limits[operator.uid] = float(rate_limit)
        column = time.column if time is not None else None
        return DataStream(self, operator, column, source.record_schema())


def _column_names(what: str, columns: Sequence[str] | None) -> tuple[str, ...] | None:
    """``columns=`` as given, checked: a list of distinct names (or ``None``: all)."""
    if columns is None:
        return None
    if isinstance(columns, str | bytes) or not isinstance(columns, Iterable):
        raise TypeError(f"{what}: columns takes a list of column names, not {columns!r}")
    names = tuple(columns)
    if not names:
        raise ValueError(f"{what}: columns=[] reads no column; leave it out to read them all")
    wrong = [c for c in names if not isinstance(c, str)]
    if wrong:
        raise TypeError(f"{what}: columns are named by strings, not {wrong[0]!r}")
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise ValueError(f"{what}: columns names {', '.join(map(repr, twice))} more than once")
    return names


def _projection(what: str, path: Any, schema: pa.Schema, columns: tuple[str, ...]) -> pa.Schema:
    """The schema of ``columns`` only, in their order; a name that is not a column is an
    error naming those there are. An input without columns (no files: warned of) stays
    empty."""
    if not len(schema):
        return schema
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ValueError(
            f"{what}({path}): no column {', '.join(map(repr, missing))} to read "
            f"(columns=); the input's columns are {', '.join(map(repr, schema.names))}"
        )
    return pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
