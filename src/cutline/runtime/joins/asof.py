"""The as-of join's kernel (:class:`AsofJoin`): each left row with the right row of the same
key that has the greatest time at or before the left's (the *version* valid then; the
event-time temporal join of Flink SQL, ``FOR SYSTEM_TIME AS OF``).

* **The answer.** For a left row ``L``: of the right rows with ``L``'s key (nulls equal
  nothing) and a time at or below ``L.time``, the one with the greatest time; of several at
  that time, the one that came last. ``how="inner"`` emits ``L`` with it, and nothing when
  there is none; ``how="left"`` emits ``L`` with nulls on the right then.
* **When.** A left row is emitted at the :meth:`~AsofJoin.advance` whose watermark (the
  least of both sides') reaches its time (``watermark >= L.time``), not before: a right row
  at or before ``L.time`` that comes before then still counts, and nothing emitted changes
  later. A row at or below the watermark when it comes is late (:meth:`~AsofJoin.late`: the
  operator sends it to ``.late()``).
* **What is kept.** The left rows not yet emitted, and per key the right versions that may
  still be an answer. A right version ``R`` is dropped once its key has a *newer* version
  ``R'`` (a greater time, or the same time and come later) whose time is at or below both the
  watermark and the time of every left row still pending: every pending left row, and every
  left row to come (its time is above the watermark, or it is late), then has ``R'`` or a
  newer version as its answer, never ``R``. It is dropped at the first ``advance`` at which
  this holds (only a moving watermark makes it hold: a row that comes is above it). So each
  key keeps the newest version at or below the watermark and those above it. At
  ``MAX_WATERMARK`` (the end of the input) every left row is emitted and every version
  dropped.
* A right row with a null in its key is the answer to nothing: it is not kept.

On columns: at an ``advance``, the pending left rows the watermark reached and the kept
versions get key codes together (:func:`~cutline.runtime.joins.keycodes.key_codes`), the
versions are sorted once by (key, time, arrival) (:class:`Versions`), each left row's answer
is the last of them at or before its (key, time) (``np.searchsorted``), and the versions a
newer one hides are found in the same sorted arrays. No Python runs per row.

Arrow's ``Table.join_asof`` (Acero's as-of join) was measured and not used: it wants both
inputs sorted by time and refuses times before 1970 ("out-of-order on-key values"), a null
key there matches a null key, and it was about ten times slower than the above on 100 000
rows a side with 10 000 keys (``bench/join_kernels.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.protocol.watermarks import MAX_WATERMARK, MIN_WATERMARK
from cutline.runtime.joins.how import How
from cutline.runtime.joins.keycodes import key_codes
from cutline.runtime.joins.output import JoinLayout, Side
from cutline.runtime.joins.rows import JoinError, SideRows

JOIN = "join"
"""The snapshot's table of what the join itself keeps: its watermark and how."""


class AsofJoin:
    """One subtask's state of an as-of join, and its rule (see the module).

    :param layout: the result's columns, and the key columns of each side.
    :param how: ``"inner"`` or ``"left"``.
    :param schemas: both sides' schemas, if known before their first rows (a left join that
        emits before a right row came needs the right's).
    """

    def __init__(
        self,
        layout: JoinLayout,
        how: str | How,
        *,
        schemas: tuple[pa.Schema | None, pa.Schema | None] | None = None,
    ) -> None:
        if layout.windows:
            raise JoinError("as-of join: its layout has window_start, window_end")
        self.layout = layout
        self.how = How.of(how, (How.INNER, How.LEFT), "an as-of join")
        left, right = schemas if schemas is not None else (None, None)
        self.rows = (
            SideRows(Side.LEFT, layout.left_on, left),
            SideRows(Side.RIGHT, layout.right_on, right),
        )
        self.watermark = MIN_WATERMARK
        self.next_ready = MAX_WATERMARK
        """The least time of the pending left rows (``MAX_WATERMARK``: none)."""
        self.next_prune = MAX_WATERMARK
        """The least time of a version above the last horizon versions were dropped at: until
        the horizon reaches it, no version can be dropped."""

    def late(self, side: Side, times: np.ndarray) -> np.ndarray:
        """Which of a batch's rows (of either side, at ``times``) are late: at or below the
        watermark (a mask)."""
        late: np.ndarray = np.asarray(times, dtype=np.int64) <= self.watermark
        return late

    def add(
        self, side: Side, batch: pa.RecordBatch, times: np.ndarray, key_groups: np.ndarray
    ) -> pa.RecordBatch | None:
        """Keep a batch of ``side``'s rows (none may be late: see :meth:`late`): left rows
        until the watermark reaches them, right ones as versions. Returns ``None``: an as-of
        join emits at the watermark."""
        times = np.asarray(times, dtype=np.int64)
        key_groups = np.asarray(key_groups, dtype=np.int64)
        self.rows[side].check(batch, times, key_groups)
        late = self.late(side, times)
        if late.any():
            raise JoinError(
                f"as-of join: {int(late.sum())} of a {side.name.lower()} batch's {len(times)} "
                f"rows are late (at or below the watermark {self.watermark}): the operator "
                "sends late rows to .late() before the kernel"
            )
        if side is Side.RIGHT:
            valid = _valid_keys(batch, self.layout.right_on)
            if valid is not None:  # (a null key is the answer to nothing)
                batch, times, key_groups = batch.filter(valid), times[valid], key_groups[valid]
        self.rows[side].append(batch, times, key_groups)
        if len(times):
            least = int(times.min())
            if side is Side.LEFT:
                self.next_ready = min(self.next_ready, least)
            else:
                self.next_prune = min(self.next_prune, least)
        return None

    def advance(self, watermark: int) -> pa.RecordBatch | None:
        """Event time (both sides') reached ``watermark``: the pending left rows at or
        before it are emitted with their answers, and the versions no row can have as its
        answer any more are dropped."""
        if watermark <= self.watermark:
            return None
        self.watermark = watermark
        left, right = self.rows
        ready, times = _NONE, _NONE
        if watermark >= self.next_ready:
            pending = left.alive_rows()
            pending_times = left.times[pending]
            reached = pending_times <= watermark
            ready, times = pending[reached], pending_times[reached]
            later = pending_times[~reached]
            self.next_ready = int(later.min()) if len(later) else MAX_WATERMARK
        horizon = min(watermark, self.next_ready)
        prune = watermark != MAX_WATERMARK and horizon >= self.next_prune
        out = None
        if len(ready) or prune:
            versions = Versions(self, ready, right.alive_rows())
            if len(ready):
                out = self._emit(ready, versions.answers(times))
            if prune:
                right.drop(versions.hidden(horizon))
                above = versions.times[versions.times > horizon]
                self.next_prune = int(above.min()) if len(above) else MAX_WATERMARK
        if watermark == MAX_WATERMARK:
            right.drop(right.alive_rows())
            self.next_prune = MAX_WATERMARK
        for kept in self.rows:
            kept.compact()
        return out

    def _emit(self, ready: np.ndarray, answers: np.ndarray) -> pa.RecordBatch | None:
        """The left rows ``ready`` with their ``answers`` (right rows, ``-1``: none), as
        ``how`` asks; they are dropped."""
        left, right = self.rows
        emitted, found = ready, answers
        if self.how is How.INNER:
            emitted, found = ready[answers >= 0], answers[answers >= 0]
        out = None
        if len(emitted):
            used = found >= 0
            at = np.full(len(found), -1, dtype=np.int64)
            at[used] = np.arange(int(used.sum()), dtype=np.int64)
            out = self.layout.assemble(
                left.take(emitted),
                right.take(found[used]),
                np.arange(len(emitted), dtype=np.int64),
                at,
            )
        left.drop(ready)
        return out

    def kept(self) -> dict[str, int]:
        """The rows kept now: pending left rows, and right versions."""
        return {"left": self.rows[0].count, "right": self.rows[1].count}

    def snapshot(self) -> dict[str, pa.Table]:
        """Everything kept, as tables: the pending left rows (``left``) and the versions
        (``right``), with their times and key groups (``left.rows``, ``right.rows``), and
        ``join``: the watermark and ``how``. The dropped rows are taken out first; the tables
        share the kernel's arrays (nothing is copied; the kernel never changes them in
        place)."""
        tables = {
            JOIN: pa.table(
                {"watermark": pa.array([self.watermark], type=pa.int64()), "how": [self.how.value]}
            )
        }
        for kept in self.rows:
            kept.compact(force=True)
            tables.update(kept.snapshot(kept.name))
        return tables

    @classmethod
    def restore(
        cls,
        layout: JoinLayout,
        how: str | How,
        snapshots: Sequence[dict[str, pa.Table]],
        key_groups: range,
        *,
        schemas: tuple[pa.Schema | None, pa.Schema | None] | None = None,
        watermark: int | None = None,
    ) -> AsofJoin:
        """An as-of join from the snapshots of any number of subtasks of the same join,
        keeping the rows whose key group is in ``key_groups``. Its watermark is
        ``watermark``, or the least the snapshots had reached (the operator keeps each key
        group's own as the floor its rows are late against, as a window operator does)."""
        join = cls(layout, how, schemas=schemas)
        marks = []
        for tables in snapshots:
            said = tables[JOIN].column("how")[0].as_py()
            if said != join.how.value:
                raise JoinError(
                    f"as-of join: a snapshot of a join how={said!r} cannot be restored as one "
                    f"how={join.how.value!r}"
                )
            marks.append(int(tables[JOIN].column("watermark")[0].as_py()))
        join.watermark = min(marks, default=MIN_WATERMARK) if watermark is None else watermark
        restored = []
        for side in Side:
            schema = join.rows[side].schema
            name = join.rows[side].name
            for tables in snapshots:
                if schema is None and name in tables:
                    schema = tables[name].schema
            restored.append(
                SideRows.restore(side, join.rows[side].on, schema, snapshots, name, key_groups)[0]
            )
        join.rows = (restored[0], restored[1])
        left_times, right_times = restored[0].times, restored[1].times
        join.next_ready = int(left_times.min()) if len(left_times) else MAX_WATERMARK
        join.next_prune = int(right_times.min()) if len(right_times) else MAX_WATERMARK
        return join


