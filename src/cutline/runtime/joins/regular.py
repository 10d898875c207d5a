"""The regular join's kernel (:class:`RegularJoin`): one subtask's state of the inner join of
everything both streams ever brought, by key.

**Which pairs.** A left row and a right row pair when their keys are equal (no key column
null: a null never equals anything), whatever their times. Every pair is emitted once, by
the :meth:`~RegularJoin.add` that brings the later of its two rows (the arriving row is paired
at once with every kept row of the other side of its key, then kept itself): append only,
nothing is ever retracted or held back. A result's event time is the later of its two rows'
(the operator reads it from the columns).

**How long a row is kept.** With ``ttl_ms=None``, for ever: the state grows with the input
(every row with a key; :meth:`~RegularJoin.kept` counts them), until the end of the input
(``advance(MAX_WATERMARK)``: nothing more can come) drops it all. With ``ttl_ms``, a row is
kept until the watermark reaches ``row.time + ttl_ms``: the first :meth:`~RegularJoin.advance`
``(w)`` with ``w >= row.time + ttl_ms`` drops it, and rows that arrive after that never pair
with it, whatever their times (the ``ttl`` bounds the state, not the pairs: two rows further
apart than the ``ttl`` still pair if the later one comes before the earlier one is dropped).
A row whose key is null is never kept.
"""

from __future__ import annotations

from typing import Self

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MAX_WATERMARK, MIN_WATERMARK
from cutline.runtime.joins.interval import WATERMARK
from cutline.runtime.joins.kept import (
    KeptRows,
    check_batch,
    gathered,
    key_columns,
    nulls_in,
    partners,
    side_name,
)
from cutline.runtime.joins.output import JoinLayout, Side


class RegularJoin:
    """One subtask's state of a regular (inner) join (the module's docstring says exactly
    what it emits and how long it keeps a row).

    :param layout: the key columns of each side and the result's columns.
    :param ttl_ms: how long after its time (ms of event time, by the watermark) a row is
        kept; ``None``: for ever.
    """

    def __init__(self, layout: JoinLayout, ttl_ms: int | None = None) -> None:
        if ttl_ms is not None and ttl_ms < 0:
            raise ValueError(f"a join's ttl ({ttl_ms} ms) is negative: it is at least 0")
        self.layout = layout
        self.ttl = ttl_ms
        self.watermark = MIN_WATERMARK
        """The greatest watermark :meth:`advance` was given."""
        self.sides = tuple(KeptRows(side, key_columns(layout, side), False) for side in Side)

    def add(
        self, side: Side, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray
    ) -> pa.RecordBatch | None:
        """Pair the rows of ``batch`` (of ``side``; ``times`` their event times in ms;
        ``key_groups`` theirs) with every kept row of the other side of their key, and keep
        them. What they pair with (``None``: nothing)."""
        rows, other = self.sides[side], self.sides[1 - side]
        table, times, key_groups = check_batch(side, batch, times, key_groups)
        rows.learn(table.schema)
        ours, theirs = partners(self.layout, side, table, other)
        keep = ~nulls_in(table, rows.on)  # (a row is never past its ttl yet: time > watermark)
        rows.append(
            table if keep.all() else table.filter(pa.array(keep)),
            times[keep],
            key_groups[keep],
            np.zeros(int(keep.sum()), np.bool_),
        )
        if not len(ours):
            return None
        assert other.table is not None
        their_table, theirs = gathered(other.table, theirs)
        if side is Side.LEFT:
            return self.layout.assemble(table, their_table, ours, theirs)
        return self.layout.assemble(their_table, table, theirs, ours)

    def advance(self, watermark: int) -> None:
        """Event time reached ``watermark``: drop the rows whose ``ttl`` has run out (all of
        them at ``MAX_WATERMARK``). A regular join emits nothing then: it returns ``None``."""
        if watermark <= self.watermark:
            return None
        self.watermark = watermark
        last = self._last_kept()
        for rows in self.sides:
            if len(rows) and (last == MAX_WATERMARK or self.ttl is not None):
                rows.keep(rows.times > last)
        return None

    def _last_kept(self) -> int:
        """The rows with a time at or before this are dropped at the current watermark."""
        if self.watermark == MAX_WATERMARK:
            return MAX_WATERMARK
        if self.ttl is None:
            return MIN_WATERMARK
        return max(self.watermark - self.ttl, MIN_WATERMARK)

    # ------------------------------------------------------------------ state

    def kept(self) -> dict[str, int]:
        """How many rows each side keeps now (``"left"``, ``"right"``)."""
        return {side_name(rows.side): len(rows) for rows in self.sides}

    def snapshot(self) -> dict[str, pa.Table]:
        """Everything kept, as tables (the rows themselves are not copied): ``"left"`` and
        ``"right"`` the kept rows, ``"left_state"`` and ``"right_state"`` per row its time and
        key group, ``"watermark"`` the watermark reached."""
        tables = {WATERMARK: pa.table({WATERMARK: pa.array([self.watermark], pa.int64())})}
        for rows in self.sides:
            rows.snapshot(tables)
        return tables

    @classmethod
    def restore(
        cls,
        layout: JoinLayout,
        ttl_ms: int | None,
        snapshots: list[dict[str, pa.Table]],
        key_groups: range,
    ) -> Self:
        """The kernel of the subtask owning ``key_groups``, from the :meth:`snapshot` s of any
        number of old subtasks (a restore at another parallelism): their rows of those key
        groups. Its watermark is the least of theirs."""
        join = cls(layout, ttl_ms)
        join.sides = tuple(
            KeptRows.restored(rows.side, rows.on, False, snapshots, key_groups)
            for rows in join.sides
        )
        marks = [int(s[WATERMARK].column(0)[0].as_py()) for s in snapshots if WATERMARK in s]
        join.watermark = min(marks, default=MIN_WATERMARK)
        return join
