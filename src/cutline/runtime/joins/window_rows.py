"""Which windows a window join's kept rows are in, and which fire: tumbling and sliding
windows by slices (:class:`SliceRows`), sessions of both sides' rows (:class:`SessionRows`).
What a firing hands the join is the same for both (:class:`Fired`). The rules they keep
are :mod:`cutline.runtime.joins.window`'s."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling, assign, ends_of
from cutline.runtime.eventtime.slicing import last_window_of, slices_of
from cutline.runtime.joins.keycodes import KeyCodes, key_codes
from cutline.runtime.joins.output import JoinLayout, Side
from cutline.runtime.joins.rows import Growing, SideRows


@dataclass(frozen=True)
class Fired:
    """The rows of the windows that fire, each once per window it is in: per side the row
    indices, the group of each (equal within a window where the keys are; ``-1``: it pairs
    with nothing, a null in its key) and the window's number; and per window number its
    start and end."""

    left: np.ndarray
    left_groups: np.ndarray
    left_windows: np.ndarray
    right: np.ndarray
    right_groups: np.ndarray
    right_windows: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


def _codes(layout: JoinLayout, rows: tuple[SideRows, SideRows], at: list[np.ndarray]) -> KeyCodes:
    """The key codes of the rows at ``at`` (per side)."""
    return key_codes(
        _keys(rows[0], layout.left_on, rows[1], layout.right_on, at[0]),
        layout.left_on,
        _keys(rows[1], layout.right_on, rows[0], layout.left_on, at[1]),
        layout.right_on,
    )


def _keys(
    kept: SideRows, on: tuple[str, ...], other: SideRows, other_on: tuple[str, ...], at: np.ndarray
) -> pa.Table:
    """The key columns of ``kept``'s rows at ``at``; of none, typed as ``other``'s, if its
    side's columns are not known (no row of it came)."""
    if kept.schema is not None:
        return kept.table.select(list(on)).take(pa.array(at, type=pa.int64()))
    assert not len(at) and other.schema is not None
    return pa.table(
        {
            name: pa.array([], type=other.schema.field(theirs).type)
            for name, theirs in zip(on, other_on, strict=True)
        }
    )


