"""The window join's kernel (:class:`WindowJoin`): the pairs of a left and a right row with
equal keys in the same window, emitted when the window fires.

Which windows a row is in is the assigner's (:mod:`cutline.runtime.eventtime.assigners`),
as for a window aggregation:

* ``Tumbling``: its one window; ``Sliding``: each of its ``size / every`` windows, and a
  pair in two overlapping windows is emitted once per window (as Flink's window join does);
* ``Session``: the sessions of the rows of *both* sides together, per key (rows at most
  ``gap`` apart are one session; two sessions that touch merge), a session ending at its
  last row's time plus the gap.

A window **fires** when the watermark reaches its last millisecond (``window_end - 1``, the
window operator's rule): :meth:`WindowJoin.advance` then emits every pair of its rows with
equal keys (nulls never equal), and with ``how=`` ``left``, ``right`` or ``full`` each of its
rows of that side with no partner in that window, nulls on the other side. A row with a null
in its key pairs with nothing; an outer join emits it when its window fires (for sessions,
rows of the same key with nulls are one key, as ``GROUP BY`` has them: their session is
theirs together). A row is kept
until the last of its windows fires (a sliding window's row while any of its windows is
open), then dropped. Nothing is emitted before the watermark: :meth:`WindowJoin.add` keeps.

Results are laid out by :class:`~cutline.runtime.joins.output.JoinLayout` (with
``windows=True``): the key, ``window_start`` and ``window_end`` (int64 epoch milliseconds
here; the operator converts them to the event-time column's type), the left's columns, the
right's.

**Late rows.** A row is late when every window it would be in has fired: its last window's
end minus one is at or below the watermark (a session's: the session it alone would open,
``[t, t + gap)``), as the window operator's rule with no allowed lateness. The operator sends
those to ``.late()`` (:meth:`WindowJoin.late` says which); :meth:`~WindowJoin.add` refuses
them. A sliding window's row some of whose windows fired is in the others only. A session
that fired is gone: a row that comes after it starts a new one, as in Flink (whose merging
windows purge what fired).

**Tumbling and sliding windows** keep each row once, in its *slice* (a sliding window's
``gcd(size, every)`` ms, :mod:`cutline.runtime.eventtime.slicing`; a tumbling window is its
own slice); a window that fires gathers its slices' rows, and a slice is dropped with its
rows when the last window holding it fires. **Sessions** keep the rows alone: when the
watermark reaches the earliest session's end, the sessions of every kept row are cut afresh
(per key, sorted by time: NumPy), and those that ended fire.

After a restore from several subtasks (a lower parallelism) each row remembers the
watermark its subtask had reached: a window that ended there had fired with it, and does not
again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_never

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MIN_WATERMARK
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.joins.how import How
from cutline.runtime.joins.keycodes import pair_up
from cutline.runtime.joins.output import JoinLayout, Side
from cutline.runtime.joins.rows import JoinError, SideRows
from cutline.runtime.joins.window_rows import Fired, SessionRows, SliceRows

WindowRows = SliceRows | SessionRows

JOIN = "join"
"""The snapshot's table of what the join itself keeps: its watermark, assigner and how."""


