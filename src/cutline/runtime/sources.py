"""Replayable sources: a generated sequence, and a directory of Parquet, CSV or JSON-lines files.

Every source is split between the subtasks of the source operator, and every
reader can say where it is (:meth:`SourceReader.offset`) and start again from
there (``open(..., offset=...)``): the offset goes into each checkpoint, and a
restore replays exactly the records after it. Records come out as
``pyarrow.RecordBatch`` es.

* :class:`SequenceSource` — integers ``start, start+1, ...`` (bounded by ``end`` or not),
  dealt round-robin to the subtasks; offset: how many this subtask emitted.
* :class:`FileSource` — the files of a directory (a local path or any fsspec URL), sorted by
  name and dealt round-robin to the subtasks; offset: per file, the rows already emitted.
  Each file is read whole into memory when its turn comes (a limit for very large files).
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import fsspec
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

FORMATS = ("parquet", "csv", "jsonl")
_SUFFIXES = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "jsonl": (".jsonl", ".json")}


class SourceError(Exception):
    """A source cannot be read: a missing directory, a malformed file (named), a bad offset."""


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


@dataclass(frozen=True)
class SequenceSource:
    """The integers from ``start`` up to ``end`` (excluded; ``None``: without end), in a column
    named ``column``."""

    start: int = 0
    end: int | None = None
    column: str = "value"

    def open(
        self, subtask: int, parallelism: int, offset: Mapping[str, Any] | None = None
    ) -> SequenceReader:
        _check_subtask(subtask, parallelism)
        emitted = int(offset["emitted"]) if offset else 0
        if emitted < 0:
            raise SourceError(f"a sequence offset cannot be negative: {emitted}")
        return SequenceReader(self, subtask, parallelism, emitted)


class SequenceReader:
    def __init__(self, source: SequenceSource, subtask: int, parallelism: int, emitted: int):
        self._source = source
        self._first = source.start + subtask
        self._stride = parallelism
        self._emitted = emitted

    def read(self, max_rows: int) -> pa.RecordBatch | None:
        first = self._first + self._emitted * self._stride
        end = self._source.end
        count = (
            max_rows if end is None else max(0, min(max_rows, -(-(end - first) // self._stride)))
        )
        if count == 0:
            return None
        self._emitted += count
        values = pa.array(range(first, first + count * self._stride, self._stride), pa.int64())
        return pa.record_batch([values], names=[self._source.column])

    def offset(self) -> dict[str, Any]:
        return {"emitted": self._emitted}


@dataclass(frozen=True)
class FileSource:
    """The files of ``directory`` in ``format`` (``parquet``, ``csv`` or ``jsonl``)."""

    directory: str
    format: str = "parquet"
    storage_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(
                f"unknown file format {self.format!r}: use one of {', '.join(FORMATS)}"
            )

    def files(self) -> list[str]:
        """The input files, sorted by name (hidden files and others' suffixes left out)."""
        try:
            fs, root = fsspec.core.url_to_fs(self.directory, **dict(self.storage_options or {}))
            if not fs.isdir(root):
                raise SourceError(f"input directory {self.directory} does not exist")
            names = fs.ls(root, detail=False)
        except (OSError, ValueError) as exc:
            raise SourceError(f"cannot list input directory {self.directory}: {exc}") from exc
        suffixes = _SUFFIXES[self.format]
        return sorted(
            str(n)
            for n in names
            if str(n).lower().endswith(suffixes)
            and not str(n).rsplit("/", 1)[-1].startswith((".", "_"))
        )

    def open(
        self, subtask: int, parallelism: int, offset: Mapping[str, Any] | None = None
    ) -> FileReader:
        _check_subtask(subtask, parallelism)
        fs, _ = fsspec.core.url_to_fs(self.directory, **dict(self.storage_options or {}))
        mine = [f for i, f in enumerate(self.files()) if i % parallelism == subtask]
        done = {str(k): int(v) for k, v in dict(offset or {}).get("rows", {}).items()}
        return FileReader(fs, self.format, mine, done)


class FileReader:
    def __init__(self, fs: Any, fmt: str, files: list[str], done: dict[str, int]) -> None:
        self._fs = fs
        self._format = fmt
        self._files = files
        self._rows = {f: done.get(f, 0) for f in files}
        self._index = 0
        self._batches: Iterator[pa.RecordBatch] | None = None
        self._skip = 0

    def offset(self) -> dict[str, Any]:
        return {"rows": {f: n for f, n in self._rows.items() if n}}

    def read(self, max_rows: int) -> pa.RecordBatch | None:
        while self._index < len(self._files):
            path = self._files[self._index]
            if self._batches is None:
                self._batches = self._open(path)
                self._skip = self._rows[path]
            try:
                batch = next(self._batches, None)
            except (pa.ArrowInvalid, OSError) as exc:
                raise SourceError(f"cannot read {path}: {exc}") from exc
            if batch is None:
                if self._skip:
                    raise SourceError(
                        f"the offset says {self._rows[path]} rows of {path} were read, but it "
                        "has fewer: the file changed since the checkpoint"
                    )
                self._index += 1
                self._batches = None
                continue
            if self._skip:
                dropped = min(self._skip, batch.num_rows)
                self._skip -= dropped
                batch = batch.slice(dropped)
                if batch.num_rows == 0:
                    continue
            if batch.num_rows > max_rows:
                head, tail = batch.slice(0, max_rows), batch.slice(max_rows)
                self._batches = _prepend(tail, self._batches)
                batch = head
            self._rows[path] += batch.num_rows
            return batch
        return None

    def _open(self, path: str) -> Iterator[pa.RecordBatch]:
        try:
            with self._fs.open(path, "rb") as source:
                data = source.read()
        except OSError as exc:
            raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from exc
        try:
            if self._format == "parquet":
                return iter(pq.ParquetFile(io.BytesIO(data)).iter_batches())
            if self._format == "csv":
                return iter(pa_csv.open_csv(io.BytesIO(data)))
            table = pa_json.read_json(io.BytesIO(data))
            return iter(table.to_batches())
        except (pa.ArrowInvalid, OSError) as exc:
            raise SourceError(f"{path} is not a valid {self._format} file: {exc}") from exc


def _prepend(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest
