"""Replayable sources: a generated sequence, and Parquet, CSV or JSON-lines files.

Every source is split between the subtasks of the source operator, and every
reader can say where it is (:meth:`SourceReader.offset`) and start again from
there (``open(..., offset=...)``): the offset goes into each checkpoint, and a
restore replays exactly the records after it. Records come out as
``pyarrow.RecordBatch`` es.

Every source is made of **splits** that do not depend on the parallelism, dealt
round-robin to the subtasks, and its offset is per split: so a checkpoint taken
at one parallelism restores at another (:func:`merge_offsets` joins the offsets
of the old subtasks, and each new subtask takes its splits' offsets).

* :class:`SequenceSource` — integers ``start, start+1, ...`` (bounded by ``end`` or not), in
  ``splits`` splits (split ``j`` holds ``start + j``, ``start + j + splits``, ...); offset: per
  split, how many it emitted.
* :class:`FileSource` — the files of a directory, one file or a glob pattern (a local path or
  any fsspec URL), sorted by name, one split per file, read with **one schema** fixed when the
  job is built (given, or inferred from a sample of every file: :meth:`FileSource.prepare`);
  offset: per file, the rows consumed (handed out or rejected). CSV and JSON-lines files are
  read a block of whole records at a time (``block_size``), Parquet files a row group's batch
  at a time. A record that is malformed or does not fit the schema is *rejected*, naming
  ``file:line`` (1-based): an error, or a dead letter.
"""

from __future__ import annotations

import bisect
import io
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

FORMATS = ("parquet", "csv", "jsonl")
_SUFFIXES = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "jsonl": (".jsonl", ".json")}
_GLOB = re.compile(r"[*?[]")

BLOCK_BYTES = 1 << 20
"""Bytes of a CSV or JSON-lines file parsed at once (whole records: more for a longer one)."""
SAMPLE_BYTES = 1 << 20
"""Schema inference reads at most this much of the head of every file..."""
SAMPLE_ROWS = 10_000
"""... and at most this many rows of it..."""
SAMPLE_TOTAL = 256 << 20
"""... and, with many files, this much in all (shared out evenly)..."""
SAMPLE_LEAST = 64 << 10
"""... but never less than this per file."""


class SourceError(Exception):
    """A source cannot be read: a missing path, a malformed file or record (named, with its
    line), a bad offset."""


class InputWarning(UserWarning):
    """What a file source's user should know when the job is built: no input files, a column
    read as text because its values mix numbers and text."""


class SourceReader(Protocol):
    def read(self, max_rows: int) -> pa.RecordBatch | None:
        """The next records (at most ``max_rows``); ``None`` once the input is exhausted, or, for
        an unbounded source, never."""
        ...

    def offset(self) -> dict[str, Any]:
        """Where the reader is: everything returned so far is before it."""
        ...


def _check_subtask(subtask: int, parallelism: int) -> None:
    if parallelism < 1 or not 0 <= subtask < parallelism:
        raise ValueError(f"subtask {subtask} of parallelism {parallelism} does not exist")


def merge_offsets(offsets: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One offset from the offsets of several subtasks (a restore at another parallelism):
    the union of their per-split positions. Each subtask then reads its own splits' from it."""
    merged: dict[str, dict[str, Any]] = {}
    for offset in offsets:
        for field_name, positions in offset.items():
            if not isinstance(positions, Mapping):
                raise SourceError(
                    f"a source offset with {field_name!r} = {positions!r} is not per split: it "
                    "was written by an older cutline and restores only at its own parallelism"
                )
            merged.setdefault(field_name, {}).update(positions)
    return merged


@dataclass(frozen=True)
class SequenceSource:
    """The integers from ``start`` up to ``end`` (excluded; ``None``: without end), in a column
    named ``column``."""

    start: int = 0
    end: int | None = None
    column: str = "value"
    splits: int = 128

    def __post_init__(self) -> None:
        if type(self.splits) is not int or self.splits < 1:
            raise ValueError(f"splits must be a positive integer, not {self.splits!r}")

    def open(
        self, subtask: int, parallelism: int, offset: Mapping[str, Any] | None = None
    ) -> SequenceReader:
        _check_subtask(subtask, parallelism)
        positions = dict((offset or {}).get("splits", {}))
        if offset and "splits" not in offset:
            merge_offsets([offset])  # says why it cannot be used
        mine = [j for j in range(self.splits) if j % parallelism == subtask]
        emitted = []
        for j in mine:
            found = positions.get(str(j), positions.get(j))  # (JSON made the keys strings)
            count = int(found) if found is not None else 0
            if count < 0:
                raise SourceError(f"a sequence offset cannot be negative: split {j} at {count}")
            emitted.append(count)
        return SequenceReader(self, mine, emitted)


class SequenceReader:
    """Reads its splits a round at a time: ``start + j + splits * r`` for each of its splits
    ``j``, round ``r`` after round (increasing values when the splits are at one round)."""

    def __init__(self, source: SequenceSource, splits: list[int], emitted: list[int]):
        self._source = source
        self._splits = np.array(splits, dtype=np.int64)
        self._emitted = np.array(emitted, dtype=np.int64)

    def read(self, max_rows: int) -> pa.RecordBatch | None:
        source, splits, emitted = self._source, self._splits, self._emitted
        start, end, width = source.start, source.end, source.splits
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

    def offset(self) -> dict[str, Any]:
        return {
            "splits": {
                str(j): int(n)
                for j, n in zip(self._splits.tolist(), self._emitted.tolist(), strict=True)
            }
        }


# --------------------------------------------------------------------------- files


@dataclass(frozen=True)
class CsvOptions:
    """How CSV files are written: the separator, the header, the quote, the null values."""

    delimiter: str = ","
    header: bool = True
    """Whether each file's first record names its columns (it is never read as data)."""
    quote: str | None = '"'
    """Quotes a value that holds the delimiter, a line break or a quote (doubled inside);
    ``None``: no quoting."""
    null_values: tuple[str, ...] = ("",)
    """Fields that read as null (quoted or not): by default the empty field only."""
    column_names: tuple[str, ...] | None = None
    """The columns' names, in the order of the fields (replacing the header's, if any)."""

    def __post_init__(self) -> None:
        for what, value in (("delimiter", self.delimiter), ("quote", self.quote)):
            if value is None and what == "quote":
                continue
            if not isinstance(value, str) or len(value.encode()) != 1 or value in "\r\n":
                raise ValueError(
                    f"{what} must be one ASCII character other than a line break, not {value!r}"
                )
        if self.quote == self.delimiter:
            raise ValueError(f"the quote and the delimiter are both {self.delimiter!r}")
        if type(self.header) is not bool:
            raise ValueError(f"header must be True or False, not {self.header!r}")
        nulls = self.null_values
        if isinstance(nulls, str | bytes) or not all(isinstance(v, str) for v in nulls):
            raise ValueError(f"null_values must be a list of strings, not {nulls!r}")
        object.__setattr__(self, "null_values", tuple(nulls))
        names = self.column_names
        if names is not None:
            if isinstance(names, str | bytes) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"column_names must be a list of strings, not {names!r}")
            if not names:
                raise ValueError("column_names must name at least one column")
            twice = _first_duplicate(names)
            if twice is not None:
                raise ValueError(f"column_names names {twice!r} twice")
            object.__setattr__(self, "column_names", tuple(names))