class WindowJoin:
    """One subtask's state of a window join, and its rule.

    :param layout: the result's columns (``windows=True``), and the key columns of each side.
    :param assigner: ``Tumbling``, ``Sliding`` or ``Session``.
    :param how: ``"inner"``, ``"left"``, ``"right"`` or ``"full"``.
    :param schemas: both sides' schemas, if known before their first rows (an outer join that
        emits a side's nulls before a row of it came needs them).
    """

    def __init__(
        self,
        layout: JoinLayout,
        assigner: Tumbling | Sliding | Session,
        how: str | How,
        *,
        schemas: tuple[pa.Schema | None, pa.Schema | None] | None = None,
    ) -> None:
        if not layout.windows:
            raise JoinError("window join: its layout has no window_start, window_end")
        self.layout = layout
        self.assigner = assigner
        self.how = How.of(how, tuple(How), f"a window join ({assigner})")
        left, right = schemas if schemas is not None else (None, None)
        self.rows = (
            SideRows(Side.LEFT, layout.left_on, left),
            SideRows(Side.RIGHT, layout.right_on, right),
        )
        self.watermark = MIN_WATERMARK
        self.windows: WindowRows = _windows(assigner, layout, self.rows)

    def late(self, side: Side, times: np.ndarray) -> np.ndarray:
        """Which of a batch's rows (of either side, at ``times``) are late: every window each
        would be in has fired (a mask)."""
        return self.windows.late(np.asarray(times, dtype=np.int64), self.watermark)

    def add(
        self, side: Side, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray
    ) -> pa.RecordBatch | None:
        """Keep a batch of ``side``'s rows until their windows fire (none may be late: see
        :meth:`late`). Returns ``None``: a window join emits when windows fire."""
        times = np.asarray(times, dtype=np.int64)
        self.rows[side].check(batch, times, key_groups)
        late = self.windows.late(times, self.watermark)
        if late.any():
            raise JoinError(
                f"window join ({self.assigner}): {int(late.sum())} of a {side.name.lower()} "
                f"batch's {len(times)} rows are late at the watermark {self.watermark} "
                "(every window they would be in has fired): the operator sends late rows to "
                ".late() before the kernel"
            )
        first = self.rows[side].append(batch, times, key_groups)
        floors = np.full(len(times), self.watermark, dtype=np.int64)
        self.windows.place(side, first, times, floors, self.watermark)
        return None

    def advance(self, watermark: int) -> pa.RecordBatch | None:
        """Event time reached ``watermark``: the windows whose last millisecond it reached
        fire (their pairs, and the outer rows ``how`` asks for); their rows that no open
        window holds are dropped."""
        if watermark <= self.watermark:
            return None
        previous, self.watermark = self.watermark, watermark
        fired = self.windows.fire(previous, watermark)
        out = None if fired is None else self._emit(fired)
        self.windows.release(watermark)
        return out

    def _emit(self, fired: Fired) -> pa.RecordBatch | None:
        """The result rows of the fired windows' rows."""
        how = self.how
        left, right = pair_up(
            fired.left_groups, fired.right_groups, how.outer(Side.LEFT), how.outer(Side.RIGHT)
        )
        if not len(left):
            return None
        window = np.where(
            left >= 0,
            fired.left_windows[np.maximum(left, 0)] if len(fired.left) else -1,
            fired.right_windows[np.maximum(right, 0)] if len(fired.right) else -1,
        )
        left_rows = self._taken(Side.LEFT, fired.left, left)
        right_rows = self._taken(Side.RIGHT, fired.right, right)
        starts = pa.array(fired.starts[window], type=pa.int64())
        ends = pa.array(fired.ends[window], type=pa.int64())
        return self.layout.assemble(
            left_rows[0], right_rows[0], left_rows[1], right_rows[1], [starts, ends]
        )

    def _taken(self, side: Side, rows: np.ndarray, at: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """The rows of ``side`` the result takes (``rows[at]``, ``-1``: none) as a table of
        those alone, and where each result row's is in it."""
        used = at >= 0
        if used.all():
            return self.rows[side].take(rows[at]), np.arange(len(at), dtype=np.int64)
        positions = np.full(len(at), -1, dtype=np.int64)
        positions[used] = np.arange(int(used.sum()), dtype=np.int64)
        return self.rows[side].take(rows[at[used]]), positions

    def kept(self) -> dict[str, int]:
        """The rows kept now, per side."""
        return {"left": self.rows[0].count, "right": self.rows[1].count}

    def snapshot(self) -> dict[str, pa.Table]:
        """Everything kept, as tables: each side's rows (``left``, ``right``) with their times
        and key groups (``left.rows``, ``right.rows``), and ``join``: the watermark, the
        assigner and ``how`` (a restore checks them). The dropped rows are taken out first;
        the tables share the kernel's arrays (nothing is copied; the kernel never changes
        them in place)."""
        self.windows.compact(force=True)
        tables = {
            JOIN: pa.table(
                {
                    "watermark": pa.array([self.watermark], type=pa.int64()),
                    "windows": [str(self.assigner)],
                    "how": [self.how.value],
                }
            )
        }
        for kept in self.rows:
            tables.update(kept.snapshot(kept.name))
        return tables

    @classmethod
    def restore(
        cls,
        layout: JoinLayout,
        assigner: Tumbling | Sliding | Session,
        how: str | How,
        snapshots: Sequence[dict[str, pa.Table]],
        key_groups: range,
        *,
        schemas: tuple[pa.Schema | None, pa.Schema | None] | None = None,
        watermark: int | None = None,
    ) -> WindowJoin:
        """A window join from the snapshots of any number of subtasks of the same join,
        keeping the rows whose key group is in ``key_groups``. Its watermark is ``watermark``,
        or the least the snapshots had reached; each row keeps its own subtask's (the
        windows that ended there fired, and do not again)."""
        join = cls(layout, assigner, how, schemas=schemas)
        marks = []
        for tables in snapshots:
            meta = tables[JOIN]
            said = (meta.column("windows")[0].as_py(), meta.column("how")[0].as_py())
            if said != (str(assigner), join.how.value):
                raise JoinError(
                    f"window join: a snapshot of a join of {said[0]}, how={said[1]!r} cannot be "
                    f"restored as one of {assigner}, how={join.how.value!r}"
                )
            marks.append(int(meta.column("watermark")[0].as_py()))
        join.watermark = min(marks, default=MIN_WATERMARK) if watermark is None else watermark
        restored = []
        for side in Side:
            schema = join.rows[side].schema
            name = join.rows[side].name
            for tables in snapshots:
                if schema is None and name in tables:
                    schema = tables[name].schema
            kept, mappings = SideRows.restore(
                side, join.rows[side].on, schema, snapshots, name, key_groups
            )
            marked = [
                np.full(int((mapping >= 0).sum()), mark, dtype=np.int64)
                for mapping, mark in zip(mappings, marks, strict=True)
            ]
            restored.append((kept, np.concatenate([*marked, np.empty(0, dtype=np.int64)])))
        join.rows = (restored[0][0], restored[1][0])
        join.windows = _windows(assigner, layout, join.rows)
        for side, (kept, floors) in zip(Side, restored, strict=True):
            join.windows.place(side, 0, kept.times, floors, join.watermark)
        return join


def _windows(
    assigner: Tumbling | Sliding | Session, layout: JoinLayout, rows: tuple[SideRows, SideRows]
) -> WindowRows:
    match assigner:
        case Tumbling() | Sliding():
            return SliceRows(assigner, layout, rows)
        case Session():
            return SessionRows(assigner, layout, rows)
        case _:
            assert_never(assigner)
