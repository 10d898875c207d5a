"""Tables as sources: ``env.read_delta``, a Delta Lake table read as Spark's Delta streaming
source reads it (its snapshot, then what every later version adds), exactly once. The
connector and its client library (deltalake) are imported when first used."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any, Literal

from cutline.api.event_time import source_strategy
from cutline.api.settings import seconds
from cutline.api.sources import Sources, _column_names
from cutline.api.streams import DataStream
from cutline.connectors.source import SourceError
from cutline.runtime.eventtime.watermarks import WatermarkGenerator
from cutline.runtime.io.formats import InputWarning


class TableSources(Sources):
    """The table sources of :class:`~cutline.api.StreamEnvironment`."""

    def read_delta(
        self,
        path: str | os.PathLike[str],
        *,
        monitor: Any = None,
        starting_version: int | Literal["latest"] | None = None,
        starting_timestamp: datetime | date | str | None = None,
        skip_change_commits: bool = False,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        slices: int = 64,
        name: str | None = None,
        on_error: str = "fail",
        rate_limit: float | None = None,
        event_time: str | None = None,
        max_out_of_orderness: Any = 0,
        idle_timeout: Any = "10s",
        event_time_unit: str | None = None,
        max_watermark_jump: Any = None,
        watermarks: WatermarkGenerator | None = None,
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
        :param event_time: the column of each record's event time: watermarks per slice,
            as for :meth:`read_parquet`; a slice that has read every version there is stops
            holding them back after ``idle_timeout`` (10 s; ``None``: never).
        :param on_error: ``"dead_letter"``: a record whose event time jumps past
            ``max_watermark_jump`` goes to the dead letters.
        """
        from cutline.connectors.delta.source import DeltaSource

        what = name or "read_delta"
        self._check_on_error(what, on_error)
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
        if chosen is not None and event_time is not None and event_time not in chosen:
            raise ValueError(
                f"{what}({path}): event_time={event_time!r} is not among the columns read "
                f"(columns={list(chosen)!r}): add it"
            )
        try:
            prepared, notes = source.prepare()  # on the driver, now
        except SourceError as exc:
            raise SourceError(f"{what}: {exc}") from None
        for note in notes:
            warnings.warn(f"{what}: {note}", InputWarning, stacklevel=2)
        strategy = source_strategy(
            what,
            prepared.record_schema(),
            event_time,
            max_out_of_orderness,
            idle_timeout if event_time is not None else None,
            event_time_unit,
            max_watermark_jump,
            watermarks,
        )
        # what it reads, for its id (not where it starts: a restore goes on from its checkpoint)
        reads = f"delta {source.path}"
        if chosen is not None:
            reads += f" columns={list(chosen)!r}"
        return self._source(
            prepared, "read_delta", reads, name, rate_limit, on_error, time=strategy
        )
