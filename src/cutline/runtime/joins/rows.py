"""The rows one side of a window or as-of join keeps (:class:`SideRows`): its batches as
they came, each row's event time and key group beside them, and which rows are still alive.

A row is known by its index (its place among the rows kept, in the order they came). A
kernel drops rows by marking them; they are taken out in bulk (:meth:`SideRows.compact`)
once the dropped ones outnumber the alive ones, so that a row is copied a bounded number
of times however often the watermark moves, and the kernel then renumbers what refers to
rows by the mapping it is given. Arrow data is never changed in place: a snapshot taken
holds the arrays it was given while the kernel goes on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from cutline.runtime.joins.output import Side


class JoinError(ValueError):
    """A window or as-of join's kernel given what it cannot take: a batch whose columns differ
    from its side's, or lack a key column; times or key groups not one per row; rows that
    are late; snapshots of another join."""


SLACK = 4096
"""Dropped rows are taken out once there are more of them than alive rows and this."""

TIME = "time"
KEY_GROUP = "key_group"


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

    def reset(self, items: np.ndarray) -> None:
        self._data = np.array(items, dtype=self._data.dtype)
        self.size = len(self._data)


class SideRows:
    """The rows of one side of a join, kept until the kernel drops them.

    :param side: which side (named in errors).
    :param on: the side's key columns (a schema without them is refused).
    :param schema: the side's columns, when known before its first batch (a join that emits a
        side's nulls before any row of it came needs them).
    """

    def __init__(
        self, side: Side, on: tuple[str, ...] = (), schema: pa.Schema | None = None
    ) -> None:
        self.side = side
        self.on = on
        self.schema = None if schema is None else self._checked(schema)
        self._chunks: list[pa.Table] = []
        self._table: pa.Table | None = None
        self._times = Growing(np.int64)
        self._groups = Growing(np.int64)
        self._alive = Growing(np.bool_)
        self.count = 0
        """The rows alive."""

    @property
    def name(self) -> str:
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
    def table(self) -> pa.Table:
        """Every row kept, alive or dropped, in index order."""
        if self._table is None:
            if self.schema is None:
                raise JoinError(
                    f"join: the {self.name} side's columns are not known (no row of it came, "
                    "and the kernel was not given its schema): pass schemas= to the kernel"
                )
            self._table = pa.Table.from_batches([], schema=self.schema)
            if self._chunks:
                self._table = pa.concat_tables(self._chunks)
                self._chunks = [self._table]
        return self._table

    def append(self, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray) -> int:
        """Keep ``batch``'s rows (alive); returns the index of the first."""
        first = self.size
        self.check(batch, times, key_groups)
        batch = self._conform(batch)
        n = batch.num_rows
        self._chunks.append(pa.Table.from_batches([batch]))
        self._table = None
        self._times.extend(np.asarray(times, dtype=np.int64))
        self._groups.extend(np.asarray(key_groups, dtype=np.int64))
        self._alive.extend(np.ones(n, dtype=bool))
        self.count += n
        return first

    def check(self, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray) -> None:
        """Refuse a batch that does not come with one time and one key group per row."""
        n = batch.num_rows
        if len(times) != n or len(key_groups) != n:
            raise JoinError(
                f"join: a {self.name} batch of {n} rows came with {len(times)} times and "
                f"{len(key_groups)} key groups (one of each per row)"
            )

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` in the side's schema (the first batch's, or the one given)."""
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
            f"join: a {self.name} batch's columns ({batch.schema}) are not the "
            f"{self.name} side's ({self.schema})"
        )

    def _checked(self, schema: pa.Schema) -> pa.Schema:
        """``schema``, if it has the key columns."""
        missing = [name for name in self.on if name not in schema.names]
        if missing:
            raise JoinError(
                f"join: the {self.name} side has no key column {missing[0]!r} (its columns: "
                f"{', '.join(schema.names)})"
            )
        return schema

    def take(self, rows: np.ndarray) -> pa.Table:
        """The rows at ``rows`` (indices), in that order."""
        return self.table.take(pa.array(rows, type=pa.int64()))

    def drop(self, rows: np.ndarray) -> None:
        """Mark alive ``rows`` dropped (indices, each once)."""
        alive = self._alive.view
        if len(rows):
            alive[rows] = False
        self.count -= len(rows)

    def alive_rows(self) -> np.ndarray:
        """The indices of the rows alive, in order."""
        return np.flatnonzero(self._alive.view)

    def compact(self, force: bool = False) -> np.ndarray | None:
        """Take the dropped rows out, if they outnumber the alive ones and :data:`SLACK` (or
        ``force``, and there are any): the alive rows get indices from 0 on, in order.
        Returns the new index of each old one (``-1``: dropped), or ``None``: nothing
        changed."""
        dropped = self.size - self.count
        if not dropped or (not force and dropped <= self.count + SLACK):
            return None
        alive = self._alive.view
        kept = np.flatnonzero(alive)
        mapping = np.full(self.size, -1, dtype=np.int64)
        mapping[kept] = np.arange(len(kept), dtype=np.int64)
        if self.schema is not None:
            self._table = self.take(kept)
            self._chunks = [self._table]
        self._times.reset(self._times.view[kept])
        self._groups.reset(self._groups.view[kept])
        self._alive.reset(np.ones(len(kept), dtype=bool))
        return mapping

    def snapshot(self, prefix: str) -> dict[str, pa.Table]:
        """The rows as two tables, ``prefix`` (the columns as they came) and
        ``prefix.rows`` (``time``, ``key_group``): taken after :meth:`compact` with
        ``force`` (every row alive)."""
        assert self.count == self.size, "compact(force=True) first"
        tables = {
            f"{prefix}.rows": pa.table(
                {
                    TIME: pa.array(self._times.view, type=pa.int64()),
                    KEY_GROUP: pa.array(self._groups.view, type=pa.int64()),
                }
            )
        }
        if self.schema is not None:
            tables[prefix] = self.table
        return tables

    @classmethod
    def restore(
        cls,
        side: Side,
        on: tuple[str, ...],
        schema: pa.Schema | None,
        snapshots: Sequence[dict[str, pa.Table]],
        prefix: str,
        key_groups: range,
    ) -> tuple[SideRows, list[np.ndarray]]:
        """The rows of ``snapshots`` (made by :meth:`snapshot` with ``prefix``) whose key group
        is in ``key_groups``, in the snapshots' order; and for each snapshot the new index of
        each of its rows (``-1``: not kept)."""
        assert key_groups.step == 1
        kept = cls(side, on, schema)
        mappings = []
        for tables in snapshots:
            rows = tables[f"{prefix}.rows"]
            groups = np.asarray(rows.column(KEY_GROUP).to_numpy(), dtype=np.int64)
            mine = (groups >= key_groups.start) & (groups < key_groups.stop)
            mapping = np.full(len(groups), -1, dtype=np.int64)
            mapping[mine] = kept.size + np.arange(int(mine.sum()), dtype=np.int64)
            mappings.append(mapping)
            if not mine.any():
                continue
            data = tables[prefix]
            if not mine.all():
                data = data.filter(pa.array(mine))
            times = np.asarray(rows.column(TIME).to_numpy(), dtype=np.int64)[mine]
            groups = groups[mine]
            start = kept.size
            for batch in data.to_batches():
                at = kept.size - start
                n = batch.num_rows
                kept.append(batch, times[at : at + n], groups[at : at + n])
        return kept, mappings
