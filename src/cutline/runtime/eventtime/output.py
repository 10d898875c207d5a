"""What firing windows emit: per window, the key, ``window_start`` and ``window_end`` (in the
event-time column's type) and the result; and the side output of late records."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.aggregations import Kind
from cutline.runtime.eventtime.assigners import Window
from cutline.runtime.eventtime.spec import WindowSpec
from cutline.runtime.operators import Batch, OperatorContext

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
