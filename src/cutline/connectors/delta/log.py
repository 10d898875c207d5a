"""A Delta table's log as a stream reads it (:class:`TableLog`): the data files of the table at
a version (its snapshot, from delta-rs), and what each later commit did, read from its JSON
file in ``_delta_log`` (:class:`Commit`: the files it added, whether it removed data, a new
schema). Spark's Delta source reads the same two things (``getSnapshotAt``, ``getChanges``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError, TableNotFoundError

from cutline.connectors.delta.files import table_store
from cutline.connectors.source import SourceError
from cutline.connectors.tables.parts import line

LOG = "_delta_log"
READABLE_MAPPING = (None, "none")
"""The column mapping modes whose data files name their columns as the table does."""


@dataclass(frozen=True)
class AddedFile:
    """A data file a version added (or holds, in a snapshot)."""

    path: str
    """Relative to the table's root, as on the store (the log's URI encoding undone)."""
    partition: Mapping[str, Any]
    """Its partition values: text as the log writes them (a commit's), or values (delta-rs's,
    of a snapshot); ``None``: null."""
    deletion_vector: bool = False
    """Whether rows of it are deleted by a deletion vector (which this source cannot apply)."""


@dataclass(frozen=True)
class Commit:
    """What one version of the table did, as a stream sees it."""

    version: int
    operation: str
    """Its ``commitInfo``'s operation (``WRITE``, ``DELETE``, ``MERGE``, ``OPTIMIZE``...)."""
    parameters: Mapping[str, Any]
    added: tuple[AddedFile, ...]
    """The files it added with ``dataChange`` (new rows), in the log's order; compaction's
    (``dataChange=false``) are not."""
    removed: str | None
    """A file it removed with ``dataChange`` (rows deleted or rewritten), if any."""
    schema: pa.Schema | None = None
    """The table's schema from this version on, if its ``metaData`` action set one."""
    partition_columns: tuple[str, ...] | None = None
    column_mapping: str | None = None

    def describe(self) -> str:
        """``version 7 (DELETE, predicate=a = 2)``: the version, its operation and how."""
        how = ", ".join(
            f"{k}={v}" for k, v in sorted(self.parameters.items()) if v not in (None, "")
        )
        return f"version {self.version} ({self.operation}{', ' + how if how else ''})"


def open_table(path: str, options: dict[str, str] | None, version: int | None = None) -> DeltaTable:
    """The table at ``path`` (at ``version``: ``None``, its newest), or a :class:`SourceError`
    saying why not."""
    try:
        return DeltaTable(path, version=version, storage_options=options)
    except TableNotFoundError:
        raise SourceError(
            f"no Delta table at {path} (no {LOG} folder with a commit in it)"
            if version is None
            else f"Delta table {path}: version {version} cannot be loaded any more (its log "
            "was cleaned up: delta.logRetentionDuration)"
        ) from None
    except DeltaError as exc:
        at = "" if version is None else f" at version {version}"
        raise SourceError(f"cannot open the Delta table {path}{at}: {line(exc)}") from None


def arrow_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def column_mapping(table: DeltaTable) -> str | None:
    return table.metadata().configuration.get("delta.columnMapping.mode")


