"""What firing windows emit: per window, the key, ``window_start`` and ``window_end`` (in the
event-time column's type) and the result (:class:`WindowOutput`); and the side output of late
records (:class:`LateRecords`). A window store is given both: it puts what fires and what is
late there, and never sees its operator."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.aggregations import Kind
from cutline.runtime.eventtime.assigners import Session, Window, ends_of
from cutline.runtime.eventtime.spec import WindowSpec
from cutline.runtime.operators import Batch, OperatorContext, rows

LATE = "late"
"""The side output of the records too late for their windows."""


def window_results(
    fired: list[tuple[Hashable, int, int, Any]],
    logic: WindowSpec,
    time_type: pa.DataType | None,
    ctx: OperatorContext,
    final: bool = True,
) -> Batch:
    """The output records of fired windows ``(key, start, end, accumulator)``: a built-in's as
    one Arrow batch; a user's function's as records (its failures go to ``ctx.fail``)."""
    aggregation, key_column = logic.aggregation, logic.key_column
    event_time = dataclasses.replace(logic.event_time, offset=0, type=time_type)
    if aggregation.builtin:
        return builtin_batch(
            logic,
            time_type,
            pa.array([f[0] for f in fired]),
            [f[1] for f in fired],
            [f[2] for f in fired],
            [aggregation.result(f[3]) for f in fired],
            final,
        )
    out: list[Any] = []
    for key, start, end, acc in fired:
        window_start, window_end = event_time.to_value(start), event_time.to_value(end)
        if aggregation.collects:
            window = Window(window_start, window_end)
            try:
                if aggregation.kind is Kind.PROCESS:
                    contents: Any = [r for chunk in acc for r in chunk]
                else:
                    contents = pa.Table.from_batches(list(acc))
                produced = aggregation.fn(None if logic.keyless else key, window, contents)
                if isinstance(produced, pa.Table | pa.RecordBatch):
                    produced = produced.to_pylist()
                if produced is not None and logic.fires_early:
                    produced = [{**r, "final": final} for r in produced]
                if produced is not None:
                    out.extend(list(produced))
            except Exception as exc:
                ctx.fail(f"window {window_start}..{window_end} of key {key!r}", exc)
            continue
        try:
            result = aggregation.result(acc)
        except Exception as exc:
            ctx.fail(f"window {window_start}..{window_end} of key {key!r}", exc)
            continue
        fields = {"window_start": window_start, "window_end": window_end}
        if not logic.keyless:
            fields = {key_column: key, **fields}
        if logic.fires_early:
            fields["final"] = final
        if isinstance(result, dict):
            out.append({**fields, **result})
        else:
            out.append({**fields, "result": result})
    return out


def builtin_batch(
    logic: WindowSpec,
    time_type: pa.DataType | None,
    keys: pa.Array,
    starts: Any,
    ends: Any,
    values: Any,
    final: bool = True,
) -> pa.RecordBatch:
    """The results of a built-in aggregate: the key, ``window_start`` and ``window_end`` (in
    the event-time column's type) and the result."""
    event_time = dataclasses.replace(logic.event_time, offset=0, type=time_type)
    if isinstance(values, np.ndarray) and values.dtype == object:
        values = values.tolist()  # (Python ints beyond int64)
    columns = {
        "window_start": event_time.to_column(starts),
        "window_end": event_time.to_column(ends),
        logic.aggregation.output: pa.array(values),
    }
    if logic.fires_early:  # (early results, then the final one)
        columns["final"] = pa.repeat(final, len(columns["window_start"]))
    return pa.record_batch(columns if logic.keyless else {logic.key_column: keys, **columns})


class WindowOutput:
    """Where a window store puts what fires: it makes the output records of fired windows (in
    the event-time column's type, which the operator may learn from the records:
    :attr:`time_type`)."""

    def __init__(self, logic: WindowSpec, ctx: OperatorContext, time_type: pa.DataType | None):
        self.logic = logic
        self.ctx = ctx
        self.time_type = time_type
        """The event-time column's type (``None`` until the operator learns it from the
        records: after ``assign_timestamps``): window_start and window_end come back in it."""

    def results(self, fired: list[tuple[Hashable, int, int, Any]], final: bool = True) -> Batch:
        """The output records of fired windows ``(key, start, end, accumulator)``."""
        return window_results(fired, self.logic, self.time_type, self.ctx, final)

    def builtin_batch(
        self, keys: pa.Array, starts: Any, ends: Any, values: Any, final: bool = True
    ) -> pa.RecordBatch:
        """The output of a built-in's windows, as columns."""
        return builtin_batch(self.logic, self.time_type, keys, starts, ends, values, final)

    def by_start(
        self, fired: list[tuple[int, pa.Array, np.ndarray]], final: bool = True
    ) -> pa.RecordBatch:
        """The output of a built-in's windows of a start each (tumbling or sliding) firing:
        per window its start, its keys and their results."""
        assigner = self.logic.assigner
        assert not isinstance(assigner, Session)
        lengths = [len(keys) for _, keys, _ in fired]
        starts = np.repeat(np.array([start for start, _, _ in fired], dtype=np.int64), lengths)
        keys = pa.concat_arrays([k.cast(fired[0][1].type) for _, k, _ in fired])
        values = np.concatenate([v for _, _, v in fired])
        return self.builtin_batch(keys, starts, ends_of(assigner, starts), values, final)


class LateRecords:
    """Where a window store puts the records too late for every window they belong to: they
    are counted, and kept for the side output ``late`` if the job reads it (else let go).

    :param keeps: whether the job reads the side output.
    :param count: the late records counted before (restored).
    """

    def __init__(self, keeps: bool, count: int = 0) -> None:
        self.keeps = keeps
        self.count = count
        """Records too late for their windows since the job started."""
        self._held: list[Batch] = []

    def add(self, records: Batch) -> None:
        """Records too late for every window they belong to."""
        self.count += len(records)
        if self.keeps:
            self._held.append(records)

    def note(self, batch: Batch, index: np.ndarray, on_time: np.ndarray) -> None:
        """The records of ``batch`` none of whose windows is on time (``index``: the record
        of each window, ``on_time``: whether that window is) are late."""
        if on_time.all():
            return
        alive = np.zeros(len(batch), dtype=bool)
        alive[index[on_time]] = True
        late = ~alive
        if not late.any():
            return
        if not self.keeps:
            self.count += int(late.sum())
        elif isinstance(batch, pa.RecordBatch):
            self.add(batch.filter(pa.array(late)))
        else:
            self.add([r for r, x in zip(batch, late.tolist(), strict=True) if x])

    def on_time(
        self, batch: pa.RecordBatch, ts: np.ndarray, on_time: np.ndarray
    ) -> tuple[pa.RecordBatch, np.ndarray] | None:
        """The records of ``batch`` that are ``on_time`` (a mask; the others are late), and
        their timestamps; ``None``: none is."""
        self.note(batch, np.arange(len(ts)), on_time)
        if not on_time.any():
            return None
        if not on_time.all():
            batch, ts = batch.filter(pa.array(on_time)), ts[on_time]
        return batch, ts

    def take(self) -> Batch | None:
        """What went to the side output since the last call (``None``: nothing)."""
        if not self._held:
            return None
        late, self._held = self._held, []
        if len(late) == 1:
            return late[0]
        if all(isinstance(b, pa.RecordBatch) for b in late):
            return pa.concat_batches(late)
        return [r for b in late for r in rows(b)]
