"""The window operator: one for every window and layout.

It reads each record's time, decides what is late (:mod:`~cutline.runtime.eventtime.lateness`,
against the watermark, or after a rescaled restore against the one each key's old subtask had
reached), sends late records to the side output ``late`` and counts them, and drives one timer
service (:class:`~cutline.runtime.eventtime.timers.WindowTimers`): when the watermark (or, for
processing time, the clock) passes a timer, the windows it names fire, and fired windows kept
for the lateness are dropped. It emits early results (``early=`` every so much processing
time, ``early_records=`` every N records) and what fires, and checkpoints its watermark and
late count beside the windows.

What the windows hold, and how, is its **window store** (:class:`WindowStore`), one of the
layouts:

* :class:`~cutline.runtime.eventtime.keyed.KeyedWindows`: per key, its windows in keyed state
  (every window, aggregation and backend);
* :class:`~cutline.runtime.eventtime.columnar_windows.ColumnarWindows`: tumbling windows of a
  built-in as columns (the memory backend's);
* :class:`~cutline.runtime.eventtime.sliced_windows.SlicedWindows`: sliding windows of a
  built-in, as slices (the memory backend's);
* :class:`~cutline.runtime.eventtime.columnar_sessions.ColumnarSessions`: sessions of a
  built-in as rows (the memory backend's);
* :class:`~cutline.runtime.eventtime.run_windows.RunWindows` and
  :class:`~cutline.runtime.eventtime.sliced_runs.SlicedRuns`: tumbling windows, and sliding
  windows' slices, of a built-in as runs (the disk backend's: larger than memory).

A window **fires** when the watermark reaches its last millisecond (``window_end - 1``): its
result is emitted with ``window_start`` and ``window_end`` (in the type of the event-time
column) and carries event time ``window_end - 1`` downstream, so a second window regroups
results (Flink's rules). Late records within the lateness update their window, which fires
again with the new result; later ones go to the side output ``"late"`` (``.late()``), as
they came in, and are counted; a job that does not read ``.late()`` only counts them.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MAX_WATERMARK, MIN_WATERMARK
from cutline.runtime.eventtime.aggregations import number
from cutline.runtime.eventtime.assign import without_time
from cutline.runtime.eventtime.early import EarlyRecords
from cutline.runtime.eventtime.lateness import in_time, is_past
from cutline.runtime.eventtime.output import LATE, builtin_batch, window_results
from cutline.runtime.eventtime.spec import WindowSpec
from cutline.runtime.eventtime.timers import Timer, WindowTimers
from cutline.runtime.eventtime.timestamps import EventTimeError
from cutline.runtime.keyed_operators import _Keyed
from cutline.runtime.operators import Batch, OperatorContext, RecordError, rows
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.keygroups import key_group, key_groups

Fired = tuple[Hashable, int, int, Any]
"""A window that fires: key, start, end, accumulator."""


class WindowStore(Protocol):
    """What a window operator keeps of its windows, in one layout. It restores them when it
    is made (from the operator's restored handles), puts records into windows, and is told
    which of its timers are due."""

    def add(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        """Records with their timestamps into their windows (the late ones to
        :meth:`WindowOperator.too_late`); what fires again (a fired window updated within
        the lateness)."""
        ...

    def fire(self, due: Iterable[Timer]) -> Batch | None:
        """The windows of the due ``to_fire`` timers fire: their results (each dropped, or kept
        for the lateness: :attr:`WindowOperator.keeps_fired`)."""
        ...

    def drop(self, due: Iterable[Timer]) -> None:
        """The fired windows of the due ``to_drop`` timers are past: dropped."""
        ...

    def so_far(self) -> Batch | None:
        """The results so far of the windows not fired yet (``final`` false)."""
        ...

    def holds_windows(self) -> bool:
        """Whether any window waits to fire."""
        ...

    @property
    def open_windows(self) -> int:
        """Windows not fired yet, per key (read from the thread that reports the figures)."""
        ...

    def attach(
        self, taken: KeyedSnapshot, checkpoint_id: int, base: int | None, savepoint: bool
    ) -> None:
        """What the snapshot writes of the windows beside the keyed state, if anything."""
        ...


class WindowOperator(_Keyed):
    """The running window operator of one subtask, its windows kept by a ``layout``."""

    def __init__(
        self,
        logic: WindowSpec,
        ctx: OperatorContext,
        state: Any,
        layout: Callable[[WindowOperator], WindowStore],
    ) -> None:
        super().__init__(ctx, state, logic.key)
        self.logic = logic
        self.assigner = logic.assigner
        self.aggregation = logic.aggregation
        self.event_time = logic.event_time
        self.lateness = logic.allowed_lateness
        self.timers = WindowTimers(self.backend)
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
        self.processing = logic.time == "processing"
        self.time_type = self.event_time.type
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
                if self.time_type is None and handle.get("time_type") is not None:
                    self.time_type = handle["time_type"]
        if self._marks:  # (the clock only moves forward)
            self.watermark = min(m for _, m in self._marks)
        self._ceiling = max((m for _, m in self._marks), default=MIN_WATERMARK)
        self.store = layout(self)
        """Its windows (restored when it is made), in one layout."""
        self.early_records = (
            None
            if logic.early_records is None
            else EarlyRecords(self, self.store, logic.early_records)
        )
        """The counts of ``early_records``: which windows took another N records."""

    # ---------------------------------------------------------------- lateness

    @property
    def watermark(self) -> int:
        """The watermark this operator reached: its place on the subtask's clock
        (:class:`~cutline.protocol.watermarks.EventClock`; for processing-time windows,
        the wall clock's time it reached)."""
        return self.ctx.watermark

    @watermark.setter
    def watermark(self, watermark: int) -> None:
        self.ctx.advance(watermark)

    @property
    def floors_differ(self) -> bool:
        """Whether some keys are still late against a higher watermark than the operator's:
        the one their old subtask had reached at a restore at another parallelism
        (:meth:`floor`). Until the watermark passes them all, records take the per-record
        path."""
        return self.watermark < self._ceiling

    def floor(self, key: Hashable) -> int:
        """The watermark a record of ``key`` is late against: the operator's, or, after a
        restore at another parallelism, that of the subtask whose state the key was in."""
        if self.watermark >= self._ceiling:
            return self.watermark
        group = key_group(key, self.backend.max_parallelism)
        for groups, mark in self._marks:
            if group in groups:
                return max(self.watermark, mark)
        return self.watermark

    def is_past(self, end: int, floor: int | None = None) -> bool:
        """Whether a window ending at ``end`` is past (at ``floor``, or the watermark)."""
        return is_past(end, self.lateness, self.watermark if floor is None else floor)

    @property
    def keeps_fired(self) -> bool:
        """Whether a window that fires now is kept for the lateness (else dropped)."""
        return self.lateness > 0 and self.watermark != MAX_WATERMARK

    def note_late(self, batch: Batch, index: np.ndarray, on_time: np.ndarray) -> None:
        """Records none of whose windows is on time (``index``: the record of each window,
        ``on_time``: whether that window is) go to the side output, counted."""
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
            self.too_late(batch.filter(pa.array(late)))
        else:
            self.too_late([r for r, x in zip(batch, late.tolist(), strict=True) if x])

    def too_late(self, records: Batch) -> None:
        """Records too late for every window they belong to: counted, and kept for the side
        output ``late`` if the job reads it."""
        self.late_records += len(records)
        if self._keeps_late:
            self._late.append(records)

    def sessions_on_time(
        self, batch: pa.RecordBatch, ts: np.ndarray, gap: int
    ) -> tuple[pa.RecordBatch, np.ndarray] | None:
        """The records whose own session is not past (the others late: counted, and to the
        side output), and their timestamps; ``None``: none is."""
        on_time = in_time(ts + gap, self.lateness, self.watermark)
        self.note_late(batch, np.arange(len(ts)), on_time)
        if not on_time.any():
            return None
        if not on_time.all():
            batch, ts = batch.filter(pa.array(on_time)), ts[on_time]
        return batch, ts

    # ----------------------------------------------------------------- records

    def process(self, batch: Batch) -> Batch | None:
        if not len(batch):
            return None
        prepared = self._prepare(batch)
        if prepared is None:
            return None
        out = self.store.add(*prepared)
        if self.early_records is not None:
            found = self.early_records.counted(*prepared)
            if found:
                out = joined(out, self.results(found, final=False))
        return out

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
        if self.time_type is None:
            self._learn_time_type(batch)
        return batch, ts

    def _learn_time_type(self, batch: Batch) -> None:
        """The event-time column's type, from the records (``assign_timestamps``)."""
        column = self.event_time.column
        if isinstance(batch, pa.RecordBatch):
            self.time_type = batch.schema.field(column).type
            return
        for record in batch:
            value = record.get(column) if isinstance(record, dict) else None
            if isinstance(value, dt.datetime):
                self.time_type = pa.timestamp("us", tz="UTC" if value.tzinfo else None)
                return
            if isinstance(value, int):
                self.time_type = pa.int64()
                return

    def vectorizable(self, batch: pa.RecordBatch) -> bool:
        """Whether a built-in takes the batch as columns: its key column, and its value
        column numeric, there and without nulls."""
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

    def owned(self, keys: pa.Array) -> np.ndarray:
        """Which of ``keys`` are in this subtask's key groups (of the windows kept as columns, a
        restore at another parallelism keeps only those)."""
        mine, maximum = self.backend.key_groups, self.backend.max_parallelism
        groups = key_groups(keys, maximum)
        return (groups >= mine.start) & (groups < mine.stop)

    def record_columns(
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
            self.too_late(late)
        if not keys:
            return None
        array = np.array(values) if self.aggregation.takes_values else None
        if array is not None and array.dtype == object:
            array = np.array([float(v) for v in values])  # (ints and floats mixed)
        return pa.array(keys), np.array(found, dtype=np.int64), array

    # ------------------------------------------------------------------ firing

    def on_watermark(self, watermark: int) -> Batch | None:
        if self.processing and watermark != MAX_WATERMARK:
            return None  # (the clock fires processing-time windows; the end, everything)
        return self._fire_upto(watermark)

    def on_processing_time(self, now_ms: int) -> Batch | None:
        early = self._early(now_ms)
        if not self.processing or not self.store.holds_windows():
            return early
        return joined(early, self._fire_upto(max(self.watermark, now_ms - 1)))

    def _early(self, now_ms: int) -> Batch | None:
        """Every ``early`` ms of processing time, each open window's result so far."""
        every = self.logic.early
        if every is None or now_ms < self._next_early:
            return None
        self._next_early = now_ms + every
        return self.store.so_far()

    def _fire_upto(self, watermark: int) -> Batch | None:
        """Event time (or the clock) reached ``watermark``: the windows whose timers are due
        fire, then the fired ones past the lateness are dropped. It never goes back: after a
        restore, the watermarks from upstream start again from the least, behind the one
        restored."""
        watermark = self.watermark = max(self.watermark, watermark)
        if not self.timers.pending:
            return None
        out = self.store.fire(self.timers.to_fire.pop_due(watermark))
        self.store.drop(self.timers.to_drop.pop_due(watermark))
        return out

    # ------------------------------------------------------------------ output

    def results(self, fired: list[Fired], final: bool = True) -> Batch:
        """The output records of fired windows: key, window_start, window_end, the result."""
        return window_results(fired, self.logic, self.time_type, self.ctx, final)

    def builtin_batch(
        self, keys: pa.Array, starts: Any, ends: Any, values: Any, final: bool = True
    ) -> pa.RecordBatch:
        """The output of a built-in's windows, as columns."""
        return builtin_batch(self.logic, self.time_type, keys, starts, ends, values, final)

    def side_output(self, side: str) -> Batch | None:
        if side != LATE or not self._late:
            return None
        late, self._late = self._late, []
        if len(late) == 1:
            return late[0]
        if all(isinstance(b, pa.RecordBatch) for b in late):
            return pa.concat_batches(late)
        return [r for b in late for r in rows(b)]

    # ------------------------------------------------------- figures, snapshots

    def figures(self) -> dict[str, int] | None:
        return {
            "late": self.late_records,
            "windows": self.store.open_windows,
            "timers": len(self.timers),
        }

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> KeyedSnapshot:
        taken = super().snapshot(checkpoint_id, base=base, savepoint=savepoint)
        taken.extra["watermark"] = self.watermark
        taken.extra["late"] = self.late_records
        if self.time_type is not None:
            taken.extra["time_type"] = self.time_type
        self.store.attach(taken, checkpoint_id, base, savepoint)
        return taken


def joined(first: Batch | None, second: Batch | None) -> Batch | None:
    """Two outputs of one call as one (early results, then what fired)."""
    if first is None or not len(first):
        return second
    if second is None or not len(second):
        return first
    if isinstance(first, pa.RecordBatch) and isinstance(second, pa.RecordBatch):
        return pa.concat_batches([first, second.cast(first.schema)])
    return [*rows(first), *rows(second)]
