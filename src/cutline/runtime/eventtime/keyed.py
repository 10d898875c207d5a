"""The keyed layout of a window operator's windows (every window, aggregation and backend):
per key, its windows in keyed state (``{window start: (accumulator, fired)}``, or for
sessions a sorted tuple of ``(start, end, accumulator, fired)``), and a timer per window in
the operator's :class:`~cutline.runtime.eventtime.timers.WindowTimers` (when it fires, and
when a fired one is dropped).

What a window keeps is keyed state of the operator (checkpointed, restored, and redistributed
by key group with the rest); the timers are registered again from it when the operator opens.
Values in state are never changed in place: every update stores a new one. Built-ins of an
Arrow batch take a vectorized path (windows assigned and grouped with NumPy and Arrow, then
one state update per key and window); ``process`` and ``process_batches`` add a chunk per
key and window (:mod:`~cutline.runtime.eventtime.chunks`); a user's function, the per-record
path.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.aggregations import cut_sessions, group_by_window
from cutline.runtime.eventtime.assigners import Session, assign, end_of, ends_of, starts_of
from cutline.runtime.eventtime.chunks import collect
from cutline.runtime.eventtime.layouts import (
    WINDOWS,
    columns_as_keyed,
    read_session_rows,
    read_windows,
    session_rows_as_windows,
)
from cutline.runtime.eventtime.store import Fired, StoreContext
from cutline.runtime.eventtime.timers import Timer
from cutline.runtime.operators import Batch, rows
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.keygroups import key_group

_GONE = object()


class KeyedWindows:
    """The keyed layout of a window operator's windows (every window, aggregation and
    backend): per key, in keyed state."""

    def __init__(self, context: StoreContext) -> None:
        self.context = context
        self.assigner = context.assigner
        self.aggregation = context.aggregation
        self.lateness = context.lateness
        self.late = context.late
        self.output = context.output
        self.records = context.records
        self.backend = context.backend
        self.table = context.backend.value_table(WINDOWS)
        self.fire_timers = context.timers.to_fire
        """Windows not fired yet, by their last millisecond (namespace: start, end)."""
        self.cleanup_timers = context.timers.to_drop
        """Fired windows kept for late records, by when they are dropped."""
        self._session = isinstance(self.assigner, Session)
        self._restore_windows()

    # ------------------------------------------------------------------ timers

    def _end(self, start: int) -> int:
        assert not isinstance(self.assigner, Session)
        return end_of(self.assigner, start)

    def _restore_windows(self) -> None:
        """The restored windows in the keyed layout, whichever layout wrote them (a checkpoint
        of the memory backend keeps a built-in's windows as columns:
        :mod:`~cutline.runtime.eventtime.layouts`), and their timers."""
        mine, maximum = self.backend.key_groups, self.backend.max_parallelism
        store = self.context.restored.store
        for handle in self.context.restored.handles:
            if store is None:
                break
            start, stop = handle.get("key_groups", (0, 0))
            whole = range(start, stop) == mine
            found: dict[Hashable, Any]
            if self._session:
                rows = read_session_rows(handle, store)
                found = {} if rows is None else dict(session_rows_as_windows(rows))
            else:
                found = dict(columns_as_keyed(read_windows(handle, store)))
            for key, value in found.items():
                if not whole and key_group(key, maximum) not in mine:
                    continue  # rescaled: the keys of my key groups only
                old = self.table.get(key)
                if old is None:
                    self.table[key] = value
                elif self._session:  # (a key is in one old subtask: never, but kept whole)
                    self.table[key] = tuple(sorted((*old, *value)))
                else:
                    self.table[key] = {**old, **value}
        self._rebuild_timers()

    def _rebuild_timers(self) -> None:
        """From the restored windows: each one not fired fires at its end, each fired one is
        dropped after the lateness."""
        for key in list(self.backend.keys(WINDOWS)):
            value = self.table.get(key)
            for start, end, fired in self._windows_of(value):
                self._register(key, start, end, fired)

    def _windows_of(self, value: Any) -> Iterable[tuple[int, int, bool]]:
        if value is None:
            return
        if self._session:
            for start, end, _, fired in value:
                yield start, end, fired
        else:
            for start, (_, fired) in value.items():
                yield start, self._end(start), fired

    def _register(self, key: Hashable, start: int, end: int, fired: bool) -> None:
        if fired:
            self.cleanup_timers.add(self.lateness.cleanup_time(end), key, (start, end))
        else:
            self.fire_timers.add(end - 1, key, (start, end))

    @property
    def open_windows(self) -> int:
        """Windows not fired yet."""
        return len(self.fire_timers)

    def attach(
        self, taken: KeyedSnapshot, checkpoint_id: int, base: int | None, savepoint: bool
    ) -> None:
        """(The windows are keyed state: the backend's snapshot holds them.)"""

    # ------------------------------------------------------------------ records

    def add(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        floors_differ = self.lateness.floors_differ
        if self.aggregation.collects and not self._session and not floors_differ:
            return collect(self.context, self.table, batch, ts)
        if (
            not floors_differ  # (else the per-record path: lateness per key)
            and self.aggregation.builtin
            and isinstance(batch, pa.RecordBatch)
            and isinstance(self.records.key, str)
            and self.records.vectorizable(batch)
        ):
            if self._session:
                return self._sessions_vectorized(batch, ts)
            return self._windows_vectorized(batch, ts)
        return self._per_record(rows(batch), ts)

    def _windows_vectorized(self, batch: pa.RecordBatch, ts: np.ndarray) -> Batch | None:
        assigner = self.assigner
        assert not isinstance(assigner, Session)
        index, starts = assign(assigner, ts)
        ends = ends_of(assigner, starts)
        on_time = self.lateness.on_time(ends)
        self.late.note(batch, index, on_time)
        if not on_time.all():
            index, starts = index[on_time], starts[on_time]
        if not len(index):
            return None
        aggregation, key_column = self.aggregation, self.records.key
        assert isinstance(key_column, str)
        taken = pa.array(index)
        values = None
        if aggregation.takes_values:
            assert aggregation.field is not None
            values = batch.column(aggregation.field).take(taken)
        grouped_keys, grouped_starts, sums, counts = group_by_window(
            batch.column(key_column).take(taken), starts, values, aggregation.kind
        )
        parts: list[Any] = sums.to_pylist()
        if counts is not None:  # mean: (sum, count)
            parts = list(zip(parts, counts.to_pylist(), strict=True))
        keys = grouped_keys.to_pylist()
        group_starts = grouped_starts.tolist()
        # one state update per key: a new dict for it (values in state are never changed)
        changes: dict[Hashable, list[tuple[int, Any]]] = {}
        for key, start, part in zip(keys, group_starts, parts, strict=True):
            changes.setdefault(key, []).append((start, part))
        refired: list[Fired] = []
        table_state = self.table
        combine = aggregation.combine
        for key, updates in changes.items():
            old = table_state.get(key)
            windows = dict(old) if old else {}
            for start, part in updates:
                entry = windows.get(start)
                if entry is None:
                    windows[start] = (part, False)
                    end = end_of(assigner, start)
                    self.fire_timers.add(end - 1, key, (start, end))
                else:
                    acc, fired = entry
                    acc = combine(acc, part)
                    windows[start] = (acc, fired)
                    if fired:  # a late record within the lateness: the window fires again
                        refired.append((key, start, end_of(assigner, start), acc))
            table_state[key] = windows
        return self.output.results(refired) if refired else None

    def _sessions_vectorized(self, batch: pa.RecordBatch, ts: np.ndarray) -> Batch | None:
        assigner = self.assigner
        key_column = self.records.key
        assert isinstance(assigner, Session) and isinstance(key_column, str)
        gap = assigner.gap
        kept = self.late.on_time(batch, ts, self.lateness.on_time(ts + gap))
        if kept is None:
            return None
        batch, ts = kept
        kind = self.aggregation.kind
        values = None
        if self.aggregation.takes_values:
            assert self.aggregation.field is not None
            values = np.asarray(batch.column(self.aggregation.field).to_numpy(zero_copy_only=False))
        keys, firsts, ends, acc, counts = cut_sessions(
            batch.column(key_column), ts, values, kind, gap
        )
        parts: list[Any] = acc.tolist()
        if self.aggregation.mean:  # (sum, count)
            parts = list(zip(parts, counts.tolist(), strict=True))
        refired: list[Fired] = []
        for key, first, end, part in zip(
            keys.to_pylist(), firsts.tolist(), ends.tolist(), parts, strict=True
        ):
            refired += self._merge_session(key, first, end, part)
        return self.output.results(refired) if refired else None

    def _merge_session(self, key: Hashable, start: int, end: int, acc: Any) -> list[Fired]:
        """Add the session ``[start, end)`` with ``acc`` to ``key``'s, merging those it
        overlaps; returns the merged session if it fired already (to fire again)."""
        sessions = self.table.get(key) or ()
        kept = []
        fired = False
        merge = self.aggregation.merge
        for s_start, s_end, s_acc, s_fired in sessions:
            if s_start <= end and start <= s_end:  # overlaps or touches: one session (Flink)
                start, end = min(start, s_start), max(end, s_end)
                acc = merge(s_acc, acc)
                fired = fired or s_fired
                if s_fired:
                    self.cleanup_timers.discard(
                        self.lateness.cleanup_time(s_end), key, (s_start, s_end)
                    )
                else:
                    self.fire_timers.discard(s_end - 1, key, (s_start, s_end))
            else:
                kept.append((s_start, s_end, s_acc, s_fired))
        # a fired session that grew past the watermark fires again when its new end passes
        refire_now = fired and self.lateness.watermark >= end - 1
        if fired and not refire_now:
            fired = False
        kept.append((start, end, acc, fired))
        kept.sort()
        self.table[key] = tuple(kept)
        self._register(key, start, end, fired)
        return [(key, start, end, acc)] if refire_now else []

    def _per_record(self, records: list[Any], ts: np.ndarray) -> Batch | None:
        lateness = self.lateness
        aggregation, get_key = self.aggregation, self.records.get_key
        refired: dict[tuple[Hashable, int], Fired] = {}
        late: list[Any] = []
        for record, stamp in zip(records, ts.tolist(), strict=True):
            try:
                key = get_key(record)
                self.backend.set_current_key(key)  # (checks the key belongs here)
                if self._session:
                    assert isinstance(self.assigner, Session)
                    end = stamp + self.assigner.gap
                    if lateness.is_past(end, lateness.floor(key)):
                        late.append(record)
                        continue
                    acc = aggregation.add(aggregation.create(), record)
                    for hit in self._merge_session(key, stamp, end, acc):
                        refired[(key, hit[1])] = hit
                    continue
                starts = self._starts(stamp)
                windows = dict(self.table.get(key) or {})
                on_time = False
                floor = lateness.floor(key)
                for start in starts:
                    end = self._end(start)
                    if lateness.is_past(end, floor):
                        continue
                    on_time = True
                    entry = windows.get(start)
                    if entry is None:
                        windows[start] = (aggregation.add(aggregation.create(), record), False)
                        self.fire_timers.add(end - 1, key, (start, end))
                    else:
                        acc = aggregation.add(entry[0], record)
                        windows[start] = (acc, entry[1])
                        if entry[1]:
                            refired[(key, start)] = (key, start, end, acc)
                if not on_time:
                    late.append(record)
                    continue
                self.table[key] = windows
            except Exception as exc:
                self.records.fail(record, exc)
        if late:
            self.late.add(late)
        return self.output.results(list(refired.values())) if refired else None

    def _starts(self, stamp: int) -> list[int]:
        assert not isinstance(self.assigner, Session)
        return starts_of(self.assigner, stamp)

    # ------------------------------------------------------------------ firing

    def holds_windows(self) -> bool:
        return bool(len(self.fire_timers))

    def so_far(self) -> Batch | None:
        found: list[Fired] = []
        for key in list(self.backend.keys(WINDOWS)):
            value = self.table.get(key)
            if value is None:
                continue
            if self._session:
                found += [(key, s, e, acc) for s, e, acc, fired in value if not fired]
            else:
                found += [(key, s, self._end(s), a) for s, (a, f) in value.items() if not f]
        return self.output.results(found, final=False) if found else None

    def fire(self, due: Iterable[Timer]) -> Batch | None:
        results: list[Fired] = []
        for _, key, (start, end) in due:
            acc = self._fire(key, start, end)
            if acc is not _GONE:
                results.append((key, start, end, acc))
        return self.output.results(results) if results else None

    def drop(self, due: Iterable[Timer]) -> None:
        for _, key, (start, _end) in due:
            self._drop(key, start)

    def _fire(self, key: Hashable, start: int, end: int) -> Any:
        """Window ``[start, end)`` of ``key`` fires: its accumulator (dropped from state, or
        marked fired and kept for the lateness)."""
        value = self.table.get(key)
        keep = self.lateness.keeps_fired
        if self.context.early is not None:
            self.context.early.forget(key, start, end)
        if self._session:
            sessions = list(value or ())
            for i, (s_start, s_end, acc, _) in enumerate(sessions):
                if s_start == start and s_end == end:
                    if keep:
                        sessions[i] = (s_start, s_end, acc, True)
                        self.cleanup_timers.add(self.lateness.cleanup_time(end), key, (start, end))
                    else:
                        del sessions[i]
                    self._store(key, tuple(sessions))
                    return acc
            return _GONE
        windows = dict(value or {})
        entry = windows.get(start)
        if entry is None:
            return _GONE
        if keep:
            windows[start] = (entry[0], True)
            self.cleanup_timers.add(self.lateness.cleanup_time(end), key, (start, end))
        else:
            del windows[start]
        self._store(key, windows)
        return entry[0]

    def _drop(self, key: Hashable, start: int) -> None:
        value = self.table.get(key)
        if value is None:
            return
        if self._session:
            self._store(key, tuple(s for s in value if s[0] != start or not s[3]))
        else:
            windows = dict(value)
            windows.pop(start, None)
            self._store(key, windows)

    def _store(self, key: Hashable, value: Any) -> None:
        if value:
            self.table[key] = value
        else:
            self.table.delete(key)
