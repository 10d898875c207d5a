"""Sliding windows kept as slices (:mod:`.slicing`), whatever a slice holds: what
:class:`~cutline.runtime.eventtime.sliced_windows.SlicedWindows` (slices of columns, the
memory backend's) and :class:`~cutline.runtime.eventtime.sliced_runs.SlicedRuns` (slices of
runs, the disk backend's) do alike: which windows a new slice schedules, when a slice is
dropped, what a window holds (its own parts and its slices'), how windows fire, fire again
within the lateness, and are counted."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.eventtime.assigners import Sliding, starts_of
from cutline.runtime.eventtime.columnar_windows import WindowsByStart
from cutline.runtime.eventtime.lateness import cleanup_time, in_time, is_past
from cutline.runtime.eventtime.operator import WindowOperator
from cutline.runtime.eventtime.slicing import (
    Part,
    distinct_keys,
    last_window_of,
    restrict,
    slice_width,
    slices_in,
    slices_of,
    window_result,
)
from cutline.runtime.eventtime.timers import Timer
from cutline.runtime.operators import Batch, rows

Fired = list[tuple[int, pa.Array, np.ndarray]]
"""Windows firing: per window its start, its keys and their results."""


class SlidingBySlices(WindowsByStart):
    """Sliding windows of a built-in kept as **slices** of ``gcd(size, slide)`` ms: a record
    goes into one slice, whatever the number of windows it is in, and a window's result is the
    merge of its slices' (and of what it holds itself) when it fires.

    A window holds parts of its own (in ``windows``, as a tumbling window's) only for what a
    restore gave it whole (a checkpoint holds the live windows whole:
    :func:`~cutline.runtime.eventtime.layouts.read_windows`) or what came while keys kept a
    restored watermark, and, once fired and kept for the lateness, its ``fired`` flag. A
    slice is dropped when the last window that holds it is past. A record within the lateness
    of a fired window makes the window fire again for the record's key (its result over every
    slice). The first checkpoint after a restore is a full one (the restored chain held
    slices; this store holds those windows whole).

    A store mixes it in before its tumbling layout (a :class:`WindowsByStart`), which keeps
    the windows' own parts; it says what a slice or window holds (:meth:`_own_parts`,
    :meth:`_slice_parts`), how a fired one without parts is kept (:meth:`_empty`), dropped
    (:meth:`_drop`, :meth:`_drop_slice`) and how records go into slices
    (:meth:`_into_slices`)."""

    _adopts = False

    def _slicing(self, op: WindowOperator) -> None:
        """Set up the slices (before the tumbling layout restores the windows)."""
        assert isinstance(op.assigner, Sliding)
        self.sliding = op.assigner
        self.width = slice_width(op.assigner)
        """How long a slice is (ms)."""
        self.slices: dict[int, Any] = {}
        """What each slice holds, by its start."""
        self._scheduled: set[int] = set()
        """The windows with a timer to fire (each once): those not fired yet."""
        self.slice_timers = op.timers.parts
        """When each slice is dropped (its last window past), beside the windows' timers."""

    # ------------------------------------------------------------------ hooks

    def _own_parts(self, own: Any) -> list[Part]:
        """The parts a window holds itself."""
        raise NotImplementedError

    def _own_keys(self, own: Any) -> list[pa.Array]:
        """The keys of the parts a window holds itself."""
        return [part[0] for part in self._own_parts(own)]

    def _slice_parts(self, piece: Any) -> list[Part]:
        """The parts a slice holds."""
        raise NotImplementedError

    def _waiting(self, own: Any) -> pa.Array | None:
        """The keys a window restored fired for some keys has not fired for (``None``:
        none)."""
        raise NotImplementedError

    def _empty(self, window: int, result: tuple[pa.Array, Any] | None) -> Any:
        """A window without parts of its own (it fired, and keeps the flag)."""
        raise NotImplementedError

    def _drop_slice(self, start: int) -> None:
        raise NotImplementedError

    def _into_slices(self, keys: pa.Array, starts: np.ndarray, values: Any) -> list[Any]:
        """(key, slice start, value) triples into the slices; per slice a record went into,
        the keys that came (a slice new here is given to :meth:`_add_slice`)."""
        raise NotImplementedError

    def _into_windows(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        """Records into the windows themselves (the tumbling layout's ``add``)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- windows

    def _schedule(self, window: int) -> None:
        """The window fires when the watermark reaches its last millisecond (once)."""
        if window not in self._scheduled:
            self._scheduled.add(window)
            super()._schedule(window)

    def _add_slice(self, piece: Any) -> None:
        """A new slice: its windows that are not past nor fired fire at their ends; it is
        dropped when the last of them is past."""
        self.slices[piece.start] = piece
        sliding, watermark = self.sliding, self.op.watermark
        for window in starts_of(sliding, piece.start):
            own = self.windows.get(window)
            past = is_past(window + sliding.size, self.lateness, watermark)
            if not past and (own is None or not own.fired):
                self._schedule(window)
        last = last_window_of(sliding, piece.start) + sliding.size
        self.slice_timers.add(cleanup_time(last, self.lateness), None, piece.start)

    def _parts(self, window: int, keys: pa.Array | None = None) -> list[Part]:
        """What the window holds: its own parts and its slices' (of ``keys`` only)."""
        own = self.windows.get(window)
        found = [] if own is None else self._own_parts(own)
        for start in slices_in(self.sliding, window):
            piece = self.slices.get(start)
            if piece is not None:
                found += self._slice_parts(piece)
        if keys is not None:
            found = [restrict(part, keys) for part in found]
        return found

    def _result(self, window: int, keys: pa.Array | None = None) -> tuple[pa.Array, Any] | None:
        """The window's result per key (of ``keys`` only); ``None``: it holds none."""
        return window_result(self._parts(window, keys), self.aggregation.kind)

    @property
    def open_windows(self) -> int:
        """The keys of each window not fired yet, added up (exact up to
        :data:`~cutline.runtime.eventtime.slicing.COUNTED` keys in all its parts). Read from
        the thread that reports the figures: it copies what it reads first."""
        scheduled, held, slices = list(self._scheduled), dict(self.windows), dict(self.slices)
        found: list[list[pa.Array]] = []
        for window in scheduled:
            own = held.get(window)
            if own is not None and own.fired:  # (fired for some keys: the others wait)
                waiting = self._waiting(own)
                found.append([] if waiting is None else [waiting])
                continue
            keys = [] if own is None else self._own_keys(own)
            for start in slices_in(self.sliding, window):
                if start in slices:
                    keys += [part[0] for part in self._slice_parts(slices[start])]
            found.append(keys)
        return distinct_keys(found)

    # ---------------------------------------------------------------- records

    def add(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        if self.op.floors_differ:  # (keys keeping a restored watermark: into the windows
            return self._into_windows(batch, ts)  # themselves, each key's lateness apart)
        found = slice_triples(self.op, self.sliding, batch, ts)
        if found is None:
            return None
        again: dict[int, list[pa.Array]] = {}
        for start, keys in self._into_slices(*found):
            for window in starts_of(self.sliding, start):
                own = self.windows.get(window)
                if own is not None and own.fired:
                    again.setdefault(window, []).append(keys)
        fired: Fired = []
        for window, keys in sorted(again.items()):
            first = keys[0].type
            these = pc.unique(pa.concat_arrays([k.cast(first) for k in keys]))
            waiting = self._waiting(self.windows[window])
            if waiting is not None:  # (those fire when the watermark passes its end)
                these = these.filter(pc.invert(pc.is_in(these, value_set=waiting.cast(first))))
            result = self._result(window, these)
            if result is not None:
                fired.append((window, *result))
        return self._batch(fired) if fired else None

    # ----------------------------------------------------------------- firing

    def holds_windows(self) -> bool:
        return bool(self._scheduled)

    def so_far(self) -> Batch | None:
        found: Fired = []
        for window in sorted(self._scheduled):
            own = self.windows.get(window)
            result = None if own is not None and own.fired else self._result(window)
            if result is not None:
                found.append((window, *result))
        return self._batch(found, final=False) if found else None

    def fire(self, due: Iterable[Timer]) -> Batch | None:
        fired: Fired = []
        keep = self.op.keeps_fired
        for _, _, window in due:
            self._scheduled.discard(window)
            own = self.windows.get(window)
            if own is not None and own.fired:  # (restored fired for some keys)
                waiting = self._waiting(own)
                if waiting is not None:
                    own.waiting = None
                    result = self._result(window, waiting)
                    if result is not None:
                        fired.append((window, *result))
                continue
            result = self._result(window)
            if result is not None:
                fired.append((window, *result))
            if not keep:
                self._drop(window)
                continue
            if own is None:  # (it keeps its fired flag)
                own = self.windows[window] = self._empty(window, result)
            own.fired = True
            self._keep(window)
        return self._batch(fired) if fired else None

    def drop(self, due: Iterable[Timer]) -> None:
        """The fired windows past, and then the slices whose last window is past."""
        super().drop(due)
        for _, _, start in self.slice_timers.pop_due(self.op.watermark):
            self._drop_slice(start)


def slice_triples(
    op: WindowOperator, sliding: Sliding, batch: Batch, ts: np.ndarray
) -> tuple[pa.Array, np.ndarray, Any] | None:
    """A batch's records as (key, slice start, value) columns, each record once, in its
    slice, unless its last window is past (then late: to the side output). Arrow batches of a
    key column take the vectorized path, Python records or nulls the per-record one. ``None``:
    nothing is left."""
    lateness = op.lateness
    if not isinstance(batch, pa.RecordBatch) or not op.vectorizable(batch):

        def own(key: Hashable, stamp: int) -> list[int]:
            last = last_window_of(sliding, stamp) + sliding.size
            if is_past(last, lateness, op.floor(key)):
                return []
            return [int(slices_of(sliding, np.array([stamp]))[0])]

        return op.record_columns(rows(batch), ts, own)
    assert isinstance(op.key, str)
    on_time = in_time(last_window_of(sliding, ts) + sliding.size, lateness, op.watermark)
    op.note_late(batch, np.arange(len(ts)), on_time)
    if not on_time.all():
        batch, ts = batch.filter(pa.array(on_time)), ts[on_time]
    if not len(ts):
        return None
    values = None
    if op.aggregation.takes_values:
        assert op.aggregation.field is not None
        values = batch.column(op.aggregation.field)
    return batch.column(op.key), slices_of(sliding, ts), values
