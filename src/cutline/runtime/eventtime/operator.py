"""The window operator: one for every window and layout.

It decides, and its window store keeps. The operator reads each record's time, keeps the
lateness rule (:class:`~cutline.runtime.eventtime.lateness.Lateness`: against the watermark,
or after a rescaled restore against the one each key's old subtask had reached), counts late
records and holds them for the side output ``late``
(:class:`~cutline.runtime.eventtime.output.LateRecords`), and drives one timer service
(:class:`~cutline.runtime.eventtime.timers.WindowTimers`): when the watermark (or, for
processing time, the clock) passes a timer, the store's windows it names fire, and fired
windows kept for the lateness are dropped. It emits early results (``early=`` every so much
processing time, ``early_records=`` every N records) and what fires, and checkpoints its
watermark and late count beside the windows.

What the windows hold, and how, is its **window store**
(:class:`~cutline.runtime.eventtime.store.WindowStore`), made from a
:class:`~cutline.runtime.eventtime.store.StoreContext` (never from the operator): one
*bucketing* (a window is its one slice: tumbling; windows share slices: sliding; sessions)
kept in one *storage* (keyed state; columns in memory; runs on disk):

* :class:`~cutline.runtime.eventtime.keyed.KeyedWindows`: per key, its windows in keyed state
  (every window, aggregation and backend);
* :class:`~cutline.runtime.eventtime.columnar_windows.ColumnarWindows` and
  :class:`~cutline.runtime.eventtime.sliced_windows.SlicedWindows`: tumbling and sliding
  windows of a built-in as columns (the memory backend's);
* :class:`~cutline.runtime.eventtime.columnar_sessions.ColumnarSessions`: sessions of a
  built-in as rows (the memory backend's);
* :class:`~cutline.runtime.eventtime.run_windows.RunWindows` and
  :class:`~cutline.runtime.eventtime.sliced_runs.SlicedRuns`: tumbling and sliding windows of
  a built-in as runs (the disk backend's: larger than memory).

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
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.eventtime.assign import without_time
from cutline.runtime.eventtime.early import EarlyRecords
from cutline.runtime.eventtime.lateness import Lateness, restored_marks
from cutline.runtime.eventtime.output import LATE, LateRecords, WindowOutput
from cutline.runtime.eventtime.records import RecordColumns
from cutline.runtime.eventtime.spec import WindowSpec
from cutline.runtime.eventtime.store import Restored, StoreContext, WindowStore
from cutline.runtime.eventtime.timers import WindowTimers
from cutline.runtime.eventtime.timestamps import EventTimeError
from cutline.runtime.operators import (
    Batch,
    OperatorContext,
    RecordError,
    RunningOperator,
    key_getter,
    rows,
)
from cutline.runtime.state.backend import KeyedSnapshot


class WindowOperator(RunningOperator):
    """The running window operator of one subtask, its windows kept by a ``layout`` (a window
    store made from a :class:`~cutline.runtime.eventtime.store.StoreContext`)."""

    def __init__(
        self,
        logic: WindowSpec,
        ctx: OperatorContext,
        state: object,
        layout: Callable[[StoreContext], WindowStore],
    ) -> None:
        self.ctx = ctx
        self.logic = logic
        self.key = logic.key
        self.event_time = logic.event_time
        self.processing = logic.time == "processing"
        self.backend, self.restored = ctx.open_keyed_state(state)
        """The subtask's keyed state, and the handles it was restored from."""
        try:
            self._open(layout)
        except BaseException:
            self.backend.close()
            raise

    def _open(self, layout: Callable[[StoreContext], WindowStore]) -> None:
        logic, ctx = self.logic, self.ctx
        time_type = self.event_time.type
        """The event-time column's type (learned from the records when the job could not
        know it: after ``assign_timestamps``): window_start and window_end come back in it."""
        # The watermark it had reached at the restored checkpoint: a window that fired then
        # must not open again for a record that was late then (it would be published twice).
        # Restored at another parallelism, each key keeps the watermark of the subtask it was
        # in, until the watermark passes them all.
        marks, late = restored_marks(self.restored, self.backend.key_groups)
        for handle in self.restored:
            if time_type is None and handle.get("time_type") is not None:
                time_type = handle["time_type"]
        if marks:  # (the clock only moves forward)
            ctx.advance(min(m for _, m in marks))
        self.lateness = Lateness(logic.allowed_lateness, ctx, marks, self.backend.max_parallelism)
        """The lateness rule (the store asks it)."""
        self.late = LateRecords(LATE in ctx.side_outputs, late)
        """The records too late for their windows: counted (since the job started: a restore
        carries them, each old subtask's to the one subtask that now owns its first key group,
        so that a rescaled restore counts each once), and held for the side output ``late``
        only when the job reads it (``.late()``)."""
        self.output = WindowOutput(logic, ctx, time_type)
        self.timers = WindowTimers(self.backend)
        self.records = RecordColumns(
            logic.key, key_getter(logic.key), logic.aggregation, self.backend, ctx, self.late
        )
        self.early_records = (
            None
            if logic.early_records is None
            else EarlyRecords(self.backend, logic.assigner, self.records, logic.early_records)
        )
        """The counts of ``early_records``: which windows took another N records."""
        self._next_early = 0
        """When the open windows' results so far are due next (processing time, ms)."""
        self.store = layout(
            StoreContext(
                spec=logic,
                backend=self.backend,
                state=ctx.state,
                timers=self.timers,
                lateness=self.lateness,
                late=self.late,
                output=self.output,
                records=self.records,
                restored=Restored(self.restored, ctx.restore_store, ctx.restore_checkpoint),
                early=self.early_records,
            )
        )
        """Its windows (restored when it is made), in one layout."""

    @property
    def watermark(self) -> int:
        """The watermark this operator reached: its place on the subtask's clock
        (:class:`~cutline.protocol.watermarks.EventClock`; for processing-time windows,
        the wall clock's time it reached)."""
        return self.ctx.watermark

    @property
    def late_records(self) -> int:
        """Records too late for their windows (sent to the side output ``late``), since the
        job started."""
        return self.late.count

    @property
    def time_type(self) -> pa.DataType | None:
        """The event-time column's type (``None`` until known)."""
        return self.output.time_type

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
                out = joined(out, self.output.results(found, final=False))
        return out

    def _prepare(self, batch: Batch) -> tuple[Batch, np.ndarray] | None:
        """The records with an event time (the others failed), and their timestamps (the time
        they arrive, for processing time); ``None`` when none is left."""
        if self.processing:
            now = int(time.time() * 1000)
            self.ctx.advance(now - 1)
            return batch, np.full(len(batch), now, dtype=np.int64)
        try:
            ts, missing = self.event_time.timestamps(batch)
        except EventTimeError as exc:
            raise RecordError(str(exc)) from None
        if missing is not None:
            batch, ts = without_time(batch, ts, missing, self.event_time.column, self.ctx)
            if not len(batch):
                return None
        if self.output.time_type is None:
            self._learn_time_type(batch)
        return batch, ts

    def _learn_time_type(self, batch: Batch) -> None:
        """The event-time column's type, from the records (``assign_timestamps``)."""
        column = self.event_time.column
        if isinstance(batch, pa.RecordBatch):
            self.output.time_type = batch.schema.field(column).type
            return
        for record in batch:
            value = record.get(column) if isinstance(record, dict) else None
            if isinstance(value, dt.datetime):
                self.output.time_type = pa.timestamp("us", tz="UTC" if value.tzinfo else None)
                return
            if isinstance(value, int):
                self.output.time_type = pa.int64()
                return

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
        watermark = self.ctx.advance(watermark)
        if not self.timers.pending:
            return None
        out = self.store.fire(self.timers.to_fire.pop_due(watermark))
        self.store.drop(self.timers.to_drop.pop_due(watermark))
        return out

    # ------------------------------------------------------------------ output

    def side_output(self, side: str) -> Batch | None:
        if side != LATE:
            return None
        return self.late.take()

    # ------------------------------------------------------- figures, snapshots

    def figures(self) -> dict[str, int] | None:
        return {
            "late": self.late.count,
            "windows": self.store.open_windows,
            "timers": len(self.timers),
        }

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> KeyedSnapshot:
        taken = self.backend.snapshot(checkpoint_id, base=base, savepoint=savepoint)
        taken.extra["watermark"] = self.watermark
        taken.extra["late"] = self.late.count
        if self.output.time_type is not None:
            taken.extra["time_type"] = self.output.time_type
        self.store.attach(taken, checkpoint_id, base, savepoint)
        return taken

    def close(self) -> None:
        self.backend.close()


def joined(first: Batch | None, second: Batch | None) -> Batch | None:
    """Two outputs of one call as one (early results, then what fired)."""
    if first is None or not len(first):
        return second
    if second is None or not len(second):
        return first
    if isinstance(first, pa.RecordBatch) and isinstance(second, pa.RecordBatch):
        return pa.concat_batches([first, second.cast(first.schema)])
    return [*rows(first), *rows(second)]