class SliceRows:
    """Tumbling or sliding windows' rows, kept in slices (a tumbling window is its one
    slice): per slice start, the indices of each side's rows in it. A window that fires
    gathers its slices' rows that had not seen it fire (each row's *floor*: the watermark at
    or below which its windows' last milliseconds had fired without it, the one of the
    subtask it was restored from); a slice is dropped once the last window holding it
    fired."""

    def __init__(
        self, assigner: Tumbling | Sliding, layout: JoinLayout, rows: tuple[SideRows, SideRows]
    ) -> None:
        self.assigner = assigner
        self.layout = layout
        self.rows = rows
        self.slices: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self.floors = (Growing(np.int64), Growing(np.int64))
        self.next_fire = MAX_WATERMARK
        """At or below the last millisecond of the earliest window to fire (a look finds it)."""

    def _slices_of(self, times: np.ndarray) -> np.ndarray:
        if isinstance(self.assigner, Tumbling):
            return assign(self.assigner, times)[1]
        return slices_of(self.assigner, times)

    def _last_ends(self, slices: np.ndarray) -> np.ndarray:
        """Where the last window holding each slice ends."""
        if isinstance(self.assigner, Tumbling):
            return ends_of(self.assigner, slices)
        ends: np.ndarray = last_window_of(self.assigner, slices) + self.assigner.size
        return ends

    def _windows_of(self, slices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The windows holding any of ``slices`` (sorted starts): their starts and ends,
        sorted."""
        assigner = self.assigner
        if isinstance(assigner, Tumbling):
            return slices, ends_of(assigner, slices)
        count = math.ceil(assigner.size / assigner.every)
        last = last_window_of(assigner, slices)
        starts = last[:, None] - assigner.every * np.arange(count, dtype=np.int64)[None, :]
        starts = np.unique(starts[starts + assigner.size > slices[:, None]])
        return starts, starts + assigner.size

    def late(self, times: np.ndarray, watermark: int) -> np.ndarray:
        late: np.ndarray = self._last_ends(self._slices_of(times)) - 1 <= watermark
        return late

    def place(
        self, side: Side, first: int, times: np.ndarray, floors: np.ndarray, watermark: int
    ) -> None:
        """Put rows ``first, first + 1...`` of ``side`` (at ``times``, their floors
        ``floors``) into their slices."""
        self.floors[side].extend(floors)
        if not len(times):
            return
        slices = self._slices_of(times)
        order = np.argsort(slices, kind="stable")
        ordered = slices[order]
        at = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        bounds = [*at.tolist(), len(order)]
        for i, start in enumerate(ordered[at].tolist()):
            parts = self.slices.setdefault(start, ([], []))
            parts[side].append(order[bounds[i] : bounds[i + 1]] + first)
        _, ends = self._windows_of(ordered[at])
        open_ = ends[ends - 1 > watermark]
        if len(open_):
            self.next_fire = min(self.next_fire, int(open_.min()) - 1)

    def fire(self, previous: int, watermark: int) -> Fired | None:
        """The windows whose last millisecond is above ``previous`` and at or below
        ``watermark``, and their rows."""
        if watermark < self.next_fire or not self.slices:
            return None
        live = np.array(sorted(self.slices), dtype=np.int64)
        starts, ends = self._windows_of(live)
        firing = (ends - 1 > previous) & (ends - 1 <= watermark)
        later = ends[ends - 1 > watermark]
        self.next_fire = int(later.min()) - 1 if len(later) else MAX_WATERMARK
        if not firing.any():
            return None
        starts, ends = starts[firing], ends[firing]
        low = int(np.searchsorted(live, starts[0]))
        high = int(np.searchsorted(live, ends[-1]))
        gathered = []
        for side in Side:  # the slices' rows in order, and where each slice's begin
            parts = [
                np.concatenate(self.slices[s][side] or [_NONE]) for s in live[low:high].tolist()
            ]
            bounds = np.cumsum([0, *(len(p) for p in parts)])
            gathered.append((np.concatenate(parts or [_NONE]), bounds))
        at: list[list[np.ndarray]] = [[], []]
        numbers: list[list[np.ndarray]] = [[], []]
        first = np.searchsorted(live, starts) - low
        last = np.searchsorted(live, ends) - low
        for j in range(len(starts)):
            for side in Side:
                kept, bounds = gathered[side]
                mine = kept[bounds[first[j]] : bounds[last[j]]]
                mine = mine[self.floors[side].view[mine] < ends[j] - 1]
                at[side].append(mine)
                numbers[side].append(np.full(len(mine), j, dtype=np.int64))
        rows = [np.concatenate(a) if a else _NONE for a in at]
        windows = [np.concatenate(n) if n else _NONE for n in numbers]
        codes = _codes(self.layout, self.rows, rows)
        groups = [
            np.where(codes.left_valid, windows[0] * codes.count + codes.left, -1),
            np.where(codes.right_valid, windows[1] * codes.count + codes.right, -1),
        ]
        return Fired(rows[0], groups[0], windows[0], rows[1], groups[1], windows[1], starts, ends)

    def release(self, watermark: int) -> None:
        """Drop the slices (and their rows) whose last window fired."""
        live = np.array(sorted(self.slices), dtype=np.int64)
        if not len(live):
            return
        past = live[self._last_ends(live) - 1 <= watermark]
        for start in past.tolist():
            parts = self.slices.pop(start)
            for side in Side:
                if parts[side]:
                    self.rows[side].drop(np.concatenate(parts[side]))
        self.compact()

    def compact(self, force: bool = False) -> None:
        """Take the dropped rows out of each side (when due, or ``force``), renumbering the
        slices' rows."""
        for side in Side:
            mapping = self.rows[side].compact(force)
            if mapping is None:
                continue
            floors = self.floors[side]
            floors.reset(floors.view[mapping >= 0])
            for parts in self.slices.values():
                parts[side][:] = [mapping[p] for p in parts[side]]


class SessionRows:
    """Sessions of both sides' rows per key: the rows alone are kept; when the watermark
    reaches the earliest session's last millisecond, every kept row is cut into sessions
    afresh and those whose last millisecond the watermark reached fire (their rows then
    dropped)."""

    def __init__(
        self, assigner: Session, layout: JoinLayout, rows: tuple[SideRows, SideRows]
    ) -> None:
        self.gap: int = assigner.gap
        self.layout = layout
        self.rows = rows
        self.next_fire = MAX_WATERMARK
        """At or below the last millisecond of the earliest session (a look finds it)."""
        self._fired: tuple[np.ndarray, np.ndarray] | None = None

    def late(self, times: np.ndarray, watermark: int) -> np.ndarray:
        late: np.ndarray = times + self.gap - 1 <= watermark
        return late

    def place(
        self, side: Side, first: int, times: np.ndarray, floors: np.ndarray, watermark: int
    ) -> None:
        """Rows came: a session ends no earlier than a row's time plus the gap."""
        if len(times):
            self.next_fire = min(self.next_fire, int(times.min()) + self.gap - 1)

    def fire(self, previous: int, watermark: int) -> Fired | None:
        """The sessions whose last millisecond is at or below ``watermark``, and their rows."""
        if watermark < self.next_fire:
            return None
        left, right = (kept.alive_rows() for kept in self.rows)
        n = len(left)
        codes = _codes(self.layout, self.rows, [left, right])
        code = np.concatenate([codes.left, codes.right])
        times = np.concatenate([self.rows[0].times[left], self.rows[1].times[right]])
        order = np.lexsort((times, code))
        code, times = code[order], times[order]
        new = np.ones(len(order), dtype=bool)
        new[1:] = (code[1:] != code[:-1]) | (times[1:] - times[:-1] > self.gap)
        at = np.flatnonzero(new)
        if not len(at):
            self.next_fire = MAX_WATERMARK
            return None
        ends = np.maximum.reduceat(times, at) + self.gap
        due = ends - 1 <= watermark
        self.next_fire = int(ends[~due].min()) - 1 if not due.all() else MAX_WATERMARK
        if not due.any():
            return None
        session = np.empty(len(order), dtype=np.int64)
        session[order] = np.cumsum(new) - 1
        number = np.cumsum(due) - 1  # (the fired sessions numbered from 0)
        fires = due[session]
        sides = []
        for rows, part, valid in (
            (left, slice(0, n), codes.left_valid),
            (right, slice(n, None), codes.right_valid),
        ):
            mine = fires[part]
            windows = number[session[part][mine]]
            sides.append((rows[mine], np.where(valid[mine], windows, -1), windows))
        self._fired = (sides[0][0], sides[1][0])
        return Fired(*sides[0], *sides[1], times[at][due], ends[due])

    def release(self, watermark: int) -> None:
        """Drop the rows of the sessions that fired."""
        if self._fired is not None:
            for side in Side:
                self.rows[side].drop(self._fired[side])
            self._fired = None
        if watermark == MAX_WATERMARK:
            assert not any(kept.count for kept in self.rows)
        self.compact()

    def compact(self, force: bool = False) -> None:
        for kept in self.rows:
            kept.compact(force)


_NONE = np.empty(0, dtype=np.int64)
