"""A Delta table read as a stream (``env.read_delta``), as Spark's Delta streaming source reads
one: the table as it is at a version (its **snapshot**), then what every later version adds,
in version order, each row once.

**Splits.** The table is read in ``slices`` splits (64 by default: the most subtasks that
read it), ``0/64`` to ``63/64``, numbered (dealt round-robin) and never finished while the
table is watched. File ``i`` of a version (the snapshot's files sorted by path; a commit's
added files in the log's order) belongs to slice ``(version + i) mod slices``: every slice
walks every version, in order, and reads the files that are its own. A split's position is
where its slice stands: ``(version, in the snapshot?, file index, file path, rows read of
it)``. So a checkpoint holds one small tuple per slice whatever the table's size and age, a
restore at any parallelism hands each slice to its new subtask from there, and the log is
needed only from the lowest version a slice stands at (as Spark's offset needs it).

**What is read** (Spark's rules, ``DeltaSource.getFileChanges``):

* without ``starting_version``/``starting_timestamp``: the snapshot of the version the table
  was at when the job was built (fixed on the driver by :meth:`DeltaSource.prepare`), then the
  versions after it; with one: the versions from it on (``"latest"``: those committed after the
  job was built), without a snapshot;
* of each version, the files it adds with ``dataChange`` (compaction's, ``OPTIMIZE``, are
  not new rows: nothing is read of it);
* a version that removes a file with ``dataChange`` (``DELETE``, ``UPDATE``, ``MERGE``, an
  overwrite, a restore) fails the job naming the version and its operation; with
  ``skip_change_commits=True`` it is skipped whole, the files it adds included (Spark's
  ``skipChangeCommits``), and the job's listener is told.
* without ``monitor``, the source is bounded: it ends at the version of the snapshot; with
  it, each subtask looks for the next version's commit every ``monitor`` seconds.

The records have the table's columns (``columns=``: some of them), partition columns
included, with the types of the table's schema when the job was built. A later version that
adds columns is read without them (the listener is told); one that drops or retypes a column
the job reads, or has column mapping, fails the job naming it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from typing import Any, Literal

import pyarrow as pa

from cutline.connectors.delta.data import DataFileReader
from cutline.connectors.delta.files import table_path
from cutline.connectors.delta.log import (
    READABLE_MAPPING,
    AddedFile,
    Commit,
    TableLog,
    arrow_schema,
    column_mapping,
    open_table,
    unreadable_mapping,
    with_deletion_vectors,
)
from cutline.connectors.source import (
    Finished,
    Nothing,
    ReadResult,
    Records,
    Source,
    SourceContext,
    SourceError,
    SplitReader,
)
from cutline.protocol.splits import Split, owner

SLICES = 64
"""The splits a table is read in, by default: the most subtasks that read it."""


@dataclass(frozen=True)
class DeltaSource(Source):
    """The Delta table at ``path`` (a local path or a URI delta-rs knows, with its
    ``storage_options``) as a stream: see the module's docstring. Prepared on the driver
    (:meth:`prepare`), which fixes the versions and the schema every subtask reads."""

    path: str
    storage_options: Mapping[str, str] | None = field(default=None, kw_only=True)
    monitor: float | None = field(default=None, kw_only=True)
    """Seconds between two looks for a new version; ``None``: bounded."""
    starting_version: int | Literal["latest"] | None = field(default=None, kw_only=True)
    starting_timestamp: datetime | date | str | None = field(default=None, kw_only=True)
    skip_change_commits: bool = field(default=False, kw_only=True)
    columns: tuple[str, ...] | None = field(default=None, kw_only=True)
    slices: int = field(default=SLICES, kw_only=True)
    start: int | None = field(default=None, kw_only=True)
    """The first version read (fixed by :meth:`prepare`)."""
    snapshot: bool = field(default=False, kw_only=True)
    """Whether version ``start`` is read as the table's snapshot (all its files)."""
    built_at: int = field(default=-1, kw_only=True)
    """The table's version when the job was built: the last one read when bounded; its schema
    is the records'."""
    schema: pa.Schema | None = field(default=None, kw_only=True)
    """The records' columns (fixed by :meth:`prepare`)."""
    table_columns: tuple[str, ...] = field(default=(), kw_only=True)
    """Every column of the table when the job was built."""
    partition_columns: tuple[str, ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", table_path(self.path))
        if type(self.slices) is not int or self.slices < 1:
            raise ValueError(f"read_delta: slices must be a positive integer, not {self.slices!r}")
        if self.monitor is not None and not (
            isinstance(self.monitor, int | float) and 0 < self.monitor < float("inf")
        ):
            raise ValueError(
                f"read_delta: monitor must be a positive duration, not {self.monitor!r}"
            )
        version = self.starting_version
        if (
            version is not None
            and version != "latest"
            and (type(version) is not int or version < 0)
        ):
            raise ValueError(
                "read_delta: starting_version is a version number (0 or more) or 'latest', not "
                f"{version!r}"
            )
        if version is not None and self.starting_timestamp is not None:
            raise ValueError("read_delta: give starting_version= or starting_timestamp=, not both")
        if self.starting_timestamp is not None:
            _millis(self.starting_timestamp)  # (checked now)
        if not isinstance(self.skip_change_commits, bool):
            raise TypeError(
                f"read_delta: skip_change_commits is True or False, not {self.skip_change_commits!r}"
            )
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))

    @property
    def bounded(self) -> bool:  # type: ignore[override]
        return self.monitor is None

    @property
    def end(self) -> int | None:
        """The last version read: bounded, the table's when the job was built."""
        return self.built_at if self.monitor is None else None

    def options(self) -> dict[str, str] | None:
        return dict(self.storage_options) if self.storage_options else None

    def prepare(self) -> tuple[DeltaSource, list[str]]:
        """On the driver, when the job is built: the versions to read (the snapshot of the
        newest, or from ``starting_*``; bounded: up to the newest) and the schema, fixed for
        every subtask and restart. A path without a table, a version that is not there, a
        table this source cannot read: :class:`SourceError`."""
        table = open_table(self.path, self.options())
        latest = table.version()
        mapping = column_mapping(table)
        if mapping not in READABLE_MAPPING:
            raise SourceError(unreadable_mapping(self.path, latest, mapping))
        schema = arrow_schema(table)
        log = TableLog(self.path, self.options())
        notes: list[str] = []
        snapshot = False
        where = f"Delta table {self.path}"
        if self.starting_version == "latest":
            start = latest + 1
        elif self.starting_version is not None:
            start = self.starting_version
            if start > latest:
                raise SourceError(
                    f"{where}: starting_version={start}, but its newest version is {latest}"
                )
            if not log.has(start):
                raise SourceError(
                    f"{where}: starting_version={start}, whose commit is no longer in the log "
                    "(cleaned up: delta.logRetentionDuration)"
                )
        elif self.starting_timestamp is not None:
            found = log.first_version_at(_millis(self.starting_timestamp))
            if found is None:
                raise SourceError(
                    f"{where}: starting_timestamp={self.starting_timestamp!r} is after its "
                    f"newest commit (version {latest})"
                )
            start = found
        else:
            start, snapshot = latest, True
            deleted = sorted(with_deletion_vectors(table))
            if deleted:
                raise SourceError(
                    f"{where}: data file {deleted[0]} (version {latest}) has a deletion vector "
                    "(rows of it deleted), which this source cannot apply"
                )
        if self.monitor is None and start > latest:
            notes.append(
                f"{where}: starting_version='latest' without monitor=: nothing to read (the "
                "stream is empty)"
            )
        chosen = schema
        if self.columns is not None:
            missing = [c for c in self.columns if c not in schema.names]
            if missing:
                raise ValueError(
                    f"read_delta({self.path}): no column {', '.join(map(repr, missing))} "
                    f"(columns=); the table's columns are {', '.join(map(repr, schema.names))}"
                )
            chosen = pa.schema([schema.field(c) for c in self.columns])
        prepared = replace(
            self,
            start=start,
            snapshot=snapshot,
            built_at=latest,
            schema=chosen,
            table_columns=tuple(schema.names),
            partition_columns=tuple(table.metadata().partition_columns),
        )
        return prepared, notes

    def record_schema(self) -> pa.Schema | None:
        return self.schema

    def splits(self) -> list[Split]:
        return [Split(f"{j}/{self.slices}", j) for j in range(self.slices)]

    def reader(self, context: SourceContext) -> DeltaReader:
        if self.start is None or self.schema is None:
            raise SourceError(
                f"Delta table {self.path}: the source was not prepared on the driver "
                "(env.read_delta and env.from_source prepare it)"
            )
        return DeltaReader(self, context)


