"""The Arrow part of a join side's rows (:class:`ChunkedRows`, what
:class:`~cutline.runtime.joins.rows.SideRows` stands on): the batches as they came, kept as
chunks, held in memory or spilled to files (:class:`Spill`).

**Chunks.** Each chunk is one Arrow record batch, never changed in place: a snapshot taken
holds the chunks it was given while the kernel goes on. A batch is kept as it came, a chunk
of its own, until more than :data:`TIDY` chunks are held in memory at the end; then the last
ones are merged, size-tiered (:data:`TIER`), so that a side holds few chunks and a row is
copied a logarithmic number of times. Rows dropped by time, as joins drop them, then go a
chunk at a time, without a copy. Rows are taken chunk by chunk (:meth:`ChunkedRows.take`):
Arrow's own ``take`` of a table of many chunks would first concatenate them all.

**Larger than memory** (the disk backend: a :class:`Spill`). Beyond the kernel's share of
``StateConfig.memory`` (half of it, as a window operator's runs: :meth:`Spill.of`), every
chunk held in memory, of both sides, is written into one Arrow file per side in the
subtask's folder and mapped back (:class:`~cutline.runtime.state.spill.SpillFiles`): the
operating system pages the rows in and out as a kernel reads them (the key columns when
partners are looked for, the rows a result takes). A spilled chunk is not rewritten while
most of its rows are alive: its dropped rows stay in it, marked, until fewer than half of
them are alive (its alive ones are then copied back into memory, to be spilled again with
the next) or none is (its file is then given back, and removed once no chunk of it is held).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from cutline.runtime.state.config import Backend, StateConfig
from cutline.runtime.state.spill import SpillFiles

TIDY = 4
"""Chunks held in memory at the end beyond which the last ones are merged."""

TIER = 2
"""Of the last chunks, one is merged with those after it while it is at most this many times
as long as they are together (size-tiered: a long chunk is not copied again for each short
one)."""

SMALL = 1 << 16
"""More than :data:`TIDY` chunks held in memory side by side are made one when rows are taken
out of them while they keep at most this many rows together."""

WHOLE = 8
"""A result takes its rows from the kept ones whole (their chunks concatenated) while they are
held in memory and at most this many times as many as the result's."""


class JoinError(ValueError):
    """A join's kernel given what it cannot take: a batch whose columns differ from its
    side's, or lack a key column; times or key groups not one per row; rows that are late;
    snapshots of another join."""


class Holder(Protocol):
    """What a :class:`Spill` settles: rows held in memory, and how to spill them."""

    @property
    def held(self) -> int: ...

    def spill(self, files: SpillFiles) -> None: ...


