"""What every join emits, laid out one way (:class:`JoinLayout`): the join key once (named as
the left names it), then the left's other columns, then the right's other columns, a right
column whose name is taken already renamed with ``suffix`` (default ``"_right"``); a row of
an outer join that found no partner has nulls on the missing side. A window join adds
``window_start`` and ``window_end`` after the key.

A join's state keeps each side's rows as they came (Arrow tables); a kernel finds which rows
pair and hands :meth:`JoinLayout.assemble` the pairs as two arrays of row indices (``-1``:
no partner), which it turns into the result batch, column by column (``take``: no Python
per record).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class Side(IntEnum):
    """The two inputs of a two-input operator: a join's left and right, ``connect``'s first
    and second."""

    LEFT = 0
    RIGHT = 1


@dataclass(frozen=True)
class JoinLayout:
    """The result's columns of a join of ``left_on`` (the left's key columns) with
    ``right_on`` (the right's, as many, in the same order)."""

    left_on: tuple[str, ...]
    right_on: tuple[str, ...]
    suffix: str = "_right"
    windows: bool = False
    """Whether ``window_start`` and ``window_end`` follow the key (a window join)."""

    def __post_init__(self) -> None:
        assert len(self.left_on) == len(self.right_on) and self.left_on

    def right_name(self, name: str, left: pa.Schema) -> str:
        """What the right's column ``name`` is called in the result."""
        taken = set(left.names) | ({"window_start", "window_end"} if self.windows else set())
        return f"{name}{self.suffix}" if name in taken else name

    def schema(
        self, left: pa.Schema, right: pa.Schema, window_type: pa.DataType | None = None
    ) -> pa.Schema:
        """The result's schema, from both sides' (the right's columns nullable)."""
        # (every column nullable: an outer row has nulls on its missing side)
        fields = [left.field(name).with_nullable(True) for name in self.left_on]
        if self.windows:
            assert window_type is not None
            fields += [pa.field("window_start", window_type), pa.field("window_end", window_type)]
        fields += [f.with_nullable(True) for f in left if f.name not in self.left_on]
        fields += [
            pa.field(self.right_name(f.name, left), f.type)
            for f in right
            if f.name not in self.right_on
        ]
        return pa.schema(fields)

    def assemble(
        self,
        left: pa.Table,
        right: pa.Table,
        left_rows: np.ndarray,
        right_rows: np.ndarray,
        windows: Sequence[pa.Array] | None = None,
    ) -> pa.RecordBatch:
        """The result rows of the pairs ``(left_rows[i], right_rows[i])`` (row indices into
        ``left`` and ``right``; ``-1``: that side is missing, its columns null; the key then
        comes from the other side). ``windows``: (window join) the pairs' ``window_start``
        and ``window_end``."""
        n = len(left_rows)
        assert len(right_rows) == n
        left_take = _indices(left_rows)
        right_take = _indices(right_rows)
        columns: list[pa.Array] = []
        for left_name, right_name in zip(self.left_on, self.right_on, strict=True):
            key = _taken(left.column(left_name), left_take)
            if (left_rows < 0).any():
                other = _taken(right.column(right_name), right_take)
                key = pc.if_else(pc.is_null(left_take), other.cast(key.type), key)
            columns.append(key)
        if self.windows:
            assert windows is not None
            columns += list(windows)
        columns += [
            _taken(left.column(name), left_take)
            for name in left.column_names
            if name not in self.left_on
        ]
        columns += [
            _taken(right.column(name), right_take)
            for name in right.column_names
            if name not in self.right_on
        ]
        window_type = windows[0].type if windows else None
        schema = self.schema(left.schema, right.schema, window_type)
        return pa.RecordBatch.from_arrays(columns, schema=schema)


def _indices(rows: np.ndarray) -> pa.Array:
    """Row indices as an Arrow array whose ``-1`` s are nulls (``take`` gives a null there)."""
    rows = np.asarray(rows, dtype=np.int64)
    return pa.array(rows, mask=rows < 0, type=pa.int64())


def _taken(column: pa.ChunkedArray | pa.Array, indices: pa.Array) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column.take(indices)
