"""Replayable sources: a generated sequence, and a directory of Parquet, CSV or JSON-lines files.

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
* :class:`FileSource` — the files of a directory (a local path or any fsspec URL), sorted by
  name, one split per file; offset: per file, the rows already emitted. Each file is read
  whole into memory when its turn comes (a limit for very large files).
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import fsspec
import numpy as np
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
        if offset:
            merge_offsets([offset])  # an offset that is not per split says why
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