@dataclass(frozen=True)
class Spill:
    """Where a kernel's rows go beyond its memory: ``files`` (the subtask's folder), once the
    chunks both sides hold in memory pass ``budget`` bytes."""

    files: SpillFiles
    budget: int

    @classmethod
    def of(cls, config: StateConfig, folder: str | None, name: str) -> Spill | None:
        """A join's on the disk backend (``None`` on the memory backend, or without a folder):
        beyond half of ``config.memory``, into files of ``folder`` named after ``name``."""
        if config.backend is not Backend.DISK or folder is None:
            return None
        return cls(SpillFiles(folder, name), config.memory // 2)

    def settle(self, *holders: Holder) -> None:
        """Beyond the budget, every chunk the ``holders`` hold in memory is spilled."""
        if sum(holder.held for holder in holders) > self.budget:
            for holder in holders:
                holder.spill(self.files)


@dataclass(frozen=True)
class _Chunk:
    """Consecutive rows: ``batch``; ``file``: spilled (``batch`` is mapped from it), and then
    ``alive``: how many of its rows are."""

    batch: pa.RecordBatch
    file: str | None = None
    alive: int = 0

    @property
    def held(self) -> int:
        """Bytes held in memory."""
        return 0 if self.file is not None else int(self.batch.nbytes)


class ChunkedRows:
    """The rows of one side as chunks (see the module); a row is known by its index, its
    place among them. What refers to rows by index (which are alive: :meth:`_compact_chunks`
    is told) is the subclass's."""

    schema: pa.Schema | None

    def __init__(self) -> None:
        self._chunks: list[_Chunk] = []
        self._starts = np.zeros(1, dtype=np.int64)
        """Where each chunk begins, and the end of the last."""
        self._table: pa.Table | None = None
        self._held: int | None = 0
        self.spilled = 0
        """Rows in spilled chunks."""
        self._dead_files = False
        """Whether a spilled chunk has no row alive (the next compaction lets it go)."""
        self._files: SpillFiles | None = None
        """Where the chunks were spilled, once they were."""

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def held(self) -> int:
        """Bytes of chunks held in memory (not spilled)."""
        if self._held is None:
            self._held = sum(c.held for c in self._chunks)
        return self._held

    @property
    def table(self) -> pa.Table:
        """Every row kept, alive or dropped, in index order (the chunks, not copied)."""
        if self._table is None:
            schema = self._known()
            self._table = pa.Table.from_batches([c.batch for c in self._chunks], schema=schema)
        return self._table

    def _known(self) -> pa.Schema:
        if self.schema is None:
            raise JoinError(
                f"join: the {self.name} side's columns are not known (no row of it came, "
                "and the kernel was not given its schema): pass schemas= to the kernel"
            )
        return self.schema

    def _add_chunk(self, batch: pa.RecordBatch) -> None:
        """Keep ``batch`` as the last chunk (merged with those before it when they are many)."""
        chunks = self._chunks
        chunks.append(_Chunk(batch))
        tail = 0
        while tail < len(chunks) and chunks[-1 - tail].file is None:
            tail += 1
        if tail > TIDY:
            taken, rows = 1, chunks[-1].batch.num_rows
            while taken < tail and chunks[-1 - taken].batch.num_rows <= TIER * rows:
                rows += chunks[-1 - taken].batch.num_rows
                taken += 1
            run = chunks[-taken:]
            chunks[-taken:] = [_Chunk(pa.concat_batches([c.batch for c in run]))]
            self._changed()
        else:
            self._starts = np.append(self._starts, self._starts[-1] + batch.num_rows)
            self._table = self._held = None

    def _changed(self) -> None:
        """The chunks changed: where each begins, found again."""
        sizes = [c.batch.num_rows for c in self._chunks]
        self._starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self._table = self._held = None

    # ------------------------------------------------------------------ reading

    def _pieces(
        self, rows: np.ndarray, columns: list[str] | None = None
    ) -> tuple[pa.Table, np.ndarray | None]:
        """The rows at ``rows`` (indices, of several chunks) taken chunk by chunk (of
        ``columns`` only, if given): the table of them, chunk after chunk, and where each of
        ``rows`` is in it (``None``: in order, ``rows`` were sorted)."""
        chunks, starts = self._chunks, self._starts
        parts = []
        if not (rows[1:] < rows[:-1]).any():
            bounds = np.searchsorted(rows, starts).tolist()
            for c, (begin, end) in enumerate(itertools.pairwise(bounds)):
                if end > begin:
                    parts.append(_taken(chunks[c].batch, rows[begin:end] - starts[c], columns))
            return pa.Table.from_batches(parts), None
        which = np.searchsorted(starts, rows, side="right") - 1
        back = np.empty(len(rows), dtype=np.int64)
        if len(chunks) > TIDY:  # (grouped by a sort of the chunks' numbers)
            small = which.astype(np.uint16) if len(chunks) < 2**16 else which
            order = np.argsort(small, kind="stable")
            bounds = np.searchsorted(which[order], np.arange(len(chunks) + 1)).tolist()
            groups = [(c, order[b:e]) for c, (b, e) in enumerate(itertools.pairwise(bounds))]
        else:
            groups = [(c, np.flatnonzero(which == c)) for c in range(len(chunks))]
        at = 0
        for c, chosen in groups:
            if len(chosen):
                parts.append(_taken(chunks[c].batch, rows[chosen] - starts[c], columns))
                back[chosen] = np.arange(at, at + len(chosen))
                at += len(chosen)
        return pa.Table.from_batches(parts), back

    def take(self, rows: np.ndarray, columns: Sequence[str] | None = None) -> pa.Table:
        """The rows at ``rows`` (indices), in that order (of ``columns`` only, if given)."""
        schema = self._known()
        rows = np.asarray(rows, dtype=np.int64)
        names = None if columns is None else list(columns)
        if not len(rows):
            return pa.schema([schema.field(n) for n in names or schema.names]).empty_table()
        chunk = self._one_chunk(rows)
        if chunk is not None:
            local = rows - self._starts[chunk]
            return pa.Table.from_batches([_taken(self._chunks[chunk].batch, local, names)])
        if self._whole(len(rows)):
            return (self.table if names is None else self.table.select(names)).take(rows)
        taken, back = self._pieces(rows, names)
        return taken if back is None else taken.combine_chunks().take(back)

    def gather(self, rows: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """What :meth:`~cutline.runtime.joins.output.JoinLayout.assemble` takes the rows of a
        result from: a table, and where each result row's row is in it (``rows``: indices,
        ``-1``: none, which stays ``-1``). Nothing is copied when the rows are of one chunk,
        or are held in memory and not many more than the result's (its ``take`` then
        concatenates their chunks); else they are taken chunk by chunk."""
        rows = np.asarray(rows, dtype=np.int64)
        schema = self._known()
        used = rows >= 0
        present = rows if used.all() else rows[used]
        if not len(present):  # (nulls only: of no row)
            return schema.empty_table(), rows
        if len(self._chunks) == 1:
            return self.table, rows
        chunk = self._one_chunk(present)
        if chunk is not None:
            local = np.where(used, rows - self._starts[chunk], -1)
            return pa.Table.from_batches([self._chunks[chunk].batch]), local
        if self._whole(len(rows)):
            return self.table, rows
        taken, back = self._pieces(present)
        if back is None:
            back = np.arange(len(present), dtype=np.int64)
        if present is rows:
            return taken, back
        positions = np.full(len(rows), -1, dtype=np.int64)
        positions[used] = back
        return taken, positions

    def _one_chunk(self, rows: np.ndarray) -> int | None:
        """The one chunk all ``rows`` (indices, at least one) are in, if they are."""
        ends = np.searchsorted(self._starts, [rows.min(), rows.max()], side="right") - 1
        return int(ends[0]) if ends[0] == ends[1] else None

    def _whole(self, taken: int) -> bool:
        """Whether ``taken`` rows are taken of the whole table (its chunks concatenated): all
        in memory, and not many more."""
        return not self.spilled and int(self._starts[-1]) <= WHOLE * taken

    # ------------------------------------------------------------------ dropping

    def _count_dropped(self, rows: np.ndarray) -> None:
        """``rows`` (indices, alive until now) are dropped: spilled chunks count them."""
        if not self.spilled:
            return
        counts = np.bincount(
            np.searchsorted(self._starts, rows, side="right") - 1, minlength=len(self._chunks)
        )
        for at, chunk in enumerate(self._chunks):
            if chunk.file is not None and counts[at]:
                alive = chunk.alive - int(counts[at])
                self._chunks[at] = _Chunk(chunk.batch, chunk.file, alive)
                self._dead_files |= alive == 0

    def _compact_chunks(self, alive: np.ndarray) -> np.ndarray:
        """Take the dropped rows out of the chunks (``alive``: per row kept): chunks in memory
        keep their alive rows (side by side ones that hold at most :data:`SMALL` of them
        together made one), a spilled one its dropped ones too unless they are more than half
        of it (or all). Returns which rows stay (their order kept)."""
        keep = alive.copy()
        chunks: list[_Chunk] = []
        run: list[_Chunk] = []  # (in memory, side by side)
        begin = 0
        for chunk, start in zip([*self._chunks, None], self._starts.tolist(), strict=True):
            if chunk is not None and chunk.file is None:
                if not run:
                    begin = start
                run.append(chunk)
                continue
            if run:
                chunks += _compacted(run, alive[begin:start])
                run = []
            if chunk is None:
                break
            n = chunk.batch.num_rows
            if 2 * chunk.alive >= n:
                keep[start : start + n] = True
                chunks.append(chunk)
                continue
            self._release(chunk)
            if chunk.alive:
                mask = alive[start : start + n]
                chunks.append(_Chunk(chunk.batch.take(np.flatnonzero(mask))))
        self._chunks = chunks
        self.spilled = sum(c.batch.num_rows for c in chunks if c.file is not None)
        self._dead_files = False
        self._changed()
        return keep

    # ------------------------------------------------------------------ spilling

    def spill(self, files: SpillFiles) -> None:
        """Write every chunk held in memory with a row alive into one file of ``files``, and
        keep it as mapped from there."""
        held = [i for i, c in enumerate(self._chunks) if c.file is None and c.batch.num_rows]
        counts = self._alive_counts(held)
        at = [i for i, count in zip(held, counts, strict=True) if count]
        if not at:
            return
        path, mapped = files.write([self._chunks[i].batch for i in at])
        for i, batch, count in zip(at, mapped, (c for c in counts if c), strict=True):
            self._chunks[i] = _Chunk(batch, path, count)
        self._files = files
        self._held = None
        self.spilled = sum(c.batch.num_rows for c in self._chunks if c.file is not None)
        self._table = None

    def _alive_counts(self, chunks: list[int]) -> list[int]:
        """How many rows of each of ``chunks`` (positions) are alive."""
        raise NotImplementedError

    def _release(self, chunk: _Chunk) -> None:
        assert chunk.file is not None and self._files is not None
        self._files.release(chunk.file)


def _compacted(run: list[_Chunk], alive: np.ndarray) -> list[_Chunk]:
    """Chunks in memory side by side (``run``) with only their ``alive`` rows, each apart
    (the rows of those all alive not copied); made one if they are more than :data:`TIDY`
    and keep at most :data:`SMALL` rows together."""
    if alive.all():
        return run
    pieces = []
    start = 0
    for chunk in run:
        n = chunk.batch.num_rows
        mask = alive[start : start + n]
        start += n
        if mask.all():
            pieces.append(chunk.batch)
        elif mask.any():
            pieces.append(chunk.batch.take(np.flatnonzero(mask)))
    if len(pieces) > TIDY and sum(p.num_rows for p in pieces) <= SMALL:
        return [_Chunk(pa.concat_batches(pieces))]
    return [_Chunk(p) for p in pieces]


def _taken(batch: pa.RecordBatch, rows: np.ndarray, columns: list[str] | None) -> pa.RecordBatch:
    """The rows at ``rows`` of ``batch`` (of ``columns`` only, if given)."""
    return (batch if columns is None else batch.select(columns)).take(rows)