_TYPE_NAMES = {
    "int": pa.int64(),
    "integer": pa.int64(),
    "long": pa.int64(),
    "float": pa.float64(),
    "str": pa.string(),
    "text": pa.string(),
    "date": pa.date32(),
    "datetime": pa.timestamp("us"),
    "timestamp": pa.timestamp("us"),
    "timestamp[us, tz=utc]": pa.timestamp("us", tz="UTC"),  # (looked up in lower case)
}


def as_schema(value: Any) -> pa.Schema | None:
    """``schema=`` as a ``pyarrow.Schema``: one as it is, or a dict of column -> type (a
    pyarrow type, or its name: ``"string"``, ``"int64"``, ``"double"``, ``"bool"``,
    ``"date32"``, ``"timestamp[us]"``, ...; also ``"int"``, ``"float"``, ``"str"``)."""
    if value is None or isinstance(value, pa.Schema):
        if value is not None:
            twice = _first_duplicate(value.names)
            if twice is not None:
                raise ValueError(f"schema: column {twice!r} is named twice")
        return value
    if not isinstance(value, Mapping):
        raise TypeError(
            "schema must be a pyarrow.Schema or a dict of column -> type, not "
            f"{type(value).__name__}"
        )
    if not value:
        raise ValueError("schema: give at least one column")
    fields = []
    for name, kind in value.items():
        if not isinstance(name, str):
            raise ValueError(f"schema: column names are strings, not {name!r}")
        fields.append(pa.field(name, _as_type(name, kind)))
    return pa.schema(fields)


def _as_type(name: str, kind: Any) -> pa.DataType:
    if isinstance(kind, pa.DataType):
        return kind
    if isinstance(kind, str):
        found = _TYPE_NAMES.get(kind.strip().lower())
        if found is not None:
            return found
        try:
            return pa.type_for_alias(kind.strip())
        except ValueError:
            pass
    raise ValueError(
        f"schema: column {name!r} has the unknown type {kind!r} (use a pyarrow type, or a name "
        "like 'string', 'int64', 'double', 'bool', 'date32', 'timestamp[us]')"
    )


def _first_duplicate(names: Sequence[str]) -> str | None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


@dataclass(frozen=True)
class FileSource:
    """The files of ``path`` in ``format`` (``parquet``, ``csv`` or ``jsonl``), read with one
    schema.

    ``path`` is a directory (its files with the format's suffixes, not those whose names start
    with ``.`` or ``_``), one file, or a glob pattern (every file it matches, whatever its
    suffix, and the format's files of each directory it matches); a local path or any fsspec
    URL. The files are sorted by name and are the source's splits.

    ``schema`` is fixed on the driver when the job is built (:meth:`prepare`: the user's, or
    inferred from a sample of every file), so that every subtask and every restart reads the
    same types; every batch has exactly these columns. A row whose values do not fit it, or a
    malformed record, is *rejected*: the reader raises :class:`SourceError` naming its file and
    line, or hands it to its ``rejected`` callback (the dead-letter output).
    """

    path: str
    format: str = "parquet"
    storage_options: Mapping[str, Any] | None = None
    schema: pa.Schema | None = None
    csv: CsvOptions = field(default_factory=CsvOptions)
    block_size: int = BLOCK_BYTES
    """Bytes of a CSV or JSON-lines file parsed at a time (whole records)."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(
                f"unknown file format {self.format!r}: use one of {', '.join(FORMATS)}"
            )
        if type(self.block_size) is not int or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, not {self.block_size!r}")
        object.__setattr__(self, "schema", as_schema(self.schema))

    def _fs(self) -> tuple[Any, str]:
        try:
            fs, root = fsspec.core.url_to_fs(self.path, **dict(self.storage_options or {}))
        except (OSError, ValueError, ImportError) as exc:
            raise SourceError(f"cannot open input {self.path}: {exc}") from exc
        return fs, str(root)

    def files(self) -> list[str]:
        """The input files, sorted by name. A path that is no file or directory (and no pattern)
        is an error; a pattern that matches nothing, or a directory without input files, is an
        empty input."""
        fs, root = self._fs()
        try:
            if fs.isdir(root):
                return self._listing(fs, root)
            if fs.isfile(root):
                return [root]
            if not _GLOB.search(root):
                raise SourceError(f"input path {self.path} does not exist")
            found: set[str] = set()
            for match, info in fs.glob(root, detail=True).items():
                if info.get("type") == "directory":
                    found.update(self._listing(fs, match))
                elif not _hidden(match):
                    found.add(str(match))
            return sorted(found)
        except (OSError, ValueError) as exc:
            raise SourceError(f"cannot list input {self.path}: {exc}") from exc

    def _listing(self, fs: Any, directory: str) -> list[str]:
        suffixes = _SUFFIXES[self.format]
        return sorted(
            str(info["name"])
            for info in fs.ls(directory, detail=True)
            if info.get("type") != "directory"
            and str(info["name"]).lower().endswith(suffixes)
            and not _hidden(str(info["name"]))
        )

    def prepare(self) -> tuple[FileSource, list[str]]:
        """On the driver, when the job is built: this source with its schema fixed (the given
        one, or one inferred from a sample of every file: see ``read_csv``), and what the user
        should be warned about (no input files; a column read as text because it mixes
        numbers and text). A path that does not exist raises :class:`SourceError`."""
        files = self.files()
        notes = [] if files else [self._nothing()]
        source = self
        csv = self.csv
        if (
            self.format == "csv"
            and not csv.header
            and csv.column_names is None
            and self.schema is not None
        ):
            # no header, no names: the schema's columns, in its order
            source = replace(self, csv=replace(csv, column_names=tuple(self.schema.names)))
        if source.schema is None:
            schema, found = _infer(source, files)
            notes += found
            source = replace(source, schema=schema)
            if files and not len(schema):
                notes.append(
                    f"no column found in the head of the {len(files)} input file(s) of "
                    f"{self.path}: the stream will be empty; give schema= if they have columns"
                )
        elif self.format == "parquet":  # the footers say now if a file cannot be read so
            fs, _ = self._fs()
            for path in files:
                _check_castable(_parquet_schema(fs, path), source.schema, path)
        return source, notes

    def _nothing(self) -> str:
        suffixes = " or ".join(f"'{s}'" for s in _SUFFIXES[self.format])
        fs, root = self._fs()
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

    def open(
        self,
        subtask: int,
        parallelism: int,
        offset: Mapping[str, Any] | None = None,
        rejected: Callable[[Any, str], None] | None = None,
    ) -> FileReader:
        """The reader of subtask ``subtask``: files ``subtask``, ``subtask + parallelism``, ...
        after ``offset``. ``rejected(record, error)`` takes the rejected rows (``None``: the
        first one raises :class:`SourceError`)."""
        _check_subtask(subtask, parallelism)
        source = self if self.schema is not None else self.prepare()[0]
        fs, _ = self._fs()
        mine = [f for i, f in enumerate(source.files()) if i % parallelism == subtask]
        if offset:
            merge_offsets([offset])  # an offset that is not per split says why
        done = {str(k): int(v) for k, v in dict(offset or {}).get("rows", {}).items()}
        return FileReader(source, fs, mine, done, rejected)


def _hidden(path: str) -> bool:
    return path.rstrip("/").rsplit("/", 1)[-1].startswith((".", "_"))


@dataclass
class _Reject:
    before: int
    """How many good rows of its block come before it."""
    where: str
    """``path:line`` (``path, row n`` for Parquet)."""
    record: Any
    """What goes to the dead letters: the line's text (the row for Parquet)."""
    reason: str


