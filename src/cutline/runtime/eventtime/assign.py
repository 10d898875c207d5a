"""``assign_timestamps``: event time given to a stream's records after a source (a column, or a
function's result), and watermarks made from it per subtask; and what happens to a record
that has no event time where one is needed (:func:`without_time`)."""

from __future__ import annotations

import copy
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.protocol.watermarks import MAX_WATERMARK, EmitWatermark, SplitWatermarks
from cutline.runtime.durations import said_ms
from cutline.runtime.eventtime.watermarks import WatermarkStrategy, jumps, promise_after
from cutline.runtime.operators import (
    Batch,
    Logic,
    OperatorContext,
    RecordError,
    RunningOperator,
    _repr,
    rows,
)


def _utc(ms: int) -> str:
    """An event time for a message: its UTC date and time."""
    try:
        moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)
    except OverflowError:
        return f"{ms} ms after the epoch"
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def without_time(
    batch: Batch, ts: np.ndarray, missing: np.ndarray, column: str, ctx: OperatorContext
) -> tuple[Batch, np.ndarray]:
    """The records of ``batch`` that have an event time, and their timestamps; those without
    one (``missing``) fail (``ctx.fail``: ``on_error``)."""
    records = rows(batch)
    for i in np.flatnonzero(missing).tolist():
        ctx.fail(records[i], RecordError(f"the record has no event time (no value in {column!r})"))
    keep = ~missing
    if isinstance(batch, pa.RecordBatch):
        return batch.filter(pa.array(keep)), ts[keep]
    return [r for r, k in zip(records, keep.tolist(), strict=True) if k], ts[keep]


@dataclass(frozen=True)
class AssignTimestampsLogic(Logic):
    """``assign_timestamps``: the records' event time (a column, or ``fn(record)`` stored in
    the ``event_time`` field), and watermarks made from it with bounded out-of-orderness, per
    subtask. Watermarks from upstream stop here, but the end's."""

    strategy: WatermarkStrategy
    fn: Callable[[Any], Any] | None = None
    makes_watermarks = True

    def open(self, ctx: OperatorContext, state: Any) -> RunningOperator:
        return _AssignTimestamps(self, ctx)


class _AssignTimestamps(RunningOperator):
    makes_watermarks = True

    def __init__(self, logic: AssignTimestampsLogic, ctx: OperatorContext) -> None:
        self.logic, self.ctx = logic, ctx
        strategy = logic.strategy
        self.clock: SplitWatermarks[str] = SplitWatermarks(
            strategy.bound_ms, strategy.idle_timeout_s
        )
        self.clock.split_added("records")
        self._pending: int | None = None
        self._status: bool | None = None
        self._unit_checked = False
        self._latest: int | None = None
        """The latest time of a record so far (for jumps past ``max_jump_ms``)."""
        self._jumped = False
        """Whether a jump was warned about (once)."""
        self._counting = False
        """Whether its idle time counts (from the first tick: before its first record, the
        time it has had none)."""
        prototype = strategy.generator
        self.generator = None if prototype is None else copy.deepcopy(prototype)

    def _take_actions(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, EmitWatermark):
                self._pending = action.watermark
            else:
                self._status = action.idle

    def on_processing_time(self, now_ms: int) -> Batch | None:
        if self.logic.strategy.idle_timeout_s is not None:
            if not self._counting:  # (a subtask that never gets a record goes idle too)
                self._counting = True
                self.clock.caught_up("records", now_ms / 1000)
            self._take_actions(self.clock.tick(now_ms / 1000))
        return None

    def take_status(self) -> bool | None:
        status, self._status = self._status, None
        return status

    def process(self, batch: Batch) -> Batch | None:
        fn, event_time = self.logic.fn, self.logic.strategy.column
        if fn is not None:
            out = []
            for record in rows(batch):
                try:
                    if not isinstance(record, dict):
                        raise RecordError(
                            f"assign_timestamps with a function needs records that are dicts "
                            f"(it stores the time in 'event_time'), got {_repr.repr(record)}",
                            record,
                        )
                    out.append({**record, "event_time": fn(record)})
                except Exception as exc:
                    self.ctx.fail(record, exc)
            batch = out
        if not len(batch):
            return None
        try:
            values, missing = event_time.timestamps(batch)
        except ValueError as exc:
            raise RecordError(str(exc)) from None
        if missing is not None:
            batch, values = without_time(batch, values, missing, event_time.column, self.ctx)
        if self.logic.strategy.max_jump_ms is not None and len(values):
            batch, values = self._without_jumps(batch, values)
        if len(values):
            highest = int(values.max())
            self._latest = highest if self._latest is None else max(self._latest, highest)
            now_s = time.time()
            generator = self.generator
            if generator is None:
                self._take_actions(self.clock.records("records", highest, now_s))
            else:
                promise = promise_after(generator, event_time, batch, values)
                self._take_actions(self.clock.promised("records", promise, now_s))
            if not self._unit_checked:
                self._unit_checked = True
                said = event_time.seconds_like(values)
                if said is not None and self.ctx.warn is not None:
                    self.ctx.warn(f"{self.ctx.name}: {said}")
        return batch

    def _without_jumps(self, batch: Batch, values: np.ndarray) -> tuple[Batch, np.ndarray]:
        """The batch without the records whose time jumps more than ``max_jump_ms`` ahead of
        the latest so far (:func:`~cutline.runtime.eventtime.watermarks.jumps`), which go to
        the dead letters with ``on_error="dead_letter"``; else all of it, and a warning,
        once."""
        bound = self.logic.strategy.max_jump_ms
        assert bound is not None
        jumped = jumps(values, self._latest, bound)
        if not jumped.any():
            return batch, values
        since = "the others of its batch" if self._latest is None else "the latest before it"
        why = (
            f"event time {_utc(int(values[jumped].min()))} jumps more than "
            f"max_jump={said_ms(bound)} ahead of {since}"
        )
        if self.ctx.on_error != "dead_letter":
            if not self._jumped and self.ctx.warn is not None:
                self._jumped = True
                self.ctx.warn(
                    f"{self.ctx.name}: {int(jumped.sum())} record(s) whose {why}: the watermark "
                    "follows them and later records may be late (on_error='dead_letter' sends "
                    "such records to the dead letters instead)"
                )
            return batch, values
        records = rows(batch)
        for index in np.flatnonzero(jumped).tolist():
            self.ctx.fail(records[index], RecordError(why))
        kept = ~jumped
        if isinstance(batch, pa.RecordBatch):
            return batch.filter(pa.array(kept)), values[kept]
        return [r for r, keep in zip(records, kept.tolist(), strict=True) if keep], values[kept]

    def on_watermark(self, watermark: int) -> Batch | None:
        if watermark == MAX_WATERMARK:  # the end of the input: everything fires downstream
            self._pending = MAX_WATERMARK
        return None

    def take_watermark(self) -> int | None:
        pending, self._pending = self._pending, None
        return pending
