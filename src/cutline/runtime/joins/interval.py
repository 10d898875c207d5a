"""The interval join's kernel (:class:`IntervalJoin`): one subtask's state of a join of two
streams by key and by how far apart in event time their rows are.

**Which pairs.** A left row ``L`` and a right row ``R`` pair when their keys are equal (no
key column null: a null never equals anything) and ``lower <= R.time - L.time <= upper``
(both bounds inclusive; ``lower <= upper``; either may be negative: ``(-600_000, 0)`` pairs
each left row with the right rows of the ten minutes up to and including its time). Every
pair is emitted once, by the :meth:`~IntervalJoin.add` that brings the later of its two rows
(the arriving row is paired at once with the other side's kept rows of its key, then kept
itself): pairs are never held back for a watermark. A result's event time is the later of
its two rows' (the operator reads it from the columns).

**When a row can no longer pair.** The watermark ``w`` promises that no row of either side
with time at or before ``w`` will come. A left row ``L`` pairs with right rows up to time
``L.time + upper``, so once ``w >= L.time + upper`` no row that could pair with it is still
to come; a right row ``R`` pairs with left rows up to time ``R.time - lower``, so once
``w >= R.time - lower`` none is.

**What an outer join emits, and when.** With ``how="left"`` (or ``"full"``), a left row that
never paired is emitted once, with nulls for the right's columns, by the first
:meth:`~IntervalJoin.advance` ``(w)`` with ``w >= L.time + upper``; with ``how="right"`` (or
``"full"``), a right row that never paired by the first ``advance(w)`` with
``w >= R.time - lower``; at the end of the input (``advance(MAX_WATERMARK)``) every such
row left. A row that arrives when the watermark already is at or past that time (only when
``upper < 0`` for a left row, ``lower > 0`` for a right row) is paired with the kept rows and,
if it found none, emitted unmatched by the same :meth:`~IntervalJoin.add`. A row with a null
key pairs with nothing and is emitted unmatched by the same rules.

**When state is dropped.** A left row is dropped once ``w >= L.time + upper`` (matched or
not, at the same ``advance`` that emits it unmatched), a right row once
``w >= R.time - lower``; at ``MAX_WATERMARK`` every row. So the left side keeps its rows
of event time from ``w - upper`` on, the right side from ``w + lower`` on (up to the newest
row, at most the input's disorder ahead of ``w``): flat over a steady input. A row that
arrives already past its time is not kept, nor is a row with a null key of an inner side.

One rare wait: an unmatched row is emitted with the other side's columns, so while the other
side's columns are unknown (no batch of it came, not even an empty one, and no schema was
given), a due unmatched row stays kept and is emitted by the first call that makes them
known (that side's first :meth:`~IntervalJoin.add`), or at ``MAX_WATERMARK`` with only the
other side's key columns.
"""

from __future__ import annotations

from typing import Self

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MAX_WATERMARK, MIN_WATERMARK
from cutline.runtime.joins.how import How
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

WATERMARK = "watermark"
"""The snapshot's one-row table of the watermark the kernel had reached."""