@dataclass
class _Block:
    """A block of a file, parsed: its good rows in the job's schema, and the rejected ones."""

    batch: pa.RecordBatch
    rejects: list[_Reject]
    row: int = 0
    """The next good row to hand out."""
    reject: int = 0
    """The next reject to consume."""

    def reject_due(self) -> _Reject | None:
        """The next reject, if it comes before the next good row."""
        if self.reject < len(self.rejects) and self.rejects[self.reject].before <= self.row:
            return self.rejects[self.reject]
        return None


class FileReader:
    """Reads its files in order. Its offset is, per file, the rows *consumed*: handed out or
    rejected, in the file's order; a reader opened at that offset parses the file again from
    its start and passes over exactly those rows (a rejected one is not rejected again)."""

    def __init__(
        self,
        source: FileSource,
        fs: Any,
        files: list[str],
        done: dict[str, int],
        rejected: Callable[[Any, str], None] | None = None,
    ) -> None:
        self._source = source
        self._fs = fs
        self._files = files
        self._rows = {f: done.get(f, 0) for f in files}
        self._rejected = rejected
        self._index = 0
        self._blocks: Iterator[_Block] | None = None
        self._block: _Block | None = None

    def offset(self) -> dict[str, Any]:
        return {"rows": {f: n for f, n in self._rows.items() if n}}

    def read(self, max_rows: int) -> pa.RecordBatch | None:
        if max_rows < 1:  # (a block's rows are never skipped for want of room)
            raise ValueError(f"read needs max_rows of at least 1, not {max_rows}")
        while self._index < len(self._files):
            path = self._files[self._index]
            if self._blocks is None:
                self._blocks = _open_blocks(self._source, self._fs, path)
                self._pass_over(path, self._rows[path])
            batch = self._take(path, max_rows)
            if batch is not None:
                return batch
            self.close()
            self._index += 1
        return None

    def close(self) -> None:
        """Closes the file being read (reading goes on with the next one)."""
        if self._blocks is not None:
            close = getattr(self._blocks, "close", None)
            if close is not None:
                close()
        self._blocks = None
        self._block = None

    def _next(self, path: str) -> _Block | None:
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

    def _reject(self, reject: _Reject) -> None:
        error = f"{reject.where}: {reject.reason}"
        if self._rejected is None:
            raise SourceError(error)
        self._rejected(reject.record, error)


def _open_blocks(source: FileSource, fs: Any, path: str) -> Iterator[_Block]:
    try:
        handle = fs.open(path, "rb")
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
    assert source.schema is not None
    if source.format == "parquet":
        return _parquet_blocks(handle, path, source.schema)
    if source.format == "csv":
        return _csv_blocks(handle, path, source)
    return _jsonl_blocks(handle, path, source)


# ------------------------------------------------------------------- the job's schema


def _conform(
    table: pa.Table, schema: pa.Schema, path: str, trim: bool = False, utf8: bool = False
) -> tuple[pa.RecordBatch, dict[int, str]]:
    """``table``'s rows in ``schema``: its columns by name (one it lacks is null, one more is
    left out), each cast to its type (``trim``: text without the spaces around it, for a
    column that is not text; ``utf8``: text checked to be UTF-8, which pyarrow.json does
    not). Returns the rows that fit, and for each row that does not (by index) why. A column
    whose type cannot be cast at all is an error naming the file."""
    rows = table.num_rows
    names = set(table.column_names)
    failed: dict[int, str] = {}
    arrays: list[Any] = []
    for target in schema:
        if target.name not in names:
            arrays.append(pa.nulls(rows, target.type))
            continue
        column = table.column(target.name).combine_chunks()
        if utf8:
            for i in _halving(column, _validate):
                failed.setdefault(i, f"column {target.name!r}: not UTF-8 text")
        if column.type == target.type:
            arrays.append(column)
            continue
        if trim and pa.types.is_string(column.type):
            column = pc.utf8_trim_whitespace(column)
        arrays.append(column)
        try:
            arrays[-1] = column.cast(target.type)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SourceError(
                f"{path}: column {target.name!r} holds {column.type} values, which cannot be "
                f"read as {target.type} ({exc})"
            ) from exc
        except pa.ArrowInvalid:
            for i in _halving(column, _caster(target.type)):
                if i not in failed:
                    value = _show(column[i].as_py())
                    failed[i] = f"column {target.name!r}: {value} is not {_a(target.type)}"
    if failed:
        keep = np.ones(rows, dtype=bool)
        keep[list(failed)] = False
        mask = pa.array(keep)
        arrays = [
            a.filter(mask) if a.type == t.type else a.filter(mask).cast(t.type)
            for a, t in zip(arrays, schema, strict=True)
        ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema), failed