class TableLog:
    """The log and the data files of the table at ``path`` (see the module's docstring), read
    by one subtask (or the driver)."""

    def __init__(self, path: str, options: dict[str, str] | None) -> None:
        self.path, self.options = path, options
        self._store: pafs.FileSystem | None = None

    @property
    def store(self) -> pafs.FileSystem:
        """The table's folder, as a filesystem."""
        if self._store is None:
            try:
                self._store = table_store(self.path, self.options)
            except DeltaError as exc:
                raise SourceError(f"cannot open the Delta table {self.path}: {line(exc)}") from None
        return self._store

    def has(self, version: int) -> bool:
        """Whether the commit of ``version`` is in the log (written whole: a commit's file
        appears at once, by an atomic rename or put-if-absent)."""
        try:
            info = self.store.get_file_info(_commit_file(version))
        except OSError as exc:
            raise SourceError(
                f"cannot list the log of the Delta table {self.path}: {exc}"
            ) from None
        return bool(info.type == pafs.FileType.File)

    def check_kept(self, version: int) -> None:
        """A commit not in the log, when a checkpoint of the log is at or past it, was
        cleaned up (log cleanup removes only commits older than a checkpoint): a
        :class:`SourceError`, rather than waiting for it for ever."""
        name = f"{LOG}/_last_checkpoint"
        try:
            with self.store.open_input_stream(name) as stream:
                last = int(json.loads(stream.read().decode())["version"])
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"Delta table {self.path}: cannot read {name}: {exc}") from None
        if last >= version:
            raise SourceError(
                f"Delta table {self.path}: the commit of version {version} is not in its log, "
                f"which has a checkpoint at version {last}: it was cleaned up "
                "(delta.logRetentionDuration) before it was read"
            )

    def commit(self, version: int) -> Commit:
        """What ``version`` did; a :class:`SourceError` when its commit is not in the log (not
        yet, or cleaned up)."""
        name = _commit_file(version)
        try:
            with self.store.open_input_stream(name) as stream:
                text = stream.read().decode()
        except FileNotFoundError:
            raise SourceError(
                f"Delta table {self.path}: the commit of version {version} is not in its log "
                f"({name}): cleaned up (delta.logRetentionDuration) before it was read"
            ) from None
        except OSError as exc:
            raise SourceError(f"Delta table {self.path}: cannot read {name}: {exc}") from None
        return parse_commit(version, text, f"Delta table {self.path}, {name}")

    def snapshot(self, version: int) -> list[AddedFile]:
        """The data files of the table at ``version``, sorted by path (the same order in every
        process)."""
        table = open_table(self.path, self.options, version)
        mapping = column_mapping(table)
        if mapping not in READABLE_MAPPING:
            raise SourceError(unreadable_mapping(self.path, version, mapping))
        adds = pa.table(table.get_add_actions(flatten=False))
        paths = [unquote(p) for p in adds.column("path").to_pylist()]
        names = adds.column_names
        values = adds.column("partition").to_pylist() if "partition" in names else None
        deleted = with_deletion_vectors(table)
        files = [
            AddedFile(path, (values[i] or {}) if values else {}, path in deleted)
            for i, path in enumerate(paths)
        ]
        return sorted(files, key=lambda f: f.path)

    def first_version_at(self, millis: int) -> int | None:
        """The first version committed at or after ``millis`` (epoch milliseconds), as Spark's
        ``startingTimestamp``: the commits' own timestamps (``commitInfo``); ``None`` when
        every commit is older."""
        table = open_table(self.path, self.options)
        found = [int(h["version"]) for h in table.history() if int(h["timestamp"]) >= millis]
        return min(found) if found else None


def parse_commit(version: int, text: str, where: str) -> Commit:
    """A commit's actions (its JSON lines), as :class:`Commit`."""
    operation, parameters = "?", {}
    added: list[AddedFile] = []
    removed: str | None = None
    schema: pa.Schema | None = None
    partition_columns: tuple[str, ...] | None = None
    mapping: str | None = None
    for number, row in enumerate(text.splitlines(), 1):
        if not row.strip():
            continue
        try:
            action = json.loads(row)
        except ValueError as exc:
            raise SourceError(f"{where}, line {number}: not JSON ({exc})") from None
        if "commitInfo" in action:
            info = action["commitInfo"] or {}
            operation = str(info.get("operation") or "?")
            parameters = dict(info.get("operationParameters") or {})
        elif "add" in action:
            add = action["add"]
            if add.get("dataChange", True):
                values = dict(add.get("partitionValues") or {})
                dv = bool(add.get("deletionVector"))
                added.append(AddedFile(unquote(add["path"]), values, dv))
        elif "remove" in action:
            remove = action["remove"]
            if remove.get("dataChange", True) and removed is None:
                removed = unquote(remove["path"])
        elif "metaData" in action:
            meta = action["metaData"]
            try:
                schema = pa.schema(DeltaSchema.from_json(meta["schemaString"]).to_arrow())
            except Exception as exc:
                raise SourceError(f"{where}: its schema cannot be read: {line(exc)}") from None
            partition_columns = tuple(meta.get("partitionColumns") or ())
            mapping = (meta.get("configuration") or {}).get("delta.columnMapping.mode")
    return Commit(
        version,
        operation,
        parameters,
        tuple(added),
        removed,
        schema,
        partition_columns,
        mapping,
    )


def unreadable_mapping(path: str, version: int, mode: str | None) -> str:
    return (
        f"Delta table {path}: version {version} has column mapping (delta.columnMapping.mode="
        f"{mode}): its data files name the columns otherwise than the table, which this source "
        "does not read"
    )


def _commit_file(version: int) -> str:
    return f"{LOG}/{version:020d}.json"


def with_deletion_vectors(table: DeltaTable) -> set[str]:
    """The data files (relative paths) that have a deletion vector at the loaded version."""
    features = table.protocol().reader_features or []
    if "deletionVectors" not in features:
        return set()
    root = table.table_uri.rstrip("/") + "/"
    vectors = pa.table(table.deletion_vectors())
    return {
        unquote(uri[len(root) :] if uri.startswith(root) else uri)
        for uri in vectors.column("filepath").to_pylist()
    }
