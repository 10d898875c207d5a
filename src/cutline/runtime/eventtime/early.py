"""Early results every N records of a window (Flink's ``CountTrigger`` as an early trigger).

``window(..., early_records=N)``: once a window of a key has taken ``N`` records since its
last early result (or since it opened), its result so far is emitted (``final`` false) and
the count starts again, before the final result (``final`` true). The count is kept per key
and window as keyed state (``window-early``: per key, ``{window start: records since}``):
checkpointed, restored and rescaled with the windows. A batch emits at most one early result
per window, after the batch (the result after all its records), so how many a window emits
depends on how the records were batched (one record per batch: one every ``N`` exactly); the
final result does not.

A session's count follows it as it merges: the counts of the sessions it swallowed add up
under its start (Flink's rule). Windows that fired (and are kept for the lateness) take no
early results: a late record makes them fire again anyway.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling, assign, end_of
from cutline.runtime.eventtime.layouts import WINDOWS
from cutline.runtime.eventtime.records import RecordColumns
from cutline.runtime.operators import Batch, rows
from cutline.runtime.state.backend import KeyedStateBackend

COUNTS = "window-early"
"""The keyed state of the counts: per key, ``{window start: records so far}``."""


class EarlyRecords:
    """The counts of a keyed window operator's windows, and which took ``every`` more.

    :param backend: the operator's keyed state (the counts, and the windows of the keyed
        layout: :data:`~cutline.runtime.eventtime.layouts.WINDOWS`).
    :param assigner: the operator's windows.
    :param records: how a record's key is read.
    :param every: ``early_records``.
    """

    def __init__(
        self,
        backend: KeyedStateBackend,
        assigner: Tumbling | Sliding | Session,
        records: RecordColumns,
        every: int,
    ) -> None:
        self.assigner = assigner
        self.records = records
        self.every = every
        self.windows = backend.value_table(WINDOWS)
        """The windows of the keyed layout."""
        self.table = backend.value_table(COUNTS)

    def counted(self, batch: Batch, ts: np.ndarray) -> list[tuple[Hashable, int, int, Any]]:
        """Count the batch's records (already in their windows) per key and window; the
        windows not fired yet that took ``every`` records since their last early result
        (their counts start again), with their accumulators: ``(key, start, end,
        accumulator)``."""
        groups: dict[tuple[Hashable, int], int] = {}
        for key, start in self._windows(batch, ts):
            groups[(key, start)] = groups.get((key, start), 0) + 1
        found: list[tuple[Hashable, int, int, Any]] = []
        for (key, stamp), n in groups.items():
            value = self.windows.get(key)
            if value is None:
                continue
            window = self._open_window(value, stamp)
            if window is None:
                continue  # (late, or fired already)
            start, end, acc = window
            counts = dict(self.table.get(key) or {})
            before = sum(c for s, c in counts.items() if start <= s < end)
            for s in [s for s in counts if start <= s < end]:
                del counts[s]  # (a session's swallowed ones: under its start now)
            if before + n >= self.every:
                found.append((key, start, end, acc))
                counts[start] = 0
            else:
                counts[start] = before + n
            self.table[key] = counts
        return found

    def _windows(self, batch: Batch, ts: np.ndarray) -> list[tuple[Hashable, int]]:
        """(key, window start) of each record and window it is in (for sessions: its own
        time, looked up in the key's sessions)."""
        key, assigner = self.records.key, self.assigner
        if isinstance(batch, pa.RecordBatch) and isinstance(key, str):
            keys = batch.column(key).to_pylist()
        else:
            keys = []
            for record in rows(batch):
                try:
                    keys.append(self.records.get_key(record))
                except Exception:  # (the record failed when it was windowed)
                    keys.append(None)
        if isinstance(assigner, Session):
            return [(k, t) for k, t in zip(keys, ts.tolist(), strict=True) if k is not None]
        index, starts = assign(assigner, ts)
        return [
            (keys[i], s)
            for i, s in zip(index.tolist(), starts.tolist(), strict=True)
            if keys[i] is not None
        ]

    def _open_window(self, value: Any, stamp: int) -> tuple[int, int, Any] | None:
        """The window not fired yet that ``stamp`` names (a window's start; for sessions, a
        record's time within one): start, end, accumulator."""
        assigner = self.assigner
        if isinstance(assigner, Session):
            for start, end, acc, fired in value:
                if start <= stamp < end and not fired:
                    return start, end, acc
            return None
        entry = value.get(stamp)
        if entry is None or entry[1]:
            return None
        return stamp, end_of(assigner, stamp), entry[0]

    def forget(self, key: Hashable, start: int, end: int) -> None:
        """The window ``[start, end)`` of ``key`` fired or was dropped: its count goes."""
        counts = self.table.get(key)
        if not counts:
            return
        left = {s: c for s, c in counts.items() if not start <= s < end}
        if len(left) == len(counts):
            return
        if left:
            self.table[key] = left
        else:
            self.table.delete(key)