def _caster(target: pa.DataType) -> Callable[[Any], Any]:
    options = pc.CastOptions.safe(target)
    return lambda part: pc.call_function("cast", [part], options)


def _validate(part: Any) -> None:
    part.validate(full=True)


def _halving(column: Any, check: Callable[[Any], Any]) -> list[int]:
    """The indices of the values of ``column`` that ``check`` refuses (raises
    ``ArrowInvalid``), by halving."""
    found: list[int] = []

    def visit(part: Any, start: int) -> None:
        try:
            check(part)
            return
        except pa.ArrowInvalid:
            if len(part) == 1:
                found.append(start)
                return
        half = len(part) // 2
        visit(part.slice(0, half), start)
        visit(part.slice(half), start + half)

    visit(column, 0)
    return found


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _a(kind: pa.DataType) -> str:
    name = str(kind)
    return ("an " if name[:1] in ("a", "e", "i", "o") else "a ") + name


@dataclass
class _Rows:
    """Rows of a block before the schema is applied, with where each comes from (``lines``,
    ``texts``: ``None`` when not worked out), and the records rejected while parsing."""

    table: pa.Table
    lines: list[int] | None = None
    texts: list[bytes] | None = None
    bad: list[tuple[int, bytes, str]] = field(default_factory=list)


def _assemble(rows: _Rows, batch: pa.RecordBatch, failed: dict[int, str], path: str) -> _Block:
    """The block of ``rows`` (conformed: ``batch``, ``failed``), every rejected record placed
    among the good rows by its line."""
    bad = list(rows.bad)
    good_lines: list[int] = []
    if failed or bad:
        assert rows.lines is not None and rows.texts is not None
        for i, reason in failed.items():
            bad.append((rows.lines[i], rows.texts[i], reason))
        good_lines = [line for i, line in enumerate(rows.lines) if i not in failed]
    rejects = [
        _Reject(bisect.bisect_left(good_lines, line), f"{path}:{line}", _text(text), reason)
        for line, text, reason in sorted(bad, key=lambda b: b[0])
    ]
    return _Block(batch, rejects)


def _text(record: bytes) -> str:
    return record.decode("utf-8", errors="replace").removesuffix("\r")


# ------------------------------------------------------------------- lines and records


