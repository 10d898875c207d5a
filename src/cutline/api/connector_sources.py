"""The sources of a job that read other systems: Kafka topics (``read_kafka``) and Delta Lake
tables (``read_delta``, as Spark's Delta streaming source reads one: its snapshot, then what
every later version adds), each built on the driver (its input checked, where to start
resolved) and read through the connectors API (:mod:`cutline.connectors`), exactly once. Each
connector's client library is imported when its method is first called, not with
``cutline``."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from typing import Any, Literal, Unpack

import pyarrow as pa

from cutline.api.event_time import EventTime, OldEventTimeKeywords, event_time_of, strategy
from cutline.api.sources import Sources, _column_names
from cutline.api.streams import DataStream
from cutline.connectors.kafka.names import KeyFormat, OffsetPolicy, ValueFormatName
from cutline.connectors.source import SourceError
from cutline.runtime.durations import Duration, seconds
from cutline.runtime.io.formats import InputWarning, as_schema
from cutline.runtime.operators import OnError

QUIET_PARTITIONS = "10s"
"""``EventTime(idle_timeout=)`` left out for Kafka and Delta: a partition (a slice) without
records this long stops holding the watermark back (their partitions can go quiet)."""


class ConnectorSources(Sources):
    """The sources of :class:`~cutline.api.StreamEnvironment` that read other systems."""

    def read_kafka(
        self,
        topics: str | Sequence[str] | re.Pattern[str],
        *,
        bootstrap_servers: str,
        value_format: ValueFormatName | Callable[[bytes], dict[str, Any]] = "json",
        schema: pa.Schema | dict[str, Any] | str | None = None,
        schema_registry: str | Mapping[str, Any] | None = None,
        key_format: KeyFormat = "string",
        start: Any = "earliest",
        bounded: bool = False,
        group_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        discovery_interval: Duration = "5s",
        on_offset_out_of_range: OffsetPolicy = "fail",
        event_time: EventTime | str | None = None,
        name: str | None = None,
        rate_limit: float | None = None,
        on_error: OnError = "fail",
        **deprecated: Unpack[OldEventTimeKeywords],
    ) -> DataStream:
        """The records of Kafka ``topics``, **exactly once**: each partition is a split whose
        offset is in every checkpoint (consumer-group offsets are only published, with
        ``group_id=``, for monitoring). Records: the value's fields (``value_format="json"``
        or ``"avro"``), or a ``value`` column (``"raw"`` bytes, ``"string"``), or the dict a
        function of the value's bytes returns; plus ``_key``, ``_partition``, ``_offset``,
        ``_timestamp`` (the record's timestamp, UTC), ``_headers`` (a list of ``{"key": str,
        "value": bytes}``) and ``_tombstone`` (true for a record whose value is null: its
        value fields are null).

        :param topics: a name, names, or a ``re.Pattern``: the topics whose whole name it
            matches, listed when the job is built and, unbounded, every
            ``discovery_interval`` (a topic created later is read from its beginning).
        :param schema: the value's fields. A ``pyarrow.Schema`` is the whole value: its
            fields only, in its types. A dict (``{name: type}``, types as for ``read_csv``)
            sets the types of the fields it names only: a JSON value's other fields are
            inferred from the topic's first records when the job is built, as without
            ``schema=`` (an empty topic: the dict's fields only, with a warning); a
            deserializer's records have the dict's fields. ``None``: inferred from the
            topic's first records (an empty topic: records are dicts). With
            ``value_format="avro"``: the Avro schema (a dict or its JSON text), the
            writer's, or with a registry the reader's (``None``: the latest of subject
            ``<topic>-value`` when the job is built).
        :param schema_registry: Avro values in Confluent's wire format: the Schema Registry's
            URL (or ``{"url": ..., "basic.auth.user.info": ...}``, its client's settings);
            each record's writer's schema is fetched by its id, once per worker.
        :param start: ``"earliest"``, ``"latest"``, a time (``datetime`` or epoch ms) or
            offsets (``{partition: offset}``); resolved once, when the job is built.
        :param bounded: stop at the offsets the partitions had when the job was built (the job
            then ends); ``False``: read until stopped, finding new partitions every
            ``discovery_interval``.
        :param on_offset_out_of_range: what to do with a partition that no longer holds the
            offset the job reads on from (its records deleted by retention; the topic deleted
            and made again, so that it ends before it): ``"fail"`` (the job fails naming the
            topic, the partition and both offsets), ``"earliest"`` or ``"latest"`` (read on
            from the partition's first or last offset; the records skipped are counted and
            reported).
        :param event_time: :class:`~cutline.EventTime` (or a column's name, short for
            ``EventTime(column)``), e.g. ``"_timestamp"``: watermarks per partition; its
            ``idle_timeout`` left out is 10 s here.
        :param on_error: ``"dead_letter"``: a record that does not decode is kept aside with
            its topic, partition and offset; ``"fail"``: the job fails naming it.
        :param config: more librdkafka settings (``security.protocol``, ``sasl.*``).
        :param deprecated: deprecated, the event-time keywords of before
            (:class:`~cutline.api.event_time.OldEventTimeKeywords`): give an ``EventTime``.
        """
        from cutline.connectors.kafka.source import kafka_source

        pattern = topics if isinstance(topics, re.Pattern) else None
        names: tuple[str, ...] = ()
        if isinstance(topics, str):
            names = (topics,)
        elif not isinstance(topics, re.Pattern):
            names = tuple(topics)
        what = name or "read_kafka"
        self._check_on_error(what, on_error)
        time = event_time_of(what, event_time, deprecated)
        every = seconds(discovery_interval, f"{what}: discovery_interval")
        avro = value_format == "avro"
        try:
            arrow = None if avro else as_schema(schema)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{what}: {exc}") from None
        described = ", ".join(names) if pattern is None else repr(pattern.pattern)
        try:
            partial = isinstance(schema, Mapping) and value_format == "json"
            source = kafka_source(
                pattern or names,
                bootstrap_servers,
                value_format=value_format,
                schema=None if partial else arrow,
                types=arrow if partial else None,
                avro_schema=schema if avro else None,
                schema_registry=schema_registry,
                key_format=key_format,
                start=start,
                bounded=bounded,
                group_id=group_id,
                config=config,
                discovery_interval=every,
                on_offset_out_of_range=on_offset_out_of_range,
            )
            prepared, notes = source.prepare()  # on the driver, now: the topics are there
        except SourceError as exc:  # (a bad argument's ValueError names read_kafka already)
            raise SourceError(f"{what}({described}): {exc}") from None
        for note in notes:
            warnings.warn(f"{what}: {note}", InputWarning, stacklevel=2)
        made = strategy(what, time, prepared.record_schema(), idle_default=QUIET_PARTITIONS)
        topics_read = list(names) if pattern is None else f"pattern {pattern.pattern!r}"
        reads = f"kafka {topics_read} value_format={value_format!r} schema={schema!r}"
        avro_format = prepared.value.avro
        if avro_format is not None and avro_format.registry is not None:  # (its URL: no secret)
            reads += f" schema_registry={dict(avro_format.registry)['url']!r}"
        return self._source(prepared, "read_kafka", reads, name, rate_limit, on_error, time=made)

    def read_delta(
        self,
        path: str | os.PathLike[str],
        *,
        monitor: Duration | None = None,
        starting_version: int | Literal["latest"] | None = None,
        starting_timestamp: datetime | date | str | None = None,
        skip_change_commits: bool = False,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        slices: int = 64,
        name: str | None = None,
        on_error: OnError = "fail",
        rate_limit: float | None = None,
        event_time: EventTime | str | None = None,
        **deprecated: Unpack[OldEventTimeKeywords],
    ) -> DataStream:
        """The rows of the Delta Lake table at ``path``, **exactly once**, as Spark's Delta
        streaming source reads them: the table as it is when the job is built (its snapshot:
        every row of its newest version), then the rows each later version adds, in version
        order. Partition columns are columns of the records; the types are the table's.

        :param path: a local path or a URI delta-rs knows (``s3://``, ``abfss://``, ``gs://``,
            with ``storage_options``). No table there raises ``SourceError`` here.
        :param monitor: how often to look for a new version (a duration: ``"5s"``; a number
            is seconds): the job then runs until stopped. ``None``: bounded, the job ends
            once the snapshot (or the versions from ``starting_version`` up to the newest
            when the job is built) is read.
        :param starting_version: read the versions from this one on (included), without a
            snapshot; ``"latest"``: only those committed after the job is built. A version
            newer than the table's, or whose commit the log no longer has, raises
            ``SourceError``. A restored job goes on from its checkpoint whatever this says.
        :param starting_timestamp: the same from the first version committed at or after
            this time (a ``datetime``, UTC without a zone; a ``date``; or ISO-8601 text).
        :param skip_change_commits: a version that removes data (``DELETE``, ``UPDATE``,
            ``MERGE``, an overwrite) fails the job, naming the version and its operation,
            unless this is ``True``: such a version is then skipped whole, the rows it adds
            included (Spark's ``skipChangeCommits``), and the job's listener is told.
            Compaction (``OPTIMIZE``: no data changed) is never read.
        :param columns: read only these columns, in this order.
        :param slices: the splits the table is read in (each version's files dealt among
            them): the most subtasks that read it. Keep it across restores.
        :param event_time: :class:`~cutline.EventTime` (or a column's name, short for
            ``EventTime(column)``): watermarks per slice; its ``idle_timeout`` left out is 10 s
            here (a slice that has read every version there is then stops holding them back).
        :param on_error: ``"dead_letter"``: a record whose event time jumps past
            ``EventTime(max_jump=)`` goes to the dead letters.
        :param deprecated: deprecated, the event-time keywords of before
            (:class:`~cutline.api.event_time.OldEventTimeKeywords`): give an ``EventTime``.
        """
        from cutline.connectors.delta.source import DeltaSource

        what = name or "read_delta"
        self._check_on_error(what, on_error)
        time = event_time_of(what, event_time, deprecated)
        chosen = _column_names(what, columns)
        source = DeltaSource(  # (which checks its arguments)
            os.fspath(path),
            storage_options=dict(storage_options) if storage_options else None,
            monitor=seconds(monitor, f"{what}: monitor"),
            starting_version=starting_version,
            starting_timestamp=starting_timestamp,
            skip_change_commits=skip_change_commits,
            columns=chosen,
            slices=slices,
        )
        column = time.column if time is not None else None
        if chosen is not None and column is not None and column not in chosen:
            raise ValueError(
                f"{what}({path}): event_time={column!r} is not among the columns read "
                f"(columns={list(chosen)!r}): add it"
            )
        try:
            prepared, notes = source.prepare()  # on the driver, now
        except SourceError as exc:
            raise SourceError(f"{what}: {exc}") from None
        for note in notes:
            warnings.warn(f"{what}: {note}", InputWarning, stacklevel=2)
        made = strategy(what, time, prepared.record_schema(), idle_default=QUIET_PARTITIONS)
        # what it reads, for its id (not where it starts: a restore goes on from its checkpoint)
        reads = f"delta {source.path}"
        if chosen is not None:
            reads += f" columns={list(chosen)!r}"
        return self._source(prepared, "read_delta", reads, name, rate_limit, on_error, time=made)