class IntervalJoin:
    """One subtask's state of an interval join (the module's docstring says exactly what it
    emits and when).

    :param layout: the key columns of each side and the result's columns.
    :param how: ``"inner"``, ``"left"``, ``"right"`` or ``"full"``.
    :param lower_ms: the least ``R.time - L.time`` of a pair (ms).
    :param upper_ms: the greatest (ms), at least ``lower_ms``.
    :param schemas: each side's columns, where known before its first batch (an outer row
        can then be emitted before the other side's first batch).
    """

    def __init__(
        self,
        layout: JoinLayout,
        how: str | How,
        lower_ms: int,
        upper_ms: int,
        *,
        schemas: tuple[pa.Schema | None, pa.Schema | None] = (None, None),
    ) -> None:
        if lower_ms > upper_ms:
            raise ValueError(
                f"interval join: the lower bound ({lower_ms} ms) is above the upper bound "
                f"({upper_ms} ms): no pair could ever match"
            )
        self.layout = layout
        self.how = How.of(how, what="an interval join")
        self.lower = int(lower_ms)
        self.upper = int(upper_ms)
        self.watermark = MIN_WATERMARK
        """The greatest watermark :meth:`advance` was given."""
        self.sides = tuple(
            KeptRows(side, key_columns(layout, side), self.how.outer(side), schema)
            for side, schema in zip(Side, schemas, strict=True)
        )

    # ------------------------------------------------------------------ rows and time

    def add(
        self, side: Side, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray
    ) -> pa.RecordBatch | None:
        """Pair the rows of ``batch`` (of ``side``; ``times`` their event times in ms, none at
        or before the watermark; ``key_groups`` theirs) with the other side's kept rows, and
        keep them. What they pair with now (and unmatched rows already past their time)."""
        rows, other = self.sides[side], self.sides[1 - side]
        schema_was_known = rows.schema is not None
        table, times, key_groups = check_batch(side, batch, times, key_groups)
        rows.learn(table.schema)
        if side is Side.LEFT:  # right rows of L.time + lower .. L.time + upper
            low, high = times + self.lower, times + self.upper
        else:  # left rows of R.time - upper .. R.time - lower
            low, high = times - self.upper, times - self.lower
        ours, theirs = partners(self.layout, side, table, other, low, high)
        matched = np.zeros(table.num_rows, np.bool_)
        matched[ours] = True
        if other.matched is not None:
            other.matched[theirs] = True

        past = times <= self._last_chance(side, self.watermark)
        emit = np.zeros(0, np.int64)
        if rows.outer:
            unmatched = past & ~matched
            if other.schema is None and self.watermark != MAX_WATERMARK:
                past &= ~unmatched  # waits for the other side's columns
            else:
                emit = np.flatnonzero(unmatched)
        keep = ~past
        if not rows.outer:
            keep &= ~nulls_in(table, rows.on)
        rows.append(
            table if keep.all() else table.filter(pa.array(keep)),
            times[keep],
            key_groups[keep],
            matched[keep],
        )

        out = []
        if len(ours) or len(emit):
            ours = np.concatenate([ours, emit])
            theirs = np.concatenate([theirs, np.full(len(emit), -1, np.int64)])
            out.append(self._assemble(side, table, ours, other, theirs))
        if not schema_was_known and len(other):
            out += self._expire(other, self.watermark)  # its unmatched rows waited for ours
        return _joined(out)

    def advance(self, watermark: int) -> pa.RecordBatch | None:
        """Event time reached ``watermark``: the rows of an outer side whose last chance to
        pair has passed and that never paired, with nulls on the other side; and drop every
        row whose last chance has passed. A watermark at or below the last is a no-op."""
        if watermark <= self.watermark:
            return None
        self.watermark = watermark
        out: list[pa.RecordBatch] = []
        for rows in self.sides:
            out += self._expire(rows, watermark)
        return _joined(out)

    def _last_chance(self, side: Side, watermark: int) -> int:
        """At ``watermark``, the rows of ``side`` with a time at or before this can pair with
        no row still to come (clamped to the range of ``int64``)."""
        if watermark == MAX_WATERMARK:
            return MAX_WATERMARK
        last = watermark - self.upper if side is Side.LEFT else watermark + self.lower
        return min(max(last, MIN_WATERMARK), MAX_WATERMARK)

    def _expire(self, rows: KeptRows, watermark: int) -> list[pa.RecordBatch]:
        """Drop the rows of ``rows`` past their last chance at ``watermark``; emit those of
        them an outer side never paired (unless they wait for the other side's columns)."""
        if not len(rows):
            return []
        past = rows.times <= self._last_chance(rows.side, watermark)
        if not past.any():
            return []
        out = []
        if rows.matched is not None:
            other = self.sides[1 - rows.side]
            unmatched = past & ~rows.matched
            if other.schema is None and watermark != MAX_WATERMARK:
                past &= ~unmatched
            elif unmatched.any():
                assert rows.table is not None
                ours = np.flatnonzero(unmatched)
                theirs = np.full(len(ours), -1, np.int64)
                out.append(self._assemble(rows.side, rows.table, ours, other, theirs))
        rows.keep(~past)
        return out

    def _assemble(
        self,
        side: Side,
        table: pa.Table,
        ours: np.ndarray,
        other: KeptRows,
        theirs: np.ndarray,
    ) -> pa.RecordBatch:
        """The result rows of the pairs ``(ours[i], theirs[i])`` of rows of ``table`` (of
        ``side``) and of ``other`` (``-1``: none)."""
        their_table = other.table
        if their_table is None:  # never known, at the end of the input: its keys only
            their_table = pa.schema(
                [
                    pa.field(theirs_name, table.schema.field(ours_name).type)
                    for ours_name, theirs_name in zip(
                        key_columns(self.layout, side), other.on, strict=True
                    )
                ]
            ).empty_table()
        table, ours = gathered(table, ours)
        their_table, theirs = gathered(their_table, theirs)
        if side is Side.LEFT:
            return self.layout.assemble(table, their_table, ours, theirs)
        return self.layout.assemble(their_table, table, theirs, ours)

    # ------------------------------------------------------------------ state

    def kept(self) -> dict[str, int]:
        """How many rows each side keeps now (``"left"``, ``"right"``)."""
        return {side_name(rows.side): len(rows) for rows in self.sides}

    def snapshot(self) -> dict[str, pa.Table]:
        """Everything kept, as tables (the rows themselves are not copied): ``"left"`` and
        ``"right"`` the kept rows, ``"left_state"`` and ``"right_state"`` per row its time, key
        group and (an outer side) whether it paired, ``"watermark"`` the watermark reached."""
        tables = {WATERMARK: pa.table({WATERMARK: pa.array([self.watermark], pa.int64())})}
        for rows in self.sides:
            rows.snapshot(tables)
        return tables

    @classmethod
    def restore(
        cls,
        layout: JoinLayout,
        how: str | How,
        lower_ms: int,
        upper_ms: int,
        snapshots: list[dict[str, pa.Table]],
        key_groups: range,
        *,
        schemas: tuple[pa.Schema | None, pa.Schema | None] = (None, None),
    ) -> Self:
        """The kernel of the subtask owning ``key_groups``, from the :meth:`snapshot` s of any
        number of old subtasks (a restore at another parallelism): their rows of those key
        groups, each with whether it paired. Its watermark is the least of theirs (the rows
        of an old subtask that had gone further were dropped there already; the operator's
        next :meth:`advance` brings it to its own)."""
        join = cls(layout, how, lower_ms, upper_ms, schemas=schemas)
        join.sides = tuple(
            KeptRows.restored(rows.side, rows.on, rows.outer, snapshots, key_groups, rows.schema)
            for rows in join.sides
        )
        marks = [int(s[WATERMARK].column(0)[0].as_py()) for s in snapshots if WATERMARK in s]
        join.watermark = min(marks, default=MIN_WATERMARK)
        return join


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch | None:
    """One batch of ``batches`` (``None``: no rows)."""
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return None
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)
