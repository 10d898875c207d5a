"""Sliding windows of a built-in in the columnar layout, by slicing (:mod:`.slicing`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.eventtime.assigners import Sliding, starts_of
from cutline.runtime.eventtime.columnar_windows import ColumnarWindows, WindowColumns, frozen
from cutline.runtime.eventtime.lateness import cleanup_time, in_time, is_past
from cutline.runtime.eventtime.layouts import Slicing, encode_windows
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


class SlicedWindows(ColumnarWindows):
    """Sliding windows computing a built-in aggregate on the memory backend, by slicing: a
    batch's records are grouped by key and **slice** (``gcd(size, slide)`` ms) and merged into
    that slice's columns, once each, whatever the number of windows a record is in; when a
    window fires, its slices merge per key (and with what the window kept itself).

    A window keeps columns of its own (a :class:`WindowColumns` in ``windows``, as the tumbling
    layout's) only for what a restore gave it whole (a checkpoint holds the live windows
    whole: :func:`~cutline.runtime.eventtime.layouts.read_windows`) or what came while keys
    kept a restored watermark, and, once fired and kept for the lateness, its ``fired`` flag.
    A slice is dropped when the last window that holds it is past.

    A record within the lateness of a fired window makes the window fire again for the
    record's key (its result over every slice). The first checkpoint after a restore is a
    full one (the restored chain held slices; this operator holds those windows whole)."""

    _adopts = False

    def __init__(self, op: WindowOperator) -> None:
        assert isinstance(op.assigner, Sliding)
        self.sliding = op.assigner
        self.width = slice_width(op.assigner)
        """How long a slice is (ms)."""
        self.slices: dict[int, WindowColumns] = {}
        """The records' accumulators per slice start, as columns."""
        self._scheduled: set[int] = set()
        """The windows with a timer to fire (each once): those not fired yet."""
        self.slice_timers = op.timers.parts
        """When each slice is dropped (its last window past), beside the windows' timers."""
        super().__init__(op)

    def _schedule(self, window: int) -> None:
        if window not in self._scheduled:
            self._scheduled.add(window)
            super()._schedule(window)

    # ---------------------------------------------------------------- figures

    @property
    def open_windows(self) -> int:
        """The keys of each window not fired yet, added up: exact while the windows' slices
        hold at most :data:`COUNTED` keys in all, else at least (each window's largest part:
        counting the keys of windows of millions would cost as much as merging them). Read
        from the thread that reports the figures: it copies what it reads first."""
        scheduled, held, slices = list(self._scheduled), dict(self.windows), dict(self.slices)
        found: list[list[pa.Array]] = []
        for window in scheduled:
            columns = held.get(window)
            if columns is not None and columns.fired:  # (fired for some keys: the others wait)
                waiting = columns.waiting
                found.append([] if waiting is None else [columns.keys.take(pa.array(waiting))])
                continue
            own = [] if columns is None else [columns.keys]
            found.append(
                own + [slices[s].keys for s in slices_in(self.sliding, window) if s in slices]
            )
        return distinct_keys(found)

    def _frozen(self) -> Callable[[int | None], bytes]:
        held, slices = frozen(self.windows.values()), frozen(self.slices.values())
        slicing = Slicing(
            self.sliding,
            self.aggregation.kind,
            tuple(sorted(self._scheduled | set(self.windows))),
        )
        return lambda since: encode_windows(held, since, slices, slicing)

    # ---------------------------------------------------------------- records

    def add(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        sliding, op = self.sliding, self.op
        if op.floors_differ:  # (keys keeping a restored watermark: into the windows
            return super().add(batch, ts)  # themselves, each key's lateness apart)
        if not isinstance(batch, pa.RecordBatch) or not op.vectorizable(batch):

            def own(key: Hashable, stamp: int) -> list[int]:
                last = last_window_of(sliding, stamp) + sliding.size
                if is_past(last, self.lateness, op.floor(key)):
                    return []
                return [int(slices_of(sliding, np.array([stamp]))[0])]

            found = op.record_columns(rows(batch), ts, own)
            return None if found is None else self._merge_slices(*found)
        assert isinstance(op.key, str)
        on_time = in_time(last_window_of(sliding, ts) + sliding.size, self.lateness, op.watermark)
        op.note_late(batch, np.arange(len(ts)), on_time)
        if not on_time.all():
            batch, ts = batch.filter(pa.array(on_time)), ts[on_time]
        if not len(ts):
            return None
        values = None
        if self.aggregation.takes_values:
            assert self.aggregation.field is not None
            values = batch.column(self.aggregation.field)
        return self._merge_slices(batch.column(op.key), slices_of(sliding, ts), values)

    def _merge_slices(self, keys: pa.Array, starts: np.ndarray, values: Any) -> Batch | None:
        """Merge (key, slice start, value) triples into the slices; the fired windows kept
        for the lateness that they update fire again for their keys."""
        again: dict[int, list[pa.Array]] = {}
        for piece, these, _ in self._grouped_into(
            self.slices, self._add_slice, keys, starts, values
        ):
            for window in starts_of(self.sliding, piece.start):
                columns = self.windows.get(window)
                if columns is not None and columns.fired:
                    again.setdefault(window, []).append(these)
        fired = []
        for window, found in sorted(again.items()):
            columns = self.windows[window]
            first = found[0].type
            these = pc.unique(pa.concat_arrays([k.cast(first) for k in found]))
            if columns.waiting is not None:  # (those fire when the watermark passes its end)
                waiting = columns.keys.take(pa.array(columns.waiting)).cast(these.type)
                these = these.filter(pc.invert(pc.is_in(these, value_set=waiting)))
            result = self._result(window, these)
            if result is not None:
                fired.append((window, *result))
        return self._batch(fired) if fired else None

    def _add_slice(self, piece: WindowColumns) -> None:
        """A new slice: its windows that are not past nor fired fire at their ends; it is
        dropped when the last of them is past."""
        self.slices[piece.start] = piece
        sliding, watermark = self.sliding, self.op.watermark
        for window in starts_of(sliding, piece.start):
            columns = self.windows.get(window)
            past = is_past(window + sliding.size, self.lateness, watermark)
            if not past and (columns is None or not columns.fired):
                self._schedule(window)
        last = last_window_of(sliding, piece.start) + sliding.size
        self.slice_timers.add(cleanup_time(last, self.lateness), None, piece.start)

    def _parts(self, window: int, keys: pa.Array | None = None) -> list[Part]:
        """What the window holds: its own columns and its slices' (of ``keys`` only)."""
        found: list[Part] = []
        columns = self.windows.get(window)
        if columns is not None and len(columns.keys):
            found.append((columns.keys, columns.acc, columns.count))
        for start in slices_in(self.sliding, window):
            piece = self.slices.get(start)
            if piece is not None:
                found.append((piece.keys, piece.acc, piece.count))
        if keys is not None:
            found = [restrict(part, keys) for part in found]
        return found

    def _result(self, window: int, keys: pa.Array | None = None) -> tuple[pa.Array, Any] | None:
        """The window's result per key (of ``keys`` only); ``None``: it holds none."""
        return window_result(self._parts(window, keys), self.aggregation.kind)

    # ----------------------------------------------------------------- firing

    def holds_windows(self) -> bool:
        return bool(self._scheduled)

    def so_far(self) -> Batch | None:
        found = []
        for window in sorted(self._scheduled):
            columns = self.windows.get(window)
            if columns is not None and columns.fired:
                continue
            result = self._result(window)
            if result is not None:
                found.append((window, *result))
        return self._batch(found, final=False) if found else None

    def fire(self, due: Iterable[Timer]) -> Batch | None:
        fired: list[tuple[int, pa.Array, np.ndarray]] = []
        keep = self.op.keeps_fired
        for _, _, window in due:
            self._scheduled.discard(window)
            columns = self.windows.get(window)
            if columns is not None and columns.fired:  # (restored fired for some keys)
                if columns.waiting is not None:
                    waiting, columns.waiting = columns.keys.take(pa.array(columns.waiting)), None
                    result = self._result(window, waiting)
                    if result is not None:
                        fired.append((window, *result))
                continue
            result = self._result(window)
            if result is not None:
                fired.append((window, *result))
            if not keep:
                self.windows.pop(window, None)
                continue
            if columns is None:  # (it keeps its fired flag)
                columns = self._empty(window, result)
                self.windows[window] = columns
            columns.fired = True
            self._keep(window)
        return self._batch(fired) if fired else None

    def drop(self, due: Iterable[Timer]) -> None:
        """The fired windows past, and then the slices whose last window is past."""
        super().drop(due)
        for _, _, start in self.slice_timers.pop_due(self.op.watermark):
            self.slices.pop(start, None)

    def _empty(self, window: int, result: tuple[pa.Array, Any] | None) -> WindowColumns:
        """A window without columns of its own (it fired, and keeps the flag)."""
        keys = result[0].slice(0, 0) if result is not None else pa.array([], pa.null())
        mean = self.aggregation.mean
        return WindowColumns(
            window,
            keys,
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64) if mean else None,
            version=np.zeros(0, dtype=np.int64),
            born=self.chain.generation,
        )
