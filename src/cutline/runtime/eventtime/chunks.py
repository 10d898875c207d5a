"""``process`` and ``process_batches`` of tumbling and sliding windows in the keyed layout: a
batch's records grouped by key and window, each group added to its window as one chunk (a
tuple of records, or an Arrow batch): one state update per key and window, not per
record, into the keyed layout's table
(:class:`~cutline.runtime.eventtime.keyed.KeyedWindows`)."""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.eventtime.aggregations import Kind
from cutline.runtime.eventtime.assigners import Session, assign, end_of, ends_of
from cutline.runtime.eventtime.records import RecordColumns
from cutline.runtime.eventtime.store import StoreContext
from cutline.runtime.operators import Batch, rows, to_arrow


def collect(
    context: StoreContext, table: Any, batch: Batch, ts: np.ndarray
) -> list[tuple[Hashable, int, int, Any]]:
    """``process`` and ``process_batches`` on tumbling and sliding windows: the records of
    the batch grouped by key and window, each group added to its window (in ``table``, the
    keyed layout's) as one chunk (a tuple of records, or an Arrow batch): one state update per
    key and window, not per record. Returns the fired windows (kept for the lateness) that
    took records: they fire again."""
    assigner = context.assigner
    assert not isinstance(assigner, Session)
    arrow = context.aggregation.kind is Kind.PROCESS_BATCHES
    if arrow:
        batch = to_arrow(batch, context.records.ctx.name)
    index, starts = assign(assigner, ts)
    on_time = context.lateness.on_time(ends_of(assigner, starts))
    context.late.note(batch, index, on_time)
    if not on_time.all():
        index, starts = index[on_time], starts[on_time]
    if not len(index):
        return []
    records = None if arrow else rows(batch)
    keys, codes = key_codes(context.records, batch, records)
    if keys is None:
        return []
    pair_codes = codes[index]
    keep = pair_codes >= 0  # (a record whose key failed is in no window)
    index, starts, pair_codes = index[keep], starts[keep], pair_codes[keep]
    order = np.lexsort((starts, pair_codes))
    index, starts, pair_codes = index[order], starts[order], pair_codes[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (pair_codes[1:] != pair_codes[:-1]) | (starts[1:] != starts[:-1])
    bounds = np.r_[np.flatnonzero(new), len(order)].tolist()
    refired: list[tuple[Hashable, int, int, Any]] = []
    changed: dict[Hashable, dict[int, tuple[Any, bool]]] = {}
    for a, b in itertools.pairwise(bounds):
        key, start = keys[int(pair_codes[a])], int(starts[a])
        members = index[a:b]
        if arrow:
            chunk: Any = batch.take(pa.array(members))
        else:
            assert records is not None
            chunk = tuple(records[i] for i in members.tolist())
        windows = changed.get(key)
        if windows is None:
            windows = changed[key] = dict(table.get(key) or {})
        entry = windows.get(start)
        end = end_of(assigner, start)
        if entry is None:
            windows[start] = ((chunk,), False)
            context.timers.to_fire.add(end - 1, key, (start, end))
        else:
            acc = (*entry[0], chunk)
            windows[start] = (acc, entry[1])
            if entry[1]:
                refired.append((key, start, end, acc))
    for key, windows in changed.items():
        table[key] = windows
    return refired


def key_codes(
    reader: RecordColumns, batch: Batch, records: list[Any] | None
) -> tuple[list[Any] | None, np.ndarray]:
    """The distinct keys of the batch's records and each record's index among them (-1:
    its key could not be taken: the record failed)."""
    column = reader.key
    if isinstance(batch, pa.RecordBatch) and isinstance(column, str) and records is None:
        if column not in batch.schema.names or batch.column(column).null_count:
            records = rows(batch)  # (named in the per-record failures below)
        else:
            encoded = pc.dictionary_encode(batch.column(column))
            uniques = encoded.dictionary.to_pylist()
            for key in uniques:
                reader.backend.set_current_key(key)  # (checks the key belongs here)
            codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False)).astype(np.int64)
            return uniques, codes
    if records is None:
        records = rows(batch)
    found: dict[Hashable, int] = {}
    codes = np.full(len(records), -1, dtype=np.int64)
    for i, record in enumerate(records):
        try:
            key = reader.get_key(record)
            reader.backend.set_current_key(key)
            codes[i] = found.setdefault(key, len(found))
        except Exception as exc:
            reader.fail(record, exc)
    return list(found), codes
