"""The window operator in the keyed layout: per key, its windows in keyed state
(``{window start: (accumulator, fired)}``, or for sessions a sorted tuple of ``(start, end,
accumulator, fired)``), a timer per window (when it fires, and when a fired one is dropped).

A window **fires** when the watermark reaches its last millisecond (``window_end - 1``): its
result is emitted with ``window_start`` and ``window_end`` (in the type of the event-time
column) and carries event time ``window_end - 1`` downstream, so a second window regroups
results (Flink's rules). Late records (:mod:`~cutline.runtime.eventtime.lateness`) within the
lateness update their window, which fires again with the new result; later ones go to the
**side output** ``"late"`` (``.late()``), as they came in, and are counted; a job that does
not read ``.late()`` only counts them (nothing keeps them).

What a window keeps is keyed state of the operator (checkpointed, restored, and redistributed
by key group with the rest); the timers are rebuilt from it when the operator opens. Values
in state are never changed in place: every update stores a new one. Built-ins of a Arrow
batch take a vectorized path (windows assigned and grouped with NumPy and Arrow, then one
state update per key and window); a user's function, the per-record path.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MAX_WATERMARK, MIN_WATERMARK
from cutline.runtime.eventtime.aggregations import cut_sessions, group_by_window, number
from cutline.runtime.eventtime.assign import without_time
from cutline.runtime.eventtime.assigners import Session, assign, end_of, ends_of, starts_of
from cutline.runtime.eventtime.chunks import collect
from cutline.runtime.eventtime.early import EarlyRecords
from cutline.runtime.eventtime.lateness import cleanup_time, in_time, is_past
from cutline.runtime.eventtime.layouts import (
    WINDOWS,
    panes_as_windows,
    read_panes,
    read_session_rows,
    session_rows_as_windows,
)
from cutline.runtime.eventtime.output import LATE, builtin_batch, window_results
from cutline.runtime.eventtime.spec import WindowSpec
from cutline.runtime.eventtime.timestamps import EventTimeError
from cutline.runtime.keyed_operators import _Keyed
from cutline.runtime.operators import Batch, OperatorContext, RecordError, rows
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.keygroups import key_group, key_groups

_GONE = object()


class WindowOperator(_Keyed):
    """The running window operator of one subtask."""

    def __init__(self, logic: WindowSpec, ctx: OperatorContext, state: Any) -> None:
        super().__init__(ctx, state, logic.key)
        self.logic = logic
        self.assigner = logic.assigner
        self.aggregation = logic.aggregation
        self.event_time = logic.event_time
        self.lateness = logic.allowed_lateness
        self.table = self.backend.value_table(WINDOWS)
        self.watermark = MIN_WATERMARK
        self.fire_timers = self.backend.timer_index("window-fire")
        """Windows not fired yet, by their last millisecond (namespace: start, end)."""
        self.cleanup_timers = self.backend.timer_index("window-clean")
        """Fired windows kept for late records, by when they are dropped."""
        self.late_records = 0
        """Records too late for their windows (sent to the side output ``late``), since the
        job started: a restore carries them (each old subtask's to the one subtask that now
        owns its first key group, so that a rescaled restore counts each once)."""
        self._late: list[Batch] = []
        """The late records not yet taken by the side output; only kept when the job reads
        it (``.late()``): otherwise they are counted and let go."""
        self._keeps_late = LATE in ctx.side_outputs
        self._next_early = 0
        """When the open windows' results so far are due next (processing time, ms)."""
        self.early_records = (
            None if logic.early_records is None else EarlyRecords(self, logic.early_records)
        )
        """The counts of ``early_records``: which windows took another N records."""
        self._session = isinstance(self.assigner, Session)
        self.processing = logic.time == "processing"
        self._time_type = self.event_time.type
        """The event-time column's type (learned from the records when the job could not
        know it: after ``assign_timestamps``): window_start and window_end come back in it."""
        # The watermark it had reached at the restored checkpoint: a window that fired then
        # must not open again for a record that was late then (it would be published twice).
        # Restored at another parallelism, each key keeps the watermark of the subtask it was
        # in, until the watermark passes them all.
        mine = self.backend.key_groups
        self._marks: list[tuple[range, int]] = []
        for handle in self.restored:
            start, stop = handle.get("key_groups", (0, 0))
            if start in mine:
                self.late_records += int(handle.get("late", 0))
            groups = range(max(start, mine.start), min(stop, mine.stop))
            if len(groups) and "watermark" in handle:
                self._marks.append((groups, int(handle["watermark"])))
                if self._time_type is None and handle.get("time_type") is not None:
                    self._time_type = handle["time_type"]
        if self._marks:
            self.watermark = min(m for _, m in self._marks)
        self._ceiling = max((m for _, m in self._marks), default=MIN_WATERMARK)
        self._restore_windows()

    # ------------------------------------------------------------------ timers

    def _end(self, start: int) -> int:
        assert not isinstance(self.assigner, Session)
        return end_of(self.assigner, start)

    def _restore_windows(self) -> None:
        """The restored windows in the keyed layout, whichever layout wrote them (a checkpoint
        of the memory backend keeps a built-in's windows as columns:
        :mod:`~cutline.runtime.eventtime.layouts`), and their timers. The last step of opening:
        the columnar operators restore into their own layout instead."""
        mine, maximum = self.backend.key_groups, self.backend.max_parallelism
        store = self.ctx.restore_store
        for handle in self.restored:
            if store is None:
                break
            start, stop = handle.get("key_groups", (0, 0))
            whole = range(start, stop) == mine
            found: dict[Hashable, Any]
            if self._session:
                rows = read_session_rows(handle, store)
                found = {} if rows is None else dict(session_rows_as_windows(rows))
            else:
                found = dict(panes_as_windows(read_panes(handle, store)))
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
            self.cleanup_timers.add(cleanup_time(end, self.lateness), key, (start, end))
        else:
            self.fire_timers.add(end - 1, key, (start, end))

    @property
    def open_windows(self) -> int:
        """Windows not fired yet."""
        return len(self.fire_timers)

    def figures(self) -> dict[str, int] | None:
        return {
            "late": self.late_records,
            "windows": len(self.fire_timers),
            "timers": len(self.fire_timers) + len(self.cleanup_timers),
        }

    # ------------------------------------------------------------------ records

    def _late_window(self, end: int, floor: int | None = None) -> bool:
        return is_past(end, self.lateness, self.watermark if floor is None else floor)

    def _floor(self, key: Hashable) -> int:
        """The watermark a record of ``key`` is late against: the operator's, or, after a
        restore at another parallelism, that of the subtask whose state the key was in."""
        if self.watermark >= self._ceiling:
            return self.watermark
        group = key_group(key, self.backend.max_parallelism)
        for groups, mark in self._marks:
            if group in groups:
                return max(self.watermark, mark)
        return self.watermark

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> KeyedSnapshot:
        taken = super().snapshot(checkpoint_id, base=base, savepoint=savepoint)
        taken.extra["watermark"] = self.watermark
        taken.extra["late"] = self.late_records
        if self._time_type is not None:
            taken.extra["time_type"] = self._time_type
        return taken

    def process(self, batch: Batch) -> Batch | None:
        if not len(batch):
            return None
        prepared = self._prepare(batch)
        if prepared is None:
            return None
        out = self._records(*prepared)
        if self.early_records is not None:
            found = self.early_records.counted(*prepared)
            if found:
                out = joined(out, self._results(found, final=False))
        return out

    def _records(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        """Records with their timestamps (those without failed) into their windows; what
        fires again (a fired window updated within the lateness)."""
        if self.aggregation.collects and not self._session and self.watermark >= self._ceiling:
            return self._collect(batch, ts)
        if (
            self.watermark >= self._ceiling  # (else the per-record path: lateness per key)
            and self.aggregation.builtin
            and isinstance(batch, pa.RecordBatch)
            and isinstance(self.key, str)
            and self._vectorizable(batch)
        ):
            if self._session:
                return self._sessions_vectorized(batch, ts)
            return self._windows_vectorized(batch, ts)
        return self._per_record(rows(batch), ts)

    def _prepare(self, batch: Batch) -> tuple[Batch, np.ndarray] | None:
        """The records with an event time (the others failed), and their timestamps (the time
        they arrive, for processing time); ``None`` when none is left."""
        if self.processing:
            now = int(time.time() * 1000)
            self.watermark = max(self.watermark, now - 1)
            return batch, np.full(len(batch), now, dtype=np.int64)
        try:
            ts, missing = self.event_time.timestamps(batch)
        except EventTimeError as exc:
            raise RecordError(str(exc)) from None
        if missing is not None:
            batch, ts = without_time(batch, ts, missing, self.event_time.column, self.ctx)
            if not len(batch):
                return None
        if self._time_type is None:
            self._learn_time_type(batch)
        return batch, ts

    def _owned(self, keys: pa.Array) -> np.ndarray:
        """Which of ``keys`` are in this subtask's key groups (of the windows kept as columns, a
        restore at another parallelism keeps only those)."""
        mine, maximum = self.backend.key_groups, self.backend.max_parallelism
        groups = key_groups(keys, maximum)
        return (groups >= mine.start) & (groups < mine.stop)

    def _record_columns(
        self,
        records: list[Any],
        ts: np.ndarray,
        times: Callable[[Hashable, int], list[int]],
    ) -> tuple[pa.Array, np.ndarray, np.ndarray | None] | None:
        """A built-in's records one by one, as columns: each record's key, once per time
        ``times(key, stamp)`` gives it (its windows' starts, or its own time; none: it is
        late, to the side output), and its value (none for ``count``). A record whose key or
        value cannot be taken fails (``on_error``). ``None``: nothing is left."""
        keys: list[Any] = []
        found: list[int] = []
        values: list[Any] = []
        late: list[Any] = []
        kind, field_name = self.aggregation.kind, self.aggregation.field
        for record, stamp in zip(records, ts.tolist(), strict=True):
            try:
                key = self.get_key(record)
                self.backend.set_current_key(key)  # (checks the key belongs here)
                if key is None:
                    raise RecordError(f"the record's key is null: {record!r}")
                value = number(record, field_name, kind) if self.aggregation.takes_values else None
                mine = times(key, stamp)
                if not mine:
                    late.append(record)
                    continue
                for at in mine:
                    keys.append(key)
                    found.append(at)
                    values.append(value)
            except Exception as exc:
                self.ctx.fail(record, exc)
        if late:
            self._too_late(late)
        if not keys:
            return None
        array = np.array(values) if self.aggregation.takes_values else None
        if array is not None and array.dtype == object:
            array = np.array([float(v) for v in values])  # (ints and floats mixed)
        return pa.array(keys), np.array(found, dtype=np.int64), array

    def _learn_time_type(self, batch: Batch) -> None:
        """The event-time column's type, from the records (``assign_timestamps``)."""
        column = self.event_time.column
        if isinstance(batch, pa.RecordBatch):
            self._time_type = batch.schema.field(column).type
            return
        for record in batch:
            value = record.get(column) if isinstance(record, dict) else None
            if isinstance(value, dt.datetime):
                self._time_type = pa.timestamp("us", tz="UTC" if value.tzinfo else None)
                return
            if isinstance(value, int):
                self._time_type = pa.int64()
                return

    def _vectorizable(self, batch: pa.RecordBatch) -> bool:
        names = batch.schema.names
        assert isinstance(self.key, str)
        if self.key not in names or batch.column(self.key).null_count:
            return False
        if not self.aggregation.takes_values:
            return True
        if self.aggregation.field not in names:
            return False
        column = batch.column(self.aggregation.field)
        numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
        return numeric and not column.null_count

    def _windows_vectorized(self, batch: pa.RecordBatch, ts: np.ndarray) -> Batch | None:
        assigner = self.assigner
        assert not isinstance(assigner, Session)
        index, starts = assign(assigner, ts)
        ends = ends_of(assigner, starts)
        on_time = in_time(ends, self.lateness, self.watermark)
        self._note_late(batch, index, on_time)
        if not on_time.all():
            index, starts = index[on_time], starts[on_time]
        if not len(index):
            return None
        aggregation = self.aggregation
        assert isinstance(self.key, str)
        taken = pa.array(index)
        values = None
        if aggregation.takes_values:
            assert aggregation.field is not None
            values = batch.column(aggregation.field).take(taken)
        grouped_keys, grouped_starts, sums, counts = group_by_window(
            batch.column(self.key).take(taken), starts, values, aggregation.kind
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
        refired: list[tuple[Hashable, int, int, Any]] = []
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
        return self._results(refired) if refired else None

    def _note_late(self, batch: Batch, index: np.ndarray, on_time: np.ndarray) -> None:
        """Records none of whose windows is on time go to the side output, counted."""
        if on_time.all():
            return
        count = len(batch)
        alive = np.zeros(count, dtype=bool)
        alive[index[on_time]] = True
        late = ~alive
        if not late.any():
            return
        if not self._keeps_late:
            self.late_records += int(late.sum())
        elif isinstance(batch, pa.RecordBatch):
            self._too_late(batch.filter(pa.array(late)))
        else:
            self._too_late([r for r, x in zip(batch, late.tolist(), strict=True) if x])

    def _too_late(self, records: Batch) -> None:
        """Records too late for every window they belong to: counted, and kept for the side
        output ``late`` if the job reads it."""
        self.late_records += len(records)
        if self._keeps_late:
            self._late.append(records)

    def _sessions_on_time(
        self, batch: pa.RecordBatch, ts: np.ndarray, gap: int
    ) -> tuple[pa.RecordBatch, np.ndarray] | None:
        """The records whose own session is not past (the others late: counted, and to the
        side output), and their timestamps; ``None``: none is."""
        on_time = in_time(ts + gap, self.lateness, self.watermark)
        self._note_late(batch, np.arange(len(ts)), on_time)
        if not on_time.any():
            return None
        if not on_time.all():
            batch, ts = batch.filter(pa.array(on_time)), ts[on_time]
        return batch, ts

    def _sessions_vectorized(self, batch: pa.RecordBatch, ts: np.ndarray) -> Batch | None:
        assigner = self.assigner
        assert isinstance(assigner, Session) and isinstance(self.key, str)
        gap = assigner.gap
        kept = self._sessions_on_time(batch, ts, gap)
        if kept is None:
            return None
        batch, ts = kept
        kind = self.aggregation.kind
        values = None
        if self.aggregation.takes_values:
            assert self.aggregation.field is not None
            values = np.asarray(batch.column(self.aggregation.field).to_numpy(zero_copy_only=False))
        keys, firsts, ends, acc, counts = cut_sessions(
            batch.column(self.key), ts, values, kind, gap
        )
        parts: list[Any] = acc.tolist()
        if self.aggregation.mean:  # (sum, count)
            parts = list(zip(parts, counts.tolist(), strict=True))
        refired: list[tuple[Hashable, int, int, Any]] = []
        for key, first, end, part in zip(
            keys.to_pylist(), firsts.tolist(), ends.tolist(), parts, strict=True
        ):
            refired += self._merge_session(key, first, end, part)
        return self._results(refired) if refired else None

    def _merge_session(
        self, key: Hashable, start: int, end: int, acc: Any
    ) -> list[tuple[Hashable, int, int, Any]]:
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
                        cleanup_time(s_end, self.lateness), key, (s_start, s_end)
                    )
                else:
                    self.fire_timers.discard(s_end - 1, key, (s_start, s_end))
            else:
                kept.append((s_start, s_end, s_acc, s_fired))
        # a fired session that grew past the watermark fires again when its new end passes
        refire_now = fired and self.watermark >= end - 1
        if fired and not refire_now:
            fired = False
        kept.append((start, end, acc, fired))
        kept.sort()
        self.table[key] = tuple(kept)
        self._register(key, start, end, fired)
        return [(key, start, end, acc)] if refire_now else []

    def _per_record(self, records: list[Any], ts: np.ndarray) -> Batch | None:
        aggregation, get_key = self.aggregation, self.get_key
        refired: dict[tuple[Hashable, int], tuple[Hashable, int, int, Any]] = {}
        late: list[Any] = []
        for record, stamp in zip(records, ts.tolist(), strict=True):
            try:
                key = get_key(record)
                self.backend.set_current_key(key)  # (checks the key belongs here)
                if self._session:
                    assert isinstance(self.assigner, Session)
                    end = stamp + self.assigner.gap
                    if self._late_window(end, self._floor(key)):
                        late.append(record)
                        continue
                    acc = aggregation.add(aggregation.create(), record)
                    for hit in self._merge_session(key, stamp, end, acc):
                        refired[(key, hit[1])] = hit
                    continue
                starts = self._starts(stamp)
                windows = dict(self.table.get(key) or {})
                on_time = False
                floor = self._floor(key)
                for start in starts:
                    end = self._end(start)
                    if self._late_window(end, floor):
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
                self.ctx.fail(record, exc)
        if late:
            self._too_late(late)
        return self._results(list(refired.values())) if refired else None

    def _collect(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        return collect(self, batch, ts)

    def _starts(self, stamp: int) -> list[int]:
        assert not isinstance(self.assigner, Session)
        return starts_of(self.assigner, stamp)

    # ------------------------------------------------------------------ firing

    def on_watermark(self, watermark: int) -> Batch | None:
        if self.processing and watermark != MAX_WATERMARK:
            return None  # (the clock fires processing-time windows; the end, everything)
        return self._fire_upto(watermark)

    def on_processing_time(self, now_ms: int) -> Batch | None:
        early = self._early(now_ms)
        if not self.processing or not self._holds_windows():
            return early
        return joined(early, self._fire_upto(max(self.watermark, now_ms - 1)))

    def _holds_windows(self) -> bool:
        """Whether any window waits to fire (processing time fires them as the clock goes)."""
        return bool(len(self.fire_timers))

    def _early(self, now_ms: int) -> Batch | None:
        """Every ``early`` ms of processing time, each open window's result so far."""
        every = self.logic.early
        if every is None or now_ms < self._next_early:
            return None
        self._next_early = now_ms + every
        return self._so_far()

    def _so_far(self) -> Batch | None:
        """The results so far of the windows not fired yet (``final`` false)."""
        found: list[tuple[Hashable, int, int, Any]] = []
        for key in list(self.backend.keys(WINDOWS)):
            value = self.table.get(key)
            if value is None:
                continue
            if self._session:
                found += [(key, s, e, acc) for s, e, acc, fired in value if not fired]
            else:
                found += [(key, s, self._end(s), a) for s, (a, f) in value.items() if not f]
        return self._results(found, final=False) if found else None

    def _fire_upto(self, watermark: int) -> Batch | None:
        """Fire every window whose last millisecond is at or before ``watermark`` (never
        going back: after a restore, the watermarks from upstream start again from the
        least, behind the one restored)."""
        if watermark <= self.watermark and not len(self.fire_timers):
            return None
        watermark = self.watermark = max(self.watermark, watermark)
        results: list[tuple[Hashable, int, int, Any]] = []
        for _, key, (start, end) in self.fire_timers.pop_due(watermark):
            acc = self._fire(key, start, end)
            if acc is not _GONE:
                results.append((key, start, end, acc))
        for _, key, (start, _end) in self.cleanup_timers.pop_due(watermark):
            self._drop(key, start)
        return self._results(results) if results else None

    def _fire(self, key: Hashable, start: int, end: int) -> Any:
        """Window ``[start, end)`` of ``key`` fires: its accumulator (dropped from state, or
        marked fired and kept for the lateness)."""
        value = self.table.get(key)
        keep = self.lateness > 0 and self.watermark != MAX_WATERMARK
        if self.early_records is not None:
            self.early_records.forget(key, start, end)
        if self._session:
            sessions = list(value or ())
            for i, (s_start, s_end, acc, _) in enumerate(sessions):
                if s_start == start and s_end == end:
                    if keep:
                        sessions[i] = (s_start, s_end, acc, True)
                        self.cleanup_timers.add(cleanup_time(end, self.lateness), key, (start, end))
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
            self.cleanup_timers.add(cleanup_time(end, self.lateness), key, (start, end))
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

    def _results(self, fired: list[tuple[Hashable, int, int, Any]], final: bool = True) -> Batch:
        """The output records of fired windows: key, window_start, window_end, the result."""
        return window_results(fired, self.logic, self._time_type, self.ctx, final)

    def _builtin_batch(
        self, keys: pa.Array, starts: Any, ends: Any, values: Any, final: bool = True
    ) -> pa.RecordBatch:
        return builtin_batch(self.logic, self._time_type, keys, starts, ends, values, final)

    def side_output(self, side: str) -> Batch | None:
        if side != LATE or not self._late:
            return None
        late, self._late = self._late, []
        if len(late) == 1:
            return late[0]
        if all(isinstance(b, pa.RecordBatch) for b in late):
            return pa.concat_batches(late)
        return [r for b in late for r in rows(b)]


def joined(first: Batch | None, second: Batch | None) -> Batch | None:
    """Two outputs of one call as one (early results, then what fired)."""
    if first is None or not len(first):
        return second
    if second is None or not len(second):
        return first
    if isinstance(first, pa.RecordBatch) and isinstance(second, pa.RecordBatch):
        return pa.concat_batches([first, second.cast(first.schema)])
    return [*rows(first), *rows(second)]