def _blocks(
    stream: Any, size: int, quote: bytes | None, limit: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """The file in blocks of whole records, each with the number of its first line. A record
    ends at a line break outside quotes (RFC 4180: a quote inside a quoted value is doubled,
    so a record is whole where the quotes are even). With ``limit``, at most that many bytes
    are read and the last incomplete record is left out (a sample)."""
    line, rest, read, first = 1, b"", 0, True
    while True:
        want = size if limit is None else min(size, limit - read)
        if first:  # (at least the 3 bytes of a UTF-8 byte order mark, left out)
            chunk = stream.read(max(want, 3))
            read, first = len(chunk), False
            chunk = chunk.removeprefix(b"\xef\xbb\xbf")
        else:
            chunk = stream.read(want) if want > 0 else b""
            read += len(chunk)
        if not chunk:
            if rest and (limit is None or read < limit):
                yield line, rest
            return
        data = rest + chunk
        end = _record_end(data, quote)
        if end == 0:
            rest = data
            continue
        yield line, data[:end]
        line += data.count(b"\n", 0, end)
        rest = data[end:]


def _record_end(data: bytes, quote: bytes | None) -> int:
    """Where the last whole record of ``data`` ends (after its line break), or 0."""
    pos = data.rfind(b"\n")
    if pos < 0 or quote is None:
        return pos + 1
    odd = data.count(quote, 0, pos) % 2
    while odd:
        previous = data.rfind(b"\n", 0, pos)
        if previous < 0:
            return 0
        odd ^= data.count(quote, previous, pos) % 2
        pos = previous
    return pos + 1


def _records(
    block: bytes, first_line: int, quote: bytes | None, blank: Callable[[bytes], bool]
) -> list[tuple[int, bytes]]:
    """The records of a block with the line each starts on; blank lines are no records."""
    records: list[tuple[int, bytes]] = []
    lines = block.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    start, parts = -1, []
    for n, text in enumerate(lines):
        if start >= 0:  # inside a quoted value
            parts.append(text)
            if text.count(quote) % 2:  # type: ignore[arg-type]
                records.append((start, b"\n".join(parts)))
                start = -1
        elif blank(text):
            continue
        elif quote is not None and text.count(quote) % 2:
            start, parts = first_line + n, [text]
        else:
            records.append((first_line + n, text))
    if start >= 0:
        records.append((start, b"\n".join(parts)))
    return records


def _csv_blank(line: bytes) -> bool:
    return line in (b"", b"\r")  # as pyarrow.csv: only lines without a character are skipped


def _json_blank(line: bytes) -> bool:
    return not line.strip()


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _settle(
    items: list[Any], attempt: Callable[[list[Any]], Any]
) -> list[tuple[list[Any], Any, str | None]]:
    """``items`` in runs that ``attempt`` accepts (with its result) and single items it
    refuses (with the reason), in order: the run is halved until it is accepted or one item."""
    settled: list[tuple[list[Any], Any, str | None]] = []

    def visit(lo: int, hi: int) -> None:
        group = items[lo:hi]
        try:
            settled.append((group, attempt(group), None))
            return
        except _Refused as refused:
            if hi - lo == 1:
                settled.append((group, None, refused.reason))
                return
        middle = (lo + hi) // 2
        visit(lo, middle)
        visit(middle, hi)

    if items:
        visit(0, len(items))
    return settled


def _settle_rows(
    records: list[Any],
    attempt: Callable[[list[Any]], pa.Table],
    empty: Callable[[], pa.Table],
    refused: Iterable[tuple[int, bytes, str]] = (),
) -> _Rows:
    """The rows of ``records`` (tuples of a line number, its text, then what ``attempt``
    parses) when a block did not parse whole: :func:`_settle` finds the runs ``attempt`` turns
    into a table and the records it refuses, which follow those ``refused`` before (line,
    text, reason). The tables are joined in order, each row knowing its line and text;
    ``empty()`` is the table when no record parsed."""
    bad = list(refused)
    tables: list[pa.Table] = []
    lines: list[int] = []
    texts: list[bytes] = []
    for group, table, reason in _settle(records, attempt):
        if reason is None:
            tables.append(table)
            lines += [record[0] for record in group]
            texts += [record[1] for record in group]
        else:
            bad.append((group[0][0], group[0][1], reason))
    table = pa.concat_tables(tables) if tables else empty()
    return _Rows(table, lines, texts, bad)


# ------------------------------------------------------------------------------- CSV


class _Csv:
    """Parses CSV records as text, one column per name, with the user's options."""

    trim = True
    utf8 = False  # (pyarrow.csv checks it)

    def __init__(self, options: CsvOptions, names: list[str]) -> None:
        self.names = names
        self.quote = options.quote.encode() if options.quote else None
        self.options = options
        self.read_options = pa_csv.ReadOptions(column_names=names, use_threads=False)
        self.convert = pa_csv.ConvertOptions(
            column_types={n: pa.string() for n in names},
            null_values=list(options.null_values),
            strings_can_be_null=True,
            quoted_strings_can_be_null=True,
        )

    def strings(self, data: bytes) -> tuple[pa.Table, list[Any]]:
        """The records of ``data`` as text, and the malformed ones (pyarrow's ``InvalidRow``)."""
        invalid: list[Any] = []

        def handler(row: Any) -> str:
            invalid.append(row)
            return "skip"

        if not data.strip(b"\r\n"):
            return pa.table({n: pa.array([], pa.string()) for n in self.names}), invalid
        table = pa_csv.read_csv(
            io.BytesIO(data),
            read_options=self.read_options,
            parse_options=_csv_parse_options(self.options, handler),
            convert_options=self.convert,
        )
        return table, invalid

    def rows(self, block: bytes, first_line: int, lines: bool) -> _Rows:
        """The rows of a block as text, at once (with the line of each row if ``lines`` or
        when some are malformed: pyarrow numbers those by record, which places them); when
        pyarrow and the records of :func:`_records` do not agree, record by record."""
        records: list[tuple[int, bytes]] | None = None
        try:
            table, invalid = self.strings(block)
        except (pa.ArrowException, UnicodeDecodeError):
            table, invalid = None, []
        if table is not None:
            if not invalid and not lines:
                return _Rows(table)
            records = _records(block, first_line, self.quote, _csv_blank)
            placed = self._place(table, invalid, records)
            if placed is not None:
                return placed
        return self._by_record(records or _records(block, first_line, self.quote, _csv_blank))

    def locate(self, table: pa.Table, block: bytes, first_line: int) -> _Rows:
        """The lines of the rows of ``table``, a clean parse of ``block`` (or, if its records
        do not agree with it, the block record by record)."""
        records = _records(block, first_line, self.quote, _csv_blank)
        return self._place(table, [], records) or self._by_record(records)

    def _place(
        self, table: pa.Table, invalid: list[Any], records: list[tuple[int, bytes]]
    ) -> _Rows | None:
        """The rows of ``table`` and the ``invalid`` ones among ``records``, or ``None`` if
        they do not add up (a record pyarrow reads otherwise)."""
        if len(records) != table.num_rows + len(invalid):
            return None
        malformed: dict[int, str] = {}
        for row in invalid:
            index = (row.number or 0) - 1
            if not 0 <= index < len(records) or index in malformed:
                return None
            if row.text.encode() != records[index][1].removesuffix(b"\r"):
                return None
            malformed[index] = _fields(row)
        good = [r for i, r in enumerate(records) if i not in malformed]
        bad = [(records[i][0], records[i][1], why) for i, why in sorted(malformed.items())]
        return _Rows(table, [r[0] for r in good], [r[1] for r in good], bad)

    def _by_record(self, records: list[tuple[int, bytes]]) -> _Rows:
        def attempt(group: list[tuple[int, bytes]]) -> pa.Table:
            try:
                table, invalid = self.strings(b"\n".join(r[1] for r in group) + b"\n")
            except (pa.ArrowException, UnicodeDecodeError) as exc:
                raise _Refused(f"not valid CSV: {_arrow_message(exc)}") from None
            if invalid:
                raise _Refused(_fields(invalid[0]))
            if table.num_rows != len(group):
                raise _Refused(f"{table.num_rows} CSV records in one line")
            return table

        return _settle_rows(records, attempt, lambda: self.strings(b"")[0])


def _fields(row: Any) -> str:
    """Why pyarrow found a CSV record malformed."""
    return f"{row.actual_columns} field(s) where the columns are {row.expected_columns}"


def _csv_parse_options(options: CsvOptions, handler: Any = None) -> Any:
    return pa_csv.ParseOptions(
        delimiter=options.delimiter,
        quote_char=options.quote or False,
        newlines_in_values=options.quote is not None,
        invalid_row_handler=handler,
    )


def _arrow_message(exc: BaseException) -> str:
    return str(exc).strip().replace("\n", " ")


class _CsvFile:
    """A CSV file's columns (from its header, the user's names, or its first record's
    width) and its blocks after the header."""

    def __init__(
        self, stream: Any, path: str, options: CsvOptions, size: int, limit: int | None = None
    ) -> None:
        quote = options.quote.encode() if options.quote else None
        self.blocks = _blocks(stream, size, quote, limit)
        self.first: tuple[int, bytes] | None = None  # what is left of the block of the header
        record, record_line = None, 0
        for line, block in self.blocks:
            record, record_line, rest_line, rest = _first_record(block, line, quote)
            if record is not None:
                self.first = (rest_line, rest) if options.header else (line, block)
                break
        self.names: list[str] = []
        if options.column_names is not None:
            self.names = list(options.column_names)
        elif record is not None:
            parse = _csv_parse_options(options)
            try:
                head = pa_csv.read_csv(
                    io.BytesIO(record + b"\n"),
                    read_options=pa_csv.ReadOptions(
                        use_threads=False, autogenerate_column_names=not options.header
                    ),
                    parse_options=parse,
                )
            except (pa.ArrowException, UnicodeDecodeError) as exc:
                what = "header" if options.header else "first record"
                raise SourceError(
                    f"{path}:{record_line}: cannot read its {what}: {_arrow_message(exc)}"
                ) from exc
            self.names = list(head.column_names)
            twice = _first_duplicate(self.names)
            if twice is not None:
                raise SourceError(f"{path}:{record_line}: the header names {twice!r} twice")

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        if self.first is not None and self.first[1]:
            yield self.first
        yield from self.blocks


def _first_record(
    block: bytes, first_line: int, quote: bytes | None
) -> tuple[bytes | None, int, int, bytes]:
    """The first record of a block (blank lines before it skipped) and its line, and the rest
    of the block and its first line."""
    pos, line = 0, first_line
    while pos < len(block):
        end = block.find(b"\n", pos)
        end = len(block) if end < 0 else end
        if _csv_blank(block[pos:end]):
            pos, line = end + 1, line + 1
            continue
        start = pos
        odd = quote is not None and block.count(quote, pos, end) % 2
        while odd and end < len(block):
            following = block.find(b"\n", end + 1)
            following = len(block) if following < 0 else following
            odd ^= block.count(quote, end + 1, following) % 2  # type: ignore[arg-type]
            end = following
        record = block[start:end]
        after = line + record.count(b"\n") + 1
        return record.removesuffix(b"\r"), line, after, block[end + 1 :]
    return None, line, line, b""


def _text_blocks(
    blocks: Iterator[tuple[int, bytes]], parser: _Csv | _Json, schema: pa.Schema, path: str
) -> Iterator[_Block]:
    """The parsed blocks of a CSV or JSON-lines file: a block whose rows all fit the schema
    at once stays vectorized; only a block with a rejected row is looked at row by row."""
    for line, block in blocks:
        rows = parser.rows(block, line, lines=False)
        batch, failed = _conform(rows.table, schema, path, parser.trim, parser.utf8)
        if not failed and not rows.bad:
            yield _Block(batch, [])
            continue
        if rows.lines is None:  # where the rows come from, from the same parse if it can
            located = parser.locate(rows.table, block, line)
            if located.table is not rows.table:
                batch, failed = _conform(located.table, schema, path, parser.trim, parser.utf8)
            rows = located
        yield _assemble(rows, batch, failed, path)


def _csv_blocks(stream: Any, path: str, source: FileSource) -> Iterator[_Block]:
    assert source.schema is not None
    try:
        file = _CsvFile(stream, path, source.csv, source.block_size)
        yield from _text_blocks(iter(file), _Csv(source.csv, file.names), source.schema, path)
    finally:
        stream.close()


# ------------------------------------------------------------------------ JSON lines


class _Json:
    """Parses JSON lines into the job's schema (pyarrow.json; line by line for a block that
    fails)."""

    trim = False
    utf8 = True

    def __init__(self, schema: pa.Schema | None) -> None:
        self.schema = schema
        options: dict[str, Any] = {"unexpected_field_behavior": "infer"}
        self.text: set[str] = set()
        if schema is not None and len(schema):
            # dates are read as text and cast (pyarrow.json does not convert them)
            read = pa.schema(
                [pa.field(f.name, pa.string()) if pa.types.is_date(f.type) else f for f in schema]
            )
            options = {"explicit_schema": read, "unexpected_field_behavior": "ignore"}
            self.text = {
                f.name
                for f in schema
                if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            }
        self.options = options
        self.parse = pa_json.ParseOptions(**options)

    def table(self, data: bytes, parse: Any = None) -> pa.Table:
        size = min(max(len(data) + 1, 1 << 16), 2**31 - 1)
        return pa_json.read_json(
            io.BytesIO(data),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=size),
            parse_options=parse or self.parse,
        )

    def rows(self, block: bytes, first_line: int, lines: bool) -> _Rows:
        """The rows of a block: at once (with their lines if ``lines``), or, if it does not
        parse, line by line."""
        if not block.strip():
            return _Rows(self._empty())
        try:
            table = self.table(block)
        except (pa.ArrowException, UnicodeDecodeError):
            return self._by_record(_records(block, first_line, None, _json_blank))
        return self.locate(table, block, first_line) if lines else _Rows(table)

    def locate(self, table: pa.Table, block: bytes, first_line: int) -> _Rows:
        """The lines of the rows of ``table``, a parse of ``block`` (or, if its lines do not
        agree with it, the block line by line)."""
        records = _records(block, first_line, None, _json_blank)
        if len(records) == table.num_rows:
            return _Rows(table, [r[0] for r in records], [r[1] for r in records])
        return self._by_record(records)

    def _empty(self) -> pa.Table:
        schema = self.options.get("explicit_schema", pa.schema([]))
        return schema.empty_table()

    def normalize(self, raw: bytes) -> tuple[bytes | None, str]:
        """The line as pyarrow reads it (values of text columns that are not text as their
        JSON text), or why it is no JSON object."""
        try:
            value = json.loads(raw.decode())
        except UnicodeDecodeError:
            return None, "not UTF-8 text"
        except ValueError as exc:  # (json.JSONDecodeError)
            column = f" (column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            return None, f"malformed JSON: {message}{column}"
        except RecursionError:
            return None, "malformed JSON: nested too deeply"
        if not isinstance(value, dict):
            return None, f"not a JSON object but {_KINDS[_kind(value)][1]}"
        changed = False
        for name in self.text:
            found = value.get(name)
            if found is not None and not isinstance(found, str):
                value[name] = json.dumps(found)
                changed = True
        return (json.dumps(value).encode() if changed else raw), ""

    def why(self, line: bytes, exc: BaseException) -> str:
        """Why one (normalized) line does not fit the schema: its first column that does not."""
        value = json.loads(line)
        read = self.options.get("explicit_schema")
        for target in read if read is not None else ():
            found = value.get(target.name)
            if found is None:
                continue
            alone = pa_json.ParseOptions(
                explicit_schema=pa.schema([target]), unexpected_field_behavior="ignore"
            )
            try:
                self.table(json.dumps({target.name: found}).encode(), alone)
            except (pa.ArrowException, UnicodeDecodeError):
                assert self.schema is not None
                wanted = self.schema.field(target.name).type
                return f"column {target.name!r}: {_show(found)} is not {_a(wanted)}"
        return f"cannot read it: {_arrow_message(exc)}"

    def _by_record(self, records: list[tuple[int, bytes]]) -> _Rows:
        items: list[tuple[int, bytes, bytes]] = []
        bad: list[tuple[int, bytes, str]] = []
        for line, raw in records:
            normal, why = self.normalize(raw)
            if normal is None:
                bad.append((line, raw, why))
            else:
                items.append((line, raw, normal))

        def attempt(group: list[tuple[int, bytes, bytes]]) -> pa.Table:
            try:
                table = self.table(b"\n".join(i[2] for i in group) + b"\n")
            except (pa.ArrowException, UnicodeDecodeError) as exc:
                raise _Refused(self.why(group[0][2], exc) if len(group) == 1 else "") from None
            if table.num_rows != len(group):
                raise _Refused(f"{table.num_rows} JSON values in one line")
            return table

        return _settle_rows(items, attempt, self._empty, bad)


