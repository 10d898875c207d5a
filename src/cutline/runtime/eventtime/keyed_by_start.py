"""Tumbling and sliding windows in keyed state (the bucketing of windows by their start, in
the keyed layout's storage: :class:`~cutline.runtime.eventtime.keyed.KeyedWindows`): per key,
``{window start: (accumulator, fired)}``. The keyed layout does not slice: a record goes into
each of its windows."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.aggregations import group_by_window
from cutline.runtime.eventtime.assigners import Session, assign, end_of, ends_of, starts_of
from cutline.runtime.eventtime.chunks import collect
from cutline.runtime.eventtime.layouts import columns_as_keyed, read_windows
from cutline.runtime.eventtime.store import Fired, StoreContext
from cutline.runtime.operators import Batch, rows
from cutline.runtime.state.segments import SegmentSource

Windows = dict[int, tuple[Any, bool]]
"""A key's windows: ``{start: (accumulator, fired)}``."""


class KeyedByStart:
    """Tumbling and sliding windows of every aggregation in keyed state. Built-ins of an Arrow
    batch take a vectorized path (windows assigned and grouped with NumPy and Arrow, then one
    state update per key and window); ``process`` and ``process_batches`` add a chunk per key
    and window (:mod:`~cutline.runtime.eventtime.chunks`); a user's function, the per-record
    path."""

    def __init__(self, context: StoreContext, table: Any) -> None:
        assigner = context.assigner
        assert not isinstance(assigner, Session)
        self.assigner = assigner
        self.context = context
        self.table = table
        """The keyed layout's windows: per key, its windows."""
        self.aggregation = context.aggregation
        self.lateness = context.lateness
        self.fire_timers = context.timers.to_fire

    # ---------------------------------------------------------------- restored

    def read(self, handle: Mapping[str, Any], store: SegmentSource) -> dict[Hashable, Windows]:
        """The windows a restored handle holds (of either layout), per key."""
        return dict(columns_as_keyed(read_windows(handle, store)))

    def combined(self, old: Windows, new: Windows) -> Windows:
        """A key's windows from two handles."""
        return {**old, **new}

    def windows_of(self, value: Windows) -> Iterable[tuple[int, int, bool]]:
        for start, (_, fired) in value.items():
            yield start, end_of(self.assigner, start), fired

    def open_of(self, key: Hashable, value: Windows) -> list[Fired]:
        """The key's windows not fired yet, with their accumulators."""
        assigner = self.assigner
        return [(key, s, end_of(assigner, s), a) for s, (a, f) in value.items() if not f]

    # ------------------------------------------------------------------ firing

    def fired(
        self, value: Windows | None, start: int, end: int, keep: bool
    ) -> tuple[Windows, Any] | None:
        """The window ``[start, end)`` fires: the key's windows after (it kept, marked fired,
        or dropped) and its accumulator; ``None``: it is not there."""
        windows = dict(value or {})
        entry = windows.get(start)
        if entry is None:
            return None
        if keep:
            windows[start] = (entry[0], True)
        else:
            del windows[start]
        return windows, entry[0]

    def dropped(self, value: Windows, start: int) -> Windows:
        """The key's windows without the one starting at ``start``."""
        windows = dict(value)
        windows.pop(start, None)
        return windows

    # ----------------------------------------------------------------- records

    def add(self, batch: Batch, ts: np.ndarray) -> list[Fired]:
        """Records into each of their windows that is not past; the fired windows (kept for
        the lateness) they update fire again."""
        floors_differ = self.lateness.floors_differ
        if self.aggregation.collects and not floors_differ:
            return collect(self.context, self.table, batch, ts)
        records = self.context.records
        if (
            not floors_differ  # (else the per-record path: lateness per key)
            and self.aggregation.builtin
            and isinstance(batch, pa.RecordBatch)
            and isinstance(records.key, str)
            and records.vectorizable(batch)
        ):
            return self._vectorized(batch, ts)
        return self._per_record(rows(batch), ts)

    def _vectorized(self, batch: pa.RecordBatch, ts: np.ndarray) -> list[Fired]:
        assigner = self.assigner
        index, starts = assign(assigner, ts)
        on_time = self.lateness.on_time(ends_of(assigner, starts))
        self.context.late.note(batch, index, on_time)
        if not on_time.all():
            index, starts = index[on_time], starts[on_time]
        if not len(index):
            return []
        aggregation, key_column = self.aggregation, self.context.records.key
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
        return refired

    def _per_record(self, found: list[Any], ts: np.ndarray) -> list[Fired]:
        records, lateness, aggregation = self.context.records, self.lateness, self.aggregation
        get_key, backend, assigner = records.get_key, self.context.backend, self.assigner
        refired: dict[tuple[Hashable, int], Fired] = {}
        late: list[Any] = []
        for record, stamp in zip(found, ts.tolist(), strict=True):
            try:
                key = get_key(record)
                backend.set_current_key(key)  # (checks the key belongs here)
                starts = starts_of(assigner, stamp)
                windows = dict(self.table.get(key) or {})
                on_time = False
                floor = lateness.floor(key)
                for start in starts:
                    end = end_of(assigner, start)
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
                records.fail(record, exc)
        if late:
            self.context.late.add(late)
        return list(refired.values())