@dataclass
class Slice:
    """Where one split (a slice of every version's files) stands."""

    id: str
    number: int
    version: int
    snapshot: bool
    index: int
    """The file being read, or the first it may read next, by its index in the version."""
    path: str | None = None
    """The file being read (``None``: between files)."""
    rows: int = 0
    """Rows of it handed out."""
    file: DataFileReader | None = None
    waiting: bool = False
    """Whether it has read every version there is (it waits for the next)."""

    def position(self) -> tuple[int, bool, int, str | None, int]:
        return (self.version, self.snapshot, self.index, self.path, self.rows)

    def order(self) -> tuple[int, int, int]:
        return (self.version, 0 if self.snapshot else 1, self.index)


OPENED, WAIT, END = "opened", "wait", "end"


class DeltaReader(SplitReader):
    """One subtask's slices: it reads the one that stands lowest (version, file) first, so its
    records come in version order; it looks for a version not committed yet at most every
    ``monitor`` seconds."""

    def __init__(self, source: DeltaSource, context: SourceContext) -> None:
        assert source.start is not None and source.schema is not None
        self.source, self.context = source, context
        self.schema: pa.Schema = source.schema
        self.where = f"Delta table {source.path}"
        self.log = TableLog(source.path, source.options())
        self.slices: dict[str, Slice] = {}
        self.files: dict[tuple[int, int], list[AddedFile]] = {}
        """The files read of each version (its order: (version, 0) a snapshot, (version, 1)
        a commit), while a slice still stands at or before it."""
        self.newest = -1
        """The newest version known to be in the log."""
        self.look_at = 0.0
        """When to look for a version not in the log at the last look (monotonic seconds)."""
        self.opened = False
        """Whether its first read looked at the slices it was given."""

    def add_split(self, split: Split, position: Any) -> None:
        number, count = (int(part) for part in split.id.split("/"))
        if count != self.source.slices:
            raise SourceError(
                f"{self.where}: the restored checkpoint read it in {count} slices (split "
                f"{split.id}), this job in {self.source.slices}: slices= must stay as the "
                "checkpoint's"
            )
        if position is None:
            assert self.source.start is not None
            self.slices[split.id] = Slice(
                split.id, number, self.source.start, self.source.snapshot, 0
            )
            return
        if not _is_position(position):
            raise SourceError(
                f"{self.where}: split {split.id}: {position!r} is not a position of this source "
                "(version, snapshot, file index, file path, rows)"
            )
        version, snapshot, index, path, rows = position
        self.slices[split.id] = Slice(split.id, number, version, snapshot, index, path, rows)

    def position(self, split: str) -> tuple[int, bool, int, str | None, int]:
        return self.slices[split].position()

    def caught_up(self) -> list[str]:
        return [s.id for s in self.slices.values() if s.waiting]

    def read(self, max_records: int) -> ReadResult:
        if not self.opened:
            self.opened = True
            self._check_ended()
        for piece in sorted(self.slices.values(), key=Slice.order):
            while True:
                if piece.file is None:
                    step = self._advance(piece)
                    if step == END:
                        del self.slices[piece.id]
                        return Finished(piece.id)
                    if step == WAIT:
                        break
                assert piece.file is not None
                batch = piece.file.take(max_records)
                if batch is not None:
                    piece.rows += batch.num_rows
                    return Records(batch, piece.id)
                piece.file.close()
                piece.file, piece.path, piece.rows = None, None, 0
                piece.index += 1
        wait = self.look_at - time.monotonic() if self.caught_up() else 0.05
        return Nothing(max(0.01, wait))

    def close(self) -> None:
        for piece in self.slices.values():
            if piece.file is not None:
                piece.file.close()
                piece.file = None

    # ------------------------------------------------------------------ the slices

    def _check_ended(self) -> None:
        """A watched run: every slice this subtask reads must be one it was given (at its
        first read, the restored ones and the listing's were). One it was not ended in the run
        whose checkpoint the job restores: a bounded run read it to its end, which the
        checkpoint does not say, so its later versions would never be read: refused. (A
        bounded run restoring its own checkpoint, after a failure, goes on without them.)"""
        if self.source.bounded:
            return
        count, context = self.source.slices, self.context
        mine = {
            j
            for j in range(count)
            if owner(Split(str(j), j), context.parallelism) == context.subtask
        }
        ended = sorted(mine - {s.number for s in self.slices.values()})
        if ended:
            raise SourceError(
                f"{self.where}: the restored checkpoint has slice(s) "
                f"{', '.join(f'{j}/{count}' for j in ended)} read to the end of a bounded run "
                "(read_delta without monitor=): a watched run cannot read the versions after "
                "that end from it; read a table in runs by watching it (monitor=) and stopping "
                "each run with a savepoint, or start afresh (fresh=True) with starting_version= "
                "the version after the one it read to"
            )

    def _advance(self, piece: Slice) -> str:
        """Open the next file of ``piece`` (from its position), passing over the versions
        that have none of its own; or say that it waits for a version, or that it is at its
        end (bounded)."""
        count, end = self.source.slices, self.source.end
        while True:
            if not piece.snapshot and end is not None and piece.version > end:
                return END
            files = self._files(piece.version, piece.snapshot)
            if files is None:
                piece.waiting = True
                return WAIT
            piece.waiting = False
            index = piece.index + (piece.number - piece.version - piece.index) % count
            if index < len(files) and (piece.path is None or index == piece.index):
                file = files[index]
                if piece.path is not None and file.path != piece.path:
                    raise self._moved(piece)
                piece.index, piece.path = index, file.path
                piece.file = DataFileReader(
                    self.log.store,
                    file,
                    piece.version,
                    self.schema,
                    self.source.partition_columns,
                    self.where,
                    piece.rows,
                )
                return OPENED
            if piece.path is not None:
                raise self._moved(piece)
            piece.version, piece.snapshot, piece.index, piece.rows = piece.version + 1, False, 0, 0
            self._forget()

    def _moved(self, piece: Slice) -> SourceError:
        return SourceError(
            f"{self.where}: split {piece.id} of the restored checkpoint was reading "
            f"{piece.path} (file {piece.index} of version {piece.version}), which the log "
            "does not list there: the checkpoint is of another table, or the log was rewritten"
        )

    def _files(self, version: int, snapshot: bool) -> list[AddedFile] | None:
        """The files of ``version`` this source reads (every file of the table at it, for a
        snapshot); ``None`` while it is not committed."""
        key = (version, 0 if snapshot else 1)
        files = self.files.get(key)
        if files is not None:
            return files
        if snapshot:
            files = self.log.snapshot(version)
        else:
            if self.source.end is None and version > self.newest:
                now = time.monotonic()
                if now < self.look_at:
                    return None
                if not self.log.has(version):
                    self.log.check_kept(version)
                    assert self.source.monitor is not None
                    self.look_at = now + self.source.monitor
                    return None
                self.newest = version
            files = self._admitted(self.log.commit(version))
        self.files[key] = files
        return files

    def _forget(self) -> None:
        """The files of the versions every slice has passed."""
        lowest = min(s.order()[:2] for s in self.slices.values())
        for key in [k for k in self.files if k < lowest]:
            del self.files[key]

    # -------------------------------------------------------------------- versions

    def _admitted(self, commit: Commit) -> list[AddedFile]:
        """The files of ``commit`` to read: those it adds, unless it removes data (then it
        fails the job, or with ``skip_change_commits`` none of them)."""
        if commit.column_mapping not in READABLE_MAPPING:
            raise SourceError(
                unreadable_mapping(self.source.path, commit.version, commit.column_mapping)
            )
        if commit.schema is not None and commit.version > self.source.built_at:
            self._check_schema(commit)  # (an older one's files: read into the job's types)
        if commit.removed is None:
            return list(commit.added)
        added = f"; it adds {len(commit.added)} file(s)" if commit.added else ""
        if not self.source.skip_change_commits:
            raise SourceError(
                f"{self.where}: {commit.describe()} removes data (file {commit.removed}"
                f"{added}): a stream of a Delta table reads the rows each version adds, and "
                "a version that deletes, updates or overwrites rows cannot be streamed; "
                "skip_change_commits=True skips such versions whole (the files they add too)"
            )
        self._tell(
            commit.version,
            f"{self.where}: {commit.describe()} skipped (skip_change_commits=True): it removes "
            f"data (file {commit.removed}){added}, not read",
        )
        return []

    def _check_schema(self, commit: Commit) -> None:
        """A schema set after the job was built: the job's columns must be there with their
        types; columns added are not read (said once). (Spark's ``isReadCompatible`` of the
        new schema read as the stream's, without failing on added columns: a stream that
        restarts on them, as Spark's, would fail again within one run.)"""
        new, at = commit.schema, f"{self.where}: {commit.describe()}"
        assert new is not None
        for column in self.schema:
            if column.name not in new.names:
                raise SourceError(
                    f"{at} drops column {column.name!r}, which the job reads: build the job "
                    "again (a new run) to read the table's new columns"
                )
            kind = new.field(column.name).type
            if kind != column.type:
                raise SourceError(
                    f"{at} changes column {column.name!r} from {column.type} to {kind}: build "
                    "the job again (a new run) to read the table's new types"
                )
        columns = commit.partition_columns
        if columns is not None and columns != self.source.partition_columns:
            raise SourceError(
                f"{at} changes the partition columns from {list(self.source.partition_columns)} "
                f"to {list(columns)}"
            )
        added = [c for c in new.names if c not in self.source.table_columns]
        if added:
            self._tell(
                commit.version,
                f"{at} adds column(s) {', '.join(map(repr, added))}, which the job does not "
                "read (it reads the columns the table had when it was built: build it again "
                "to read them)",
            )

    def _tell(self, version: int, message: str) -> None:
        """Say ``message`` of ``version`` to the job's listener once: from the subtask that
        has slice ``version mod slices``."""
        if f"{version % self.source.slices}/{self.source.slices}" not in self.slices:
            return
        if self.context.warn is not None:
            self.context.warn(message)


def _is_position(position: Any) -> bool:
    if not isinstance(position, tuple) or len(position) != 5:
        return False
    version, snapshot, index, path, rows = position
    counts = all(type(n) is int and n >= 0 for n in (version, index, rows))
    return counts and isinstance(snapshot, bool) and (path is None or isinstance(path, str))


def _millis(when: Any) -> int:
    """``starting_timestamp`` in epoch milliseconds: a ``datetime`` (without a zone: UTC), a
    ``date`` (its midnight, UTC), or their ISO-8601 text."""
    value = when
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(
                f"read_delta: starting_timestamp {when!r} is not an ISO-8601 date or time"
            ) from None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if not isinstance(value, datetime):
        raise TypeError(
            f"read_delta: starting_timestamp is a datetime, a date or ISO-8601 text, not {when!r}"
        )
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)