class Versions:
    """The kept versions sorted by (key, time, arrival), their keys coded together with
    those of the left rows ``ready``: what both finding answers and dropping versions
    search."""

    def __init__(self, join: AsofJoin, ready: np.ndarray, versions: np.ndarray) -> None:
        left, right = join.rows
        layout = join.layout
        self.codes = key_codes(
            left.table.select(list(layout.left_on)).take(pa.array(ready, type=pa.int64())),
            layout.left_on,
            right.table.select(list(layout.right_on)).take(pa.array(versions, type=pa.int64())),
            layout.right_on,
        )
        times = right.times[versions]
        self.sortable = _Sortable(self.codes.count, times, left.times[ready])
        order = np.argsort(self.sortable.of(self.codes.right, times), kind="stable")
        self.versions = versions[order]  # (stable: equal times as they came)
        self.times = times[order]
        self.keys = self.codes.right[order]
        self.sorted = self.sortable.of(self.keys, self.times)

    def answers(self, times: np.ndarray) -> np.ndarray:
        """The answer of each ready left row (at ``times``): a right row's index, or ``-1``."""
        answers = np.full(len(times), -1, dtype=np.int64)
        if not len(self.versions):
            return answers
        codes = self.codes
        at = np.searchsorted(self.sorted, self.sortable.of(codes.left, times), side="right") - 1
        found = (at >= 0) & codes.left_valid
        found[found] = self.keys[at[found]] == codes.left[found]
        answers[found] = self.versions[at[found]]
        return answers

    def hidden(self, horizon: int) -> np.ndarray:
        """The versions at or below ``horizon`` that a newer one of their key at or below it
        hides (of each key's versions there, all but the last: they are sorted)."""
        below = self.times <= horizon
        last = np.ones(len(below), dtype=bool)
        last[:-1] = (self.keys[1:] != self.keys[:-1]) | ~below[1:]
        hidden: np.ndarray = self.versions[below & ~last]
        return hidden


class _Sortable:
    """(code, time) pairs as one int64 that sorts as the pairs do: ``code * span + time``
    shifted, when that fits; else the time's rank among all ``times`` in its place."""

    def __init__(self, count: int, *times: np.ndarray) -> None:
        found = [t for t in times if len(t)]
        self.low = min((int(t.min()) for t in found), default=0)
        span = max((int(t.max()) for t in found), default=0) - self.low + 1
        self.ranks: np.ndarray | None = None
        if count * span >= 2**62:  # (ranks: fewer than the rows)
            self.ranks = np.unique(np.concatenate(found))
            span = len(self.ranks)
        self.span = span

    def of(self, codes: np.ndarray, times: np.ndarray) -> np.ndarray:
        ranks = self.ranks
        place = times - self.low if ranks is None else np.searchsorted(ranks, times)
        key: np.ndarray = codes * self.span + place
        return key


_NONE = np.empty(0, dtype=np.int64)


def _valid_keys(batch: pa.RecordBatch, on: tuple[str, ...]) -> np.ndarray | None:
    """Which rows have no null in a key column (``None``: all)."""
    valid = None
    for name in on:
        column = batch.column(name)
        if column.null_count:
            mask = np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False))
            valid = mask if valid is None else valid & mask
    return valid