_KINDS = {
    "number": ("numbers", "a number"),
    "text": ("text", "text"),
    "boolean": ("booleans", "a boolean"),
    "object": ("objects", "an object"),
    "array": ("arrays", "an array"),
    "null": ("nulls", "null"),
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    return "object" if isinstance(value, dict) else "array"


def _jsonl_blocks(stream: Any, path: str, source: FileSource) -> Iterator[_Block]:
    assert source.schema is not None
    try:
        blocks = _blocks(stream, source.block_size, None)
        yield from _text_blocks(blocks, _Json(source.schema), source.schema, path)
    finally:
        stream.close()


# --------------------------------------------------------------------------- Parquet


def _parquet_blocks(stream: Any, path: str, schema: pa.Schema) -> Iterator[_Block]:
    try:
        try:
            parquet = pq.ParquetFile(stream)
        except (pa.ArrowException, OSError) as exc:
            raise SourceError(f"{path} is not a valid parquet file: {exc}") from exc
        present = parquet.schema_arrow
        _check_castable(present, schema, path)
        columns = [n for n in schema.names if n in present.names] or present.names[:1]
        row = 0
        for batch in parquet.iter_batches(columns=columns):
            table = pa.Table.from_batches([batch])
            good, failed = _conform(table, schema, path)
            rejects = [
                _Reject(
                    i - n,
                    f"{path}, row {row + i + 1}",
                    table.slice(i, 1).to_pylist()[0],
                    failed[i],
                )
                for n, i in enumerate(sorted(failed))
            ]
            row += batch.num_rows
            yield _Block(good, rejects)
    finally:
        stream.close()


def _check_castable(present: pa.Schema, schema: pa.Schema, path: str) -> None:
    """A column of the file whose type cannot become the job's is an error naming the file."""
    for target in schema:
        index = present.get_field_index(target.name)
        if index < 0:
            continue
        have = present.field(index).type
        if have == target.type:
            continue
        try:
            pa.array([], have).cast(target.type)
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            raise SourceError(
                f"{path}: column {target.name!r} is {have} in this file, which cannot be read "
                f"as {target.type} (the job's schema): {exc}"
            ) from exc


# ------------------------------------------------------------------------- inference


def _infer(source: FileSource, files: list[str]) -> tuple[pa.Schema, list[str]]:
    fs, _ = source._fs()
    budget = max(SAMPLE_LEAST, min(SAMPLE_BYTES, SAMPLE_TOTAL // max(len(files), 1)))
    if source.format == "parquet":
        return _infer_parquet(fs, files), []
    if source.format == "csv":
        return _infer_csv(source.csv, fs, files, budget)
    return _infer_jsonl(fs, files, budget)


def _sample(fs: Any, path: str) -> Any:
    try:
        return fs.open(path, "rb")
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _unify(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """One type for values of types ``a`` and ``b`` (int64 and double: double; null and any:
    the other; structs field by field), or ``None``: a real conflict."""
    if a == b:
        return a
    try:
        merged = pa.unify_schemas(
            [pa.schema([("c", a)]), pa.schema([("c", b)])], promote_options="permissive"
        )
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return merged.field(0).type


def _parquet_schema(fs: Any, path: str) -> pa.Schema:
    """A Parquet file's schema, from its footer."""
    stream = _sample(fs, path)
    try:
        return pq.read_schema(stream)
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{path} is not a valid parquet file: {exc}") from exc
    finally:
        stream.close()


def _infer_parquet(fs: Any, files: list[str]) -> pa.Schema:
    merged: dict[str, tuple[pa.DataType, str]] = {}
    for path in files:
        for column in _parquet_schema(fs, path):
            if column.name not in merged:
                merged[column.name] = (column.type, path)
                continue
            kind, first = merged[column.name]
            unified = _unify(kind, column.type)
            if unified is None:
                raise SourceError(
                    f"column {column.name!r} is {kind} in {first} but {column.type} in {path}: "
                    "give schema= to read every file with one type (a file whose column cannot "
                    "be cast to it is an error; rows whose values do not fit are rejected)"
                )
            merged[column.name] = (unified, first)
    return pa.schema([(name, kind) for name, (kind, _) in merged.items()])


_LADDER = (
    pa.int64(),
    pa.float64(),
    pa.bool_(),
    pa.date32(),
    pa.timestamp("us"),
    pa.timestamp("us", tz="UTC"),
)
_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"


def _text_type(values: pa.ChunkedArray) -> pa.DataType:
    """The first of int64, double, bool, date32, timestamp[us] (without, then with a time
    zone) that every value casts to; else string (also when there are none)."""
    present = pc.utf8_trim_whitespace(values.drop_null())
    if len(present) == 0:
        return pa.string()
    for kind in _LADDER:
        try:
            present.cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        return kind
    return pa.string()


@dataclass
class _Sampled:
    """The values of one column in the samples, file by file, with their lines."""

    parts: list[tuple[str, Any, list[int]]] = field(default_factory=list)


def _infer_csv(
    options: CsvOptions, fs: Any, files: list[str], budget: int
) -> tuple[pa.Schema, list[str]]:
    columns: dict[str, _Sampled] = {}
    for path in files:
        stream = _sample(fs, path)
        try:
            file = _CsvFile(stream, path, options, budget, limit=budget)
            csv = _Csv(options, file.names)
            for line, block in file:
                rows = csv.rows(block, line, lines=True)
                assert rows.lines is not None
                table = rows.table.slice(0, SAMPLE_ROWS)
                for name in file.names:
                    sampled = columns.setdefault(name, _Sampled())
                    sampled.parts.append((path, table.column(name), rows.lines))
            for name in file.names:
                columns.setdefault(name, _Sampled())
        finally:
            stream.close()
    fields, mixed = [], {}
    for name, sampled in columns.items():
        chunks = [c for _, values, _ in sampled.parts for c in values.chunks]
        kind = _text_type(pa.chunked_array(chunks, pa.string()))
        fields.append(pa.field(name, kind))
        if kind == pa.string():
            found = _numbers_and_text(sampled)
            if found is not None:
                mixed[name] = found
    schema = pa.schema(fields)
    return schema, [_mixed_note(schema, name, *found) for name, found in mixed.items()]


def _numbers_and_text(sampled: _Sampled) -> tuple[str, Any, str, int] | None:
    """For a text column holding numbers too: the numbers' type, and its first value that
    is not a number with its file and line."""
    numbers: list[Any] = []
    example: tuple[Any, str, int] | None = None
    for path, values, lines in sampled.parts:
        trimmed = pc.utf8_trim_whitespace(values.combine_chunks())
        number = pc.match_substring_regex(trimmed, _NUMBER)
        numbers.append(trimmed.filter(number))
        if example is None:
            text = pc.and_(pc.invert(number), pc.is_valid(trimmed))
            found = pc.index(text, True).as_py()
            if found >= 0:
                example = (values[found].as_py(), path, lines[found])
    if example is None or not sum(len(n) for n in numbers):
        return None
    every = pa.chunked_array(numbers, pa.string())
    try:
        every.cast(pa.int64())
        kind = "int64"
    except pa.ArrowInvalid:
        kind = "double"
    return (kind, *example)


def _mixed_note(schema: pa.Schema, name: str, kind: str, value: Any, path: str, line: int) -> str:
    return (
        f"column {name!r} mixes numbers and text ({_show(value)} at {path}:{line}): it is read "
        "as text (so sum, min and max would work on strings). To read it as numbers, give "
        f"{_suggest(schema, {name: kind})}: the rows whose value is not a number are then "
        "rejected (sent to the dead letters with on_error='dead_letter')"
    )


def _suggest(schema: pa.Schema, changed: dict[str, str]) -> str:
    """``schema={...}`` with the columns of ``changed`` of its types."""
    if len(schema) > 8:
        changes = ", ".join(f"{n!r}: {k!r}" for n, k in changed.items())
        return f"schema= with {{{changes}}} and the other columns' types"
    types = ", ".join(f"{f.name!r}: {changed.get(f.name, str(f.type))!r}" for f in schema)
    return f"schema={{{types}}}"


def _infer_jsonl(fs: Any, files: list[str], budget: int) -> tuple[pa.Schema, list[str]]:
    merged: dict[str, pa.DataType | None] = {}  # None: a conflict
    samples: list[tuple[str, list[tuple[int, bytes]]]] = []
    for path in files:
        stream = _sample(fs, path)
        try:
            records: list[tuple[int, bytes]] = []
            for line, block in _blocks(stream, budget, None, limit=budget):
                records += _records(block, line, None, _json_blank)
            records = records[:SAMPLE_ROWS]
        finally:
            stream.close()
        samples.append((path, records))
        for schema in _json_schemas(records):
            for column in schema:
                if column.name not in merged:
                    merged[column.name] = column.type
                else:
                    before = merged[column.name]
                    merged[column.name] = None if before is None else _unify(before, column.type)
    fields = [pa.field(name, _settled(kind or pa.string())) for name, kind in merged.items()]
    schema = pa.schema(fields)
    conflicts = [name for name, kind in merged.items() if kind is None]
    return schema, _kinds_notes(schema, conflicts, samples) if conflicts else []


def _json_schemas(records: list[tuple[int, bytes]]) -> list[pa.Schema]:
    """The schemas pyarrow infers for the records (for runs of them, if not all agree);
    records that are no JSON object are left out."""
    if not records:
        return []
    parser = _Json(None)
    try:
        return [parser.table(b"\n".join(r[1] for r in records) + b"\n").schema]
    except (pa.ArrowException, UnicodeDecodeError):
        pass
    normal = [n for n, _ in (parser.normalize(r[1]) for r in records) if n is not None]

    def attempt(group: list[bytes]) -> pa.Schema:
        try:
            return parser.table(b"\n".join(group) + b"\n").schema
        except (pa.ArrowException, UnicodeDecodeError):
            raise _Refused("") from None

    return [schema for _, schema, reason in _settle(normal, attempt) if reason is None]


def _settled(kind: pa.DataType) -> pa.DataType:
    """An inferred type made safe for values beyond the sample: null (nothing seen) is text,
    timestamps are microseconds (pyarrow infers seconds from values without fractions)."""
    if pa.types.is_null(kind):
        return pa.string()
    if pa.types.is_timestamp(kind):
        return pa.timestamp("us", tz=kind.tz)
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _settled(f.type)) for f in kind])
    if pa.types.is_list(kind):
        return pa.list_(_settled(kind.value_type))
    if pa.types.is_large_list(kind):
        return pa.large_list(_settled(kind.value_type))
    return kind


def _kinds_notes(
    schema: pa.Schema, conflicts: list[str], samples: list[tuple[str, list[tuple[int, bytes]]]]
) -> list[str]:
    """For each column read as text because its values do not fit one type: a note when they
    are of different kinds (numbers and text, ...), with an example."""
    seen: dict[str, dict[str, tuple[Any, str, int]]] = {name: {} for name in conflicts}
    numbers: dict[str, bool] = dict.fromkeys(conflicts, True)  # all whole numbers
    for path, records in samples:
        for line, raw in records:
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            if not isinstance(value, dict):
                continue
            for name in conflicts:
                found = value.get(name)
                kind = _kind(found)
                if kind == "null":
                    continue
                seen[name].setdefault(kind, (found, path, line))
                if kind == "number" and not isinstance(found, int):
                    numbers[name] = False
    notes = []
    for name in conflicts:
        kinds = seen[name]
        if len(kinds) < 2:
            continue  # text of several looks (timestamps and other text): text it is
        if "number" in kinds and "text" in kinds:
            value, path, line = kinds["text"]
            kind = "int64" if numbers[name] else "double"
            notes.append(_mixed_note(schema, name, kind, value, path, line))
            continue
        second = list(kinds)[1]
        value, path, line = kinds[second]
        described = " and ".join(_KINDS[k][0] for k in kinds)
        notes.append(
            f"column {name!r} mixes {described} ({_show(value)} at {path}:{line}): it is read "
            "as text (values that are not text as their JSON text); give schema= to read it "
            "as one type, the rows that do not fit being rejected"
        )
    return notes
