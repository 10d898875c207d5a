"""Replayable sources: a generated sequence, and Parquet, CSV or JSON-lines files.

This module holds the sources themselves (:class:`SequenceSource`, :class:`FileSource` and
their readers); what a file input is (formats, options, errors) is in ``formats.py``, reading
each format in ``csv.py``, ``jsonl.py`` and ``parquet.py`` (the rows they share, and how a bad
one is refused, in ``rows.py``), and the schema inferred when none is given in
``inference.py``.

Both are sources of the public connector API (:mod:`cutline.connectors`): their splits do
not depend on the parallelism (``slices`` for a sequence, one per file), each subtask reads
those :func:`~cutline.protocol.splits.owner` deals it, and a reader's position per split goes
into each checkpoint; a restore, at any parallelism, gives each split to its new reader from
there, which replays exactly the records after it. Records come out as
``pyarrow.RecordBatch`` es.

* :class:`SequenceSource` — integers ``start, start+1, ...`` (bounded by ``end`` or not), in
  ``slices`` splits (split ``j`` holds ``start + j``, ``start + j + slices``, ...); position:
  per split, how many it emitted.
* :class:`FileSource` — the files of a directory, one file or a glob pattern (a local path or
  any fsspec URL), sorted by name, one split per file, listed and read with **one schema**
  fixed when the job is built (given, or inferred from a sample of every file:
  :meth:`FileSource.prepare`); position: per file, the rows consumed (handed out or
  rejected). CSV and JSON-lines files are read a block of whole records at a time
  (``block_size``), Parquet files a row group's batch at a time. A record that is malformed
  or does not fit the schema is *rejected*, naming ``file:line`` (1-based): an error, or a
  dead letter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from cutline.connectors.source import (
    Finished,
    Nothing,
    ReadResult,
    Records,
    Source,
    SourceContext,
    SplitReader,
)
from cutline.protocol.splits import Split
from cutline.runtime.io.file_formats import PARQUET, InputFormat
from cutline.runtime.io.formats import BLOCK_BYTES, SourceError, as_schema
from cutline.runtime.io.inference import infer_schema
from cutline.runtime.io.rows import Block, Reject

_GLOB = re.compile(r"[*?[]")


def _check_subtask(subtask: int, parallelism: int) -> None:
    if parallelism < 1 or not 0 <= subtask < parallelism:
        raise ValueError(f"subtask {subtask} of parallelism {parallelism} does not exist")


@dataclass(frozen=True)
class SequenceSource(Source):
    """The integers from ``start`` up to ``end`` (excluded; ``None``: without end), in a column
    named ``column``, in ``slices`` splits (split ``j`` holds ``start + j``, ``start + j +
    slices``, ...; numbered ``j``: dealt round-robin)."""

    start: int = 0
    end: int | None = None
    column: str = "value"
    slices: int = 128
    watermarks_per_split = False  # (read together: a round of every split at a time)

    def __post_init__(self) -> None:
        if type(self.slices) is not int or self.slices < 1:
            raise ValueError(f"slices must be a positive integer, not {self.slices!r}")

    @property
    def bounded(self) -> bool:  # type: ignore[override]
        return self.end is not None

    def splits(self) -> list[Split]:
        return [Split(str(j), j) for j in range(self.slices)]

    def record_schema(self) -> pa.Schema:
        return pa.schema([(self.column, pa.int64())])

    def reader(self, context: SourceContext) -> SequenceReader:
        _check_subtask(context.subtask, context.parallelism)
        return SequenceReader(self)


class SequenceReader(SplitReader):
    """Reads its splits a round at a time: ``start + j + slices * r`` for each of its splits
    ``j``, round ``r`` after round (increasing values when the splits are at one round). Its
    position in a split is how many values of it it emitted."""

    def __init__(self, source: SequenceSource) -> None:
        self._source = source
        self._splits = np.zeros(0, dtype=np.int64)
        self._emitted = np.zeros(0, dtype=np.int64)
        self._said: set[str] = set()
        """Splits past the end that :meth:`read` said finished."""

    def add_split(self, split: Split, position: Any) -> None:
        count = 0 if position is None else position
        if type(count) is not int or count < 0:
            raise SourceError(
                f"a sequence position is a count of 0 or more, not {count!r} (split {split.id})"
            )
        j = int(split.id)
        order = np.searchsorted(self._splits, j)
        self._splits = np.insert(self._splits, order, j)
        self._emitted = np.insert(self._emitted, order, count)

    def position(self, split: str) -> int:
        return int(self._emitted[int(np.searchsorted(self._splits, int(split)))])

    def read(self, max_records: int) -> ReadResult:
        batch = self._read(max_records)
        if batch is not None:
            return Records(batch, None)
        end = self._source.end
        if end is not None:  # the splits past the end, one at a time
            past = self._source.start + self._splits + self._source.slices * self._emitted >= end
            for j in self._splits[past].tolist():
                if str(j) not in self._said:
                    self._said.add(str(j))
                    return Finished(str(j))
        return Nothing()

    def _read(self, max_rows: int) -> pa.RecordBatch | None:
        source, splits, emitted = self._source, self._splits, self._emitted
        start, end, width = source.start, source.end, source.slices
        chunks: list[np.ndarray] = []
        need = max_rows
        while need > 0 and len(splits):
            following = start + splits + width * emitted
            live = np.ones(len(splits), bool) if end is None else following < end
            if not live.any():
                break
            lowest = emitted[live].min()
            active = live & (emitted == lowest)
            count = int(active.sum())
            if count == int(live.sum()) and need >= count:
                # every live split at one round: several rounds at once, in increasing order
                rounds = need // count
                values = (
                    start
                    + splits[active][None, :]
                    + width * (lowest + np.arange(rounds, dtype=np.int64))[:, None]
                ).ravel()
                if end is not None:
                    values = values[: int(np.searchsorted(values, end))]
                whole, rest = divmod(len(values), count)
                taken = np.full(count, whole, dtype=np.int64)
                taken[:rest] += 1
                emitted[np.flatnonzero(active)] += taken
            else:  # splits at different rounds (after a rescaled restore): the laggards first
                indices = np.flatnonzero(active)[:need]
                values = start + splits[indices] + width * emitted[indices]
                emitted[indices] += 1
            chunks.append(values)
            need -= len(values)
        if not chunks or need == max_rows:
            return None
        values = np.concatenate(chunks)
        return pa.record_batch([pa.array(values, pa.int64())], names=[source.column])


@dataclass(frozen=True)
class FileSource(Source):
    """The files of ``path`` in ``format`` (:data:`~cutline.runtime.io.file_formats.PARQUET`,
    a :class:`~cutline.runtime.io.file_formats.CsvFormat` or
    :data:`~cutline.runtime.io.file_formats.JSONL`), read with one schema.

    ``path`` is a directory (its files with the format's suffixes, not those whose names start
    with ``.`` or ``_``), one file, or a glob pattern (every file it matches, whatever its
    suffix, and the format's files of each directory it matches); a local path or any fsspec
    URL. The files are sorted by name and are the source's splits.

    ``schema`` is fixed on the driver when the job is built (:meth:`prepare`: the user's, or
    inferred from a sample of every file), so that every subtask and every restart reads the
    same types; every batch has exactly these columns. ``schema`` given (a ``pyarrow.Schema``
    or a dict of column -> type) is the whole schema; ``types`` given instead (the same) are
    the types of the columns it names, the others found and typed by inference (the file
    sources' ``schema=`` dict). A row whose values do not fit it, or a malformed record, is
    *rejected*: the reader raises :class:`SourceError` naming its file and line, or hands it
    to its ``rejected`` callback (the dead-letter output).
    """

    path: str
    format: InputFormat = PARQUET
    storage_options: Mapping[str, Any] | None = None
    schema: pa.Schema | None = None
    types: pa.Schema | None = None
    """The columns whose types the user set (the file sources' ``schema=`` as a dict), which
    inference leaves as they are; the other columns are found and typed as without
    ``schema=``. Ignored when ``schema`` is given."""
    block_size: int = BLOCK_BYTES
    """Bytes of a CSV or JSON-lines file parsed at a time (whole records)."""
    listed: tuple[str, ...] | None = None
    """The files found when the job was built (:meth:`prepare`), in name order: its splits,
    numbered so (dealt round-robin), the same for every subtask."""
    versions: tuple[str, ...] | None = None
    """The version (size, modification time) of each file of :attr:`listed` when the job was
    built: a restore reading on inside a file that changed since fails naming it."""
    monitor: float | None = None
    """A watched directory: seconds between two listings (files found later are dealt by a
    hash of their path); ``None``: the files of the listing only."""

    def __post_init__(self) -> None:
        if not isinstance(self.format, InputFormat):
            raise TypeError(
                f"format must be an InputFormat (cutline.runtime.io.file_formats), not "
                f"{self.format!r}"
            )
        if type(self.block_size) is not int or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, not {self.block_size!r}")
        if self.monitor is not None and not self.monitor > 0:
            raise ValueError(f"monitor must be a positive duration, not {self.monitor!r}")
        object.__setattr__(self, "schema", as_schema(self.schema))
        object.__setattr__(self, "types", as_schema(self.types))

    @property
    def bounded(self) -> bool:  # type: ignore[override]
        return self.monitor is None

    @property
    def discovery_interval(self) -> float | None:  # type: ignore[override]
        return self.monitor

    def filesystem(self) -> tuple[Any, str]:
        try:
            fs, root = fsspec.core.url_to_fs(self.path, **dict(self.storage_options or {}))
        except (OSError, ValueError, ImportError) as exc:
            raise SourceError(f"cannot open input {self.path}: {exc}") from exc
        return fs, str(root)

    def list_files(self) -> list[str]:
        """The input files, sorted by name. A path that is no file or directory (and no pattern)
        is an error; a pattern that matches nothing, or a directory without input files, is an
        empty input."""
        return [path for path, _ in self.found()]

    def found(self) -> list[tuple[str, str]]:
        """The input files, sorted by name, each with its version (size and modification
        time, as the file system says them)."""
        fs, root = self.filesystem()
        try:
            if fs.isdir(root):
                return self._listing(fs, root)
            if fs.isfile(root):
                return [(root, _version(fs.info(root)))]
            if not _GLOB.search(root):
                raise SourceError(f"input path {self.path} does not exist")
            found: dict[str, str] = {}
            for match, info in fs.glob(root, detail=True).items():
                if info.get("type") == "directory":
                    found.update(self._listing(fs, match))
                elif not _hidden(match):
                    found[str(match)] = _version(info)
            return sorted(found.items())
        except (OSError, ValueError) as exc:
            raise SourceError(f"cannot list input {self.path}: {exc}") from exc

    def _listing(self, fs: Any, directory: str) -> list[tuple[str, str]]:
        suffixes = self.format.suffixes
        return sorted(
            (str(info["name"]), _version(info))
            for info in fs.ls(directory, detail=True)
            if info.get("type") != "directory"
            and str(info["name"]).lower().endswith(suffixes)
            and not _hidden(str(info["name"]))
        )

    def prepare(self) -> tuple[FileSource, list[str]]:
        """On the driver, when the job is built: this source with its schema fixed (the given
        one, or one inferred from a sample of every file, with the ``types`` given: see
        ``read_csv``), and what the user should be warned about (no input files; a column
        read as text because it mixes numbers and text; a column of ``types`` that no file
        has). A path that does not exist raises :class:`SourceError`."""
        listing = self.found()
        files = [path for path, _ in listing]
        notes = [] if files or self.monitor is not None else [self._nothing()]
        source = self
        given = self.schema if self.schema is not None else self.types
        named = None if given is None else self.format.named_by(given)
        if named is not None:
            # files that do not name their columns: the schema's columns, in its order (a dict
            # then names every column: there is nothing else to name them)
            source = replace(self, format=named, schema=given)
        if source.schema is None and self.types is None and self.monitor is not None and not files:
            raise SourceError(
                f"{self.path} is watched (monitor=) but has no {self.format} file yet to read "
                "the columns from: give schema="
            )
        if source.schema is None:
            fs, _ = self.filesystem()
            schema, found = infer_schema(source.format.sample, fs, files, self.types)
            notes += found
            source = replace(source, schema=schema)
            if files and not len(schema):
                notes.append(
                    f"no column found in the head of the {len(files)} input file(s) of "
                    f"{self.path}: the stream will be empty; give schema= if they have columns"
                )
        else:  # (Parquet's footers say now if a file cannot be read so)
            self.format.check(self.filesystem()[0], files, source.schema)
        return replace(source, listed=tuple(files), versions=tuple(v for _, v in listing)), notes

    def _nothing(self) -> str:
        suffixes = " or ".join(f"'{s}'" for s in self.format.suffixes)
        fs, root = self.filesystem()
        where = (
            f"the directory {self.path} has no file whose name ends in {suffixes}"
            if fs.isdir(root)
            else f"the pattern {self.path} matches no file (nor a directory with a file whose "
            f"name ends in {suffixes})"
        )
        return (
            f"no {self.format} input: {where} (names starting with '.' or '_' are left out); "
            "the stream will be empty"
        )

    def record_schema(self) -> pa.Schema | None:
        return self.schema

    def splits(self) -> list[Split]:
        """Its files: those listed when the job was built, numbered in name order (listed now
        when it was not prepared); watched, every file there now, those found since the job
        was built unnumbered."""
        if self.monitor is None:
            if self.listed is None:
                return [Split(path, i, v) for i, (path, v) in enumerate(self.found())]
            versions = self.versions or (None,) * len(self.listed)
            return [
                Split(path, i, v)
                for i, (path, v) in enumerate(zip(self.listed, versions, strict=True))
            ]
        numbered = {path: i for i, path in enumerate(self.listed or ())}
        return [Split(path, numbered.get(path), version) for path, version in self.found()]

    def reader(self, context: SourceContext) -> FileReader:
        """The reader of one subtask; ``context.rejected(record, error)`` takes the rejected
        rows (``None``: the first one raises :class:`SourceError`)."""
        _check_subtask(context.subtask, context.parallelism)
        source = self if self.schema is not None else self.prepare()[0]
        fs, _ = self.filesystem()
        return FileReader(source, fs, context.rejected)


def _version(info: Mapping[str, Any]) -> str:
    """A file's version as a listing gives it: its size, and when it was last modified."""
    modified = next(
        (info[k] for k in ("mtime", "LastModified", "last_modified", "updated") if k in info), None
    )
    return f"{info.get('size')} bytes" + (f", modified {modified}" if modified else "")


def _hidden(path: str) -> bool:
    return path.rstrip("/").rsplit("/", 1)[-1].startswith((".", "_"))


class FileReader(SplitReader):
    """Reads its files one after the other, in the order it was given them. Its position in a
    file is the rows *consumed*: handed out or rejected, in the file's order; a reader given
    the file at that position parses it again from its start and passes over exactly those
    rows (a rejected one is not rejected again)."""

    def __init__(
        self,
        source: FileSource,
        fs: Any,
        rejected: Callable[[Any, str], None] | None = None,
    ) -> None:
        self._source = source
        self._fs = fs
        self._files: list[str] = []
        """The files to read, the one being read first."""
        self._rows: dict[str, int] = {}
        self._versions: dict[str, str | None] = {}
        """Each file's version when it was listed (``None``: unknown)."""
        self._rejected = rejected
        self._blocks: Iterator[Block] | None = None
        self._block: Block | None = None

    def add_split(self, split: Split, position: Any) -> None:
        rows = 0 if position is None else position
        if type(rows) is not int or rows < 0:
            raise SourceError(
                f"a file position is a count of rows of 0 or more, not {rows!r} ({split.id})"
            )
        self._files.append(split.id)
        self._rows[split.id] = rows
        self._versions[split.id] = split.version

    def position(self, split: str) -> int:
        return self._rows[split]

    def lowest_timestamp(self, split: str, column: str) -> int | None:
        """The lowest value of ``column`` in the file when its format tells it without
        reading the rows (a Parquet footer)."""
        return self._source.format.lowest_timestamp(self._fs, split, column)

    def head(self, path: str) -> pa.RecordBatch | None:
        """The first rows of file ``path`` that fit the schema (its first block with any),
        read apart from the reading; ``None`` when it has none or cannot be read (reading it
        says why)."""
        try:
            blocks = _open_blocks(self._source, self._fs, path)
            try:
                return next((b.batch for b in blocks if b.batch.num_rows), None)
            finally:
                close = getattr(blocks, "close", None)
                if close is not None:
                    close()
        except (SourceError, OSError):
            return None

    def read(self, max_records: int) -> ReadResult:
        if max_records < 1:  # (a block's rows are never skipped for want of room)
            raise ValueError(f"read needs max_records of at least 1, not {max_records}")
        if not self._files:
            return Nothing()
        path = self._files[0]
        if self._blocks is None:
            if self._rows[path]:
                self._check_unchanged(path)
            self._blocks = _open_blocks(self._source, self._fs, path)
            self._pass_over(path, self._rows[path])
        batch = self._take(path, max_records)
        if batch is not None:
            return Records(batch, path)
        self.close()
        self._files.pop(0)
        del self._rows[path]
        return Finished(path)

    def _check_unchanged(self, path: str) -> None:
        """A file read on from a restored position is the one the position counted: there
        still, of the version it was listed with (when known)."""
        rows, version = self._rows[path], self._versions.get(path)
        try:
            now = _version(self._fs.info(path))
        except FileNotFoundError:
            raise SourceError(
                f"{path} is gone, though the checkpoint restored read {rows:,} rows of it and "
                "holds the rest as still to read: put it back, or run the job afresh"
            ) from None
        except OSError:
            return  # (reading it says why)
        if version is not None and now != version:
            raise SourceError(
                f"{path} changed since it was listed (it was {version}, it is {now}), and the "
                f"checkpoint restored read {rows:,} rows of it: the rows after those are not "
                "the ones it counted. A file is read once: put new data in a new file, or run "
                "the job afresh"
            )

    def close(self) -> None:
        """Closes the file being read (reading goes on with the next one)."""
        if self._blocks is not None:
            close = getattr(self._blocks, "close", None)
            if close is not None:
                close()
        self._blocks = None
        self._block = None

    def _next(self, path: str) -> Block | None:
        if self._block is None:
            assert self._blocks is not None
            try:
                self._block = next(self._blocks, None)
            except (pa.ArrowException, OSError) as exc:
                raise SourceError(f"cannot read {path}: {exc}") from exc
        return self._block

    def _take(self, path: str, max_rows: int) -> pa.RecordBatch | None:
        while (block := self._next(path)) is not None:
            while (reject := block.reject_due()) is not None:
                self._reject(reject)
                block.reject += 1
                self._rows[path] += 1
            start = block.row
            count = min(max_rows, block.batch.num_rows - start)
            if count > 0:
                block.row += count
                # the rejects among the rows handed out (those after the last wait)
                while (
                    block.reject < len(block.rejects)
                    and block.rejects[block.reject].before < block.row
                ):
                    self._reject(block.rejects[block.reject])
                    block.reject += 1
                    self._rows[path] += 1
                self._rows[path] += count
                return block.batch.slice(start, count)
            self._block = None
        return None

    def _pass_over(self, path: str, rows: int) -> None:
        """Consume the first ``rows`` rows (good or rejected) without handing them out."""
        while rows > 0:
            block = self._next(path)
            if block is None:
                raise SourceError(
                    f"the offset says {self._rows[path]} rows of {path} were read, but it has "
                    "fewer: the file changed since the checkpoint"
                )
            if block.reject_due() is not None:
                block.reject += 1
                rows -= 1
                continue
            limit = block.batch.num_rows - block.row
            if block.reject < len(block.rejects):
                limit = block.rejects[block.reject].before - block.row
            if limit > 0:
                count = min(rows, limit)
                block.row += count
                rows -= count
            elif block.reject >= len(block.rejects):
                self._block = None

    def _reject(self, reject: Reject) -> None:
        error = f"{reject.where}: {reject.reason}"
        if self._rejected is None:
            raise SourceError(error, record=reject.record)
        self._rejected(reject.record, error)


def _open_blocks(source: FileSource, fs: Any, path: str) -> Iterator[Block]:
    try:
        handle = fs.open(path, "rb")
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    assert source.schema is not None
    return source.format.blocks(handle, path, source.schema, source.block_size)
