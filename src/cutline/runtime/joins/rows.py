"""The rows one side of a join keeps (:class:`SideRows`), the one store of every join kernel:
its batches as they came (Arrow, the side's columns untouched, as chunks:
:class:`~cutline.runtime.joins.chunks.ChunkedRows`, spilled beyond memory on the disk
backend), and beside them, row for row, NumPy arrays of each row's event time (``int64``
ms), key group (so that a restore at another parallelism keeps its own), whether it is still
alive, and, for a side whose unmatched rows an outer join emits, whether it has paired yet.

A row is known by its index, its place among the rows kept in the order they came. A kernel
drops rows by marking them (:meth:`SideRows.drop`); they are taken out in bulk
(:meth:`SideRows.compact`) once the dropped ones outnumber the alive ones by :data:`SLACK`,
so that a row is copied a bounded number of times however often the watermark moves (or,
for a kernel that searches every row kept, ``eager``, whenever there are any); the kernel
then renumbers what refers to rows by the rows that stay. The arrays change in place (a
snapshot copies them); the chunks never do (a snapshot shares them).

What must fit in memory, the rows spilled or not: the per-row arrays (17 or 18 bytes a row;
a window join's slices and floors 16 more), the chunks held below the spill budget, a
result, and what a snapshot or a restore holds at once (the operator writes and reads a
kernel's tables whole: :mod:`~cutline.runtime.joins.operator`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from cutline.runtime.joins.chunks import ChunkedRows, JoinError, Spill
from cutline.runtime.joins.output import Side

__all__ = ["JoinError", "SideRows", "Spill"]

SLACK = 4096
"""Dropped rows are taken out once there are more of them than alive rows and this."""

TIME = "time"
KEY_GROUP = "key_group"
ALIVE = "alive"
MATCHED = "matched"


class Growing:
    """An int64 (or bool) array that grows at its end in amortized constant time per item."""

    def __init__(self, dtype: type, data: np.ndarray | None = None) -> None:
        self._data: np.ndarray = np.empty(0, dtype=dtype) if data is None else data.astype(dtype)
        self.size = len(self._data)

    @property
    def view(self) -> np.ndarray:
        """The items (a view: valid until the next change)."""
        return self._data[: self.size]

    def extend(self, items: np.ndarray) -> None:
        end = self.size + len(items)
        if end > len(self._data):
            grown = np.empty(max(end, 2 * len(self._data), 64), dtype=self._data.dtype)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size : end] = items
        self.size = end

    def keep(self, mask: np.ndarray) -> None:
        """Keep the items where ``mask`` is true (in place, in order)."""
        kept = np.compress(mask, self._data[: self.size])  # (faster than a[mask])
        self._data[: len(kept)] = kept
        self.size = len(kept)


class SideRows(ChunkedRows):
    """The rows of one side of a join (see the module).

    :param side: which side (named in errors and in snapshots).
    :param on: the side's key columns (a schema without them is refused).
    :param schema: the side's columns, when known before its first batch (a join that emits a
        side's nulls before any row of it came needs them).
    :param matched: keep, per row, whether it has paired (a side an outer join emits the
        unmatched rows of).
    :param eager: :meth:`compact` takes dropped rows out whenever there are any: a kernel
        that searches every row kept (a hash join of the keys) would search them too.
    """

    def __init__(
        self,
        side: Side,
        on: tuple[str, ...] = (),
        schema: pa.Schema | None = None,
        *,
        matched: bool = False,
        eager: bool = False,
    ) -> None:
        super().__init__()
        self.side = side
        self.on = on
        self.eager = eager
        self.schema = None if schema is None else self._checked(schema)
        self._times = Growing(np.int64)
        self._groups = Growing(np.int64)
        self._alive = Growing(np.bool_)
        self._matched = Growing(np.bool_) if matched else None
        self.count = 0
        """The rows alive."""

    @property
    def name(self) -> str:
        """``"left"`` or ``"right"``."""
        return self.side.name.lower()

    @property
    def size(self) -> int:
        """The rows kept, alive or dropped (the next row's index)."""
        return self._times.size

    @property
    def times(self) -> np.ndarray:
        return self._times.view

    @property
    def groups(self) -> np.ndarray:
        return self._groups.view

    @property
    def alive(self) -> np.ndarray:
        return self._alive.view

    @property
    def matched(self) -> np.ndarray | None:
        """Per row, whether it has paired (a view the kernel sets); ``None``: not kept."""
        return None if self._matched is None else self._matched.view

    def keys(self) -> list[pa.ChunkedArray]:
        """The key columns of every row kept, alive or dropped."""
        table = self.table
        return [table.column(name) for name in self.on]

    # ------------------------------------------------------------------ batches

    def conform(self, batch: pa.RecordBatch, what: str = "batch") -> pa.RecordBatch:
        """``batch`` in the side's columns (the first batch's, or those given): a batch with
        the same names is cast to their types; other columns are refused."""
        if self.schema is None:
            self.schema = self._checked(batch.schema)
            return batch
        if batch.schema.equals(self.schema):
            return batch
        if batch.schema.names == self.schema.names:
            try:
                columns = [c.cast(f.type) for c, f in zip(batch.columns, self.schema, strict=True)]
                return pa.RecordBatch.from_arrays(columns, schema=self.schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        raise JoinError(
            f"join: a {self.name} {what}'s columns {_columns(batch.schema)} are not the "
            f"{self.name} side's {_columns(self.schema)}: every batch of a side has the same"
        )

    def _checked(self, schema: pa.Schema) -> pa.Schema:
        """``schema``, if it has the key columns."""
        missing = [name for name in self.on if name not in schema.names]
        if missing:
            raise JoinError(
                f"join: the {self.name} side has no key column {missing[0]!r} (its columns: "
                f"{', '.join(schema.names) or 'none'})"
            )
        return schema

    def check(
        self, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``times`` and ``key_groups`` as ``int64`` arrays; a batch that does not come with
        one of each per row is refused."""
        n = batch.num_rows
        times = np.asarray(times, dtype=np.int64)
        key_groups = np.asarray(key_groups, dtype=np.int64)
        if times.shape != (n,) or key_groups.shape != (n,):
            raise JoinError(
                f"join: a {self.name} batch of {n} rows came with {times.size} times and "
                f"{key_groups.size} key groups (one of each per row)"
            )
        return times, key_groups

    # ------------------------------------------------------------------ rows

    def append(
        self,
        batch: pa.RecordBatch,
        times: np.ndarray,
        key_groups: np.ndarray,
        matched: np.ndarray | None = None,
    ) -> int:
        """Keep ``batch``'s rows (alive; ``matched``: whether each paired already, default
        not); returns the index of the first."""
        first = self.size
        batch = self.conform(batch)
        times, key_groups = self.check(batch, times, key_groups)
        n = batch.num_rows
        if not n:
            return first
        self._add_chunk(batch)
        self._times.extend(times)
        self._groups.extend(key_groups)
        self._alive.extend(np.ones(n, dtype=bool))
        if self._matched is not None:
            self._matched.extend(np.zeros(n, dtype=bool) if matched is None else matched)
        self.count += n
        return first

    def drop(self, rows: np.ndarray) -> None:
        """Mark alive ``rows`` dropped (indices, each once)."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return
        self._alive.view[rows] = False
        self.count -= len(rows)
        self._count_dropped(rows)

    def alive_rows(self) -> np.ndarray:
        """The indices of the rows alive, in order."""
        return np.flatnonzero(self._alive.view)

    def compact(self) -> np.ndarray | None:
        """Take dropped rows out, if they outnumber the alive ones and :data:`SLACK` (if
        ``eager``: any), or a spilled chunk holds none alive (see
        :meth:`~cutline.runtime.joins.chunks.ChunkedRows._compact_chunks`: a spilled chunk
        may keep some). Returns which old rows stay (the new index of a row that does is
        the number of those before it), or ``None``: nothing changed."""
        dead = self.size - self.count
        if not dead or not (self.eager or dead > self.count + SLACK or self._dead_files):
            return None
        keep = self._compact_chunks(self._alive.view)
        for column in (self._times, self._groups, self._alive, self._matched):
            if column is not None:
                column.keep(keep)
        return keep

    def _alive_counts(self, chunks: list[int]) -> list[int]:
        alive, starts = self._alive.view, self._starts
        return [int(np.count_nonzero(alive[starts[i] : starts[i + 1]])) for i in chunks]

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, pa.Table]:
        """The rows as two tables: ``"<side>"`` (the columns as they came: the chunks, not
        copied; absent while they are not known) and ``"<side>.rows"`` (per row its
        ``time``, ``key_group``, whether it is ``alive`` when some are not, and whether it
        ``matched`` where that is kept). Dropped rows not taken out yet are in it, marked."""
        state = {
            TIME: pa.array(self._times.view.copy(), type=pa.int64()),
            KEY_GROUP: pa.array(self._groups.view.copy(), type=pa.int64()),
        }
        if self.count < self.size:  # (bools are copied into Arrow's bits)
            state[ALIVE] = pa.array(self._alive.view, type=pa.bool_())
        if self._matched is not None:
            state[MATCHED] = pa.array(self._matched.view, type=pa.bool_())
        tables = {f"{self.name}.rows": pa.table(state)}
        if self.schema is not None:
            tables[self.name] = self.table
        return tables

    @classmethod
    def restore(
        cls,
        side: Side,
        on: tuple[str, ...],
        schema: pa.Schema | None,
        snapshots: Sequence[dict[str, pa.Table]],
        key_groups: range,
        *,
        matched: bool = False,
        eager: bool = False,
        spill: Spill | None = None,
    ) -> tuple[SideRows, list[np.ndarray]]:
        """The alive rows of ``snapshots`` (made by :meth:`snapshot`) whose key group is in
        ``key_groups``, in the snapshots' order (spilled as they come, beyond ``spill``'s
        budget); and for each snapshot the new index of each of its rows (``-1``: not
        kept)."""
        name = side.name.lower()
        for tables in snapshots:
            if schema is None and name in tables:
                schema = tables[name].schema
        kept = cls(side, on, schema, matched=matched, eager=eager)
        mappings = []
        for number, tables in enumerate(snapshots):
            state, data = tables.get(f"{name}.rows"), tables.get(name)
            if state is None or (data.num_rows if data is not None else 0) != state.num_rows:
                raise JoinError(
                    f"join: snapshot {number} has no {name}.rows table of as many rows as its "
                    f"{name} rows: it was not written by a join"
                )
            if matched and MATCHED not in state.column_names:
                raise JoinError(
                    f"join: snapshot {number} does not say which {name} rows found a partner "
                    f"(it is of a join that does not emit unmatched {name} rows): it cannot be "
                    "restored into one that does"
                )
            groups = _numpy(state.column(KEY_GROUP))
            mine = _in_range(groups, key_groups)
            if ALIVE in state.column_names:
                mine &= _numpy(state.column(ALIVE))
            mapping = np.full(len(groups), -1, dtype=np.int64)
            mapping[mine] = kept.size + np.arange(int(mine.sum()), dtype=np.int64)
            mappings.append(mapping)
            if data is None or not mine.any():
                continue
            if not mine.all():
                data = data.filter(pa.array(mine))
            times, groups = _numpy(state.column(TIME))[mine], groups[mine]
            flags = _numpy(state.column(MATCHED))[mine] if matched else None
            at = 0
            for batch in data.to_batches():
                end = at + batch.num_rows
                part = None if flags is None else flags[at:end]
                kept.append(batch, times[at:end], groups[at:end], part)
                at = end
            if spill is not None:
                spill.settle(kept)
        return kept, mappings


def _in_range(groups: np.ndarray, key_groups: range) -> np.ndarray:
    if key_groups.step == 1:
        mine: np.ndarray = (groups >= key_groups.start) & (groups < key_groups.stop)
        return mine
    return np.isin(groups, np.asarray(key_groups, np.int64))


def _numpy(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_numpy())


def _columns(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name}: {f.type}" for f in schema) + ")"
