"""Session windows in keyed state (the bucketing of sessions, in the keyed layout's storage:
:class:`~cutline.runtime.eventtime.keyed.KeyedWindows`): per key, a sorted tuple of its
sessions ``(start, end, accumulator, fired)``, which merge as records come."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.aggregations import cut_sessions
from cutline.runtime.eventtime.assigners import Session
from cutline.runtime.eventtime.layouts import read_session_rows, session_rows_as_windows
from cutline.runtime.eventtime.store import Fired, StoreContext
from cutline.runtime.operators import Batch, rows
from cutline.runtime.state.segments import SegmentSource

Sessions = tuple[tuple[int, int, Any, bool], ...]
"""A key's sessions: ``(start, end, accumulator, fired)``, sorted."""


class KeyedSessions:
    """Session windows of every aggregation in keyed state: a record opens the session
    ``[t, t + gap)``, merged with each of its key's sessions it overlaps or touches (Flink's
    rule). Built-ins of an Arrow batch are cut into sessions per key with NumPy first (one
    merge per key and session of the batch); other records one by one."""

    def __init__(self, context: StoreContext, table: Any) -> None:
        assigner = context.assigner
        assert isinstance(assigner, Session)
        self.gap = assigner.gap
        self.context = context
        self.table = table
        """The keyed layout's windows: per key, its sessions."""
        self.aggregation = context.aggregation
        self.lateness = context.lateness
        self.timers = context.timers

    # ---------------------------------------------------------------- restored

    def read(self, handle: Mapping[str, Any], store: SegmentSource) -> dict[Hashable, Sessions]:
        """The sessions a restored handle holds (of either layout), per key."""
        found = read_session_rows(handle, store)
        return {} if found is None else dict(session_rows_as_windows(found))

    def combined(self, old: Sessions, new: Sessions) -> Sessions:
        """A key's sessions from two handles (a key is in one old subtask: never, but kept
        whole)."""
        return tuple(sorted((*old, *new)))

    def windows_of(self, value: Sessions) -> Iterable[tuple[int, int, bool]]:
        for start, end, _, fired in value:
            yield start, end, fired

    def open_of(self, key: Hashable, value: Sessions) -> list[Fired]:
        """The key's sessions not fired yet, with their accumulators."""
        return [(key, s, e, acc) for s, e, acc, fired in value if not fired]

    # ------------------------------------------------------------------ firing

    def fired(
        self, value: Sessions | None, start: int, end: int, keep: bool
    ) -> tuple[Sessions, Any] | None:
        """The session ``[start, end)`` fires: the key's sessions after (it kept, marked
        fired, or dropped) and its accumulator; ``None``: it is not there."""
        sessions = list(value or ())
        for i, (s_start, s_end, acc, _) in enumerate(sessions):
            if s_start == start and s_end == end:
                if keep:
                    sessions[i] = (s_start, s_end, acc, True)
                else:
                    del sessions[i]
                return tuple(sessions), acc
        return None

    def dropped(self, value: Sessions, start: int) -> Sessions:
        """The key's sessions without the fired one starting at ``start``."""
        return tuple(s for s in value if s[0] != start or not s[3])

    # ----------------------------------------------------------------- records

    def add(self, batch: Batch, ts: np.ndarray) -> list[Fired]:
        """Records into their keys' sessions; the fired sessions (kept for the lateness)
        they made grow past the watermark fire again."""
        records = self.context.records
        if (
            not self.lateness.floors_differ  # (else the per-record path: lateness per key)
            and self.aggregation.builtin
            and isinstance(batch, pa.RecordBatch)
            and isinstance(records.key, str)
            and records.vectorizable(batch)
        ):
            return self._vectorized(batch, ts)
        return self._per_record(rows(batch), ts)

    def _vectorized(self, batch: pa.RecordBatch, ts: np.ndarray) -> list[Fired]:
        key_column, gap = self.context.records.key, self.gap
        assert isinstance(key_column, str)
        kept = self.context.late.on_time(batch, ts, self.lateness.on_time(ts + gap))
        if kept is None:
            return []
        batch, ts = kept
        keys, firsts, ends, acc, counts = cut_sessions(
            batch.column(key_column),
            ts,
            self.context.records.values(batch),
            self.aggregation.kind,
            gap,
        )
        parts: list[Any] = acc.tolist()
        if self.aggregation.mean:  # (sum, count)
            parts = list(zip(parts, counts.tolist(), strict=True))
        refired: list[Fired] = []
        for key, first, end, part in zip(
            keys.to_pylist(), firsts.tolist(), ends.tolist(), parts, strict=True
        ):
            refired += self._merge(key, first, end, part)
        return refired

    def _per_record(self, found: list[Any], ts: np.ndarray) -> list[Fired]:
        records, lateness, aggregation = self.context.records, self.lateness, self.aggregation
        get_key, backend = records.get_key, self.context.backend
        refired: dict[tuple[Hashable, int], Fired] = {}
        late: list[Any] = []
        for record, stamp in zip(found, ts.tolist(), strict=True):
            try:
                key = get_key(record)
                backend.set_current_key(key)  # (checks the key belongs here)
                end = stamp + self.gap
                if lateness.is_past(end, lateness.floor(key)):
                    late.append(record)
                    continue
                acc = aggregation.add(aggregation.create(), record)
                for hit in self._merge(key, stamp, end, acc):
                    refired[(key, hit[1])] = hit
            except Exception as exc:
                records.fail(record, exc)
        if late:
            self.context.late.add(late)
        return list(refired.values())

    def _merge(self, key: Hashable, start: int, end: int, acc: Any) -> list[Fired]:
        """Add the session ``[start, end)`` with ``acc`` to ``key``'s, merging those it
        overlaps; returns the merged session if it fired already (to fire again)."""
        sessions = self.table.get(key) or ()
        kept = []
        fired = False
        merge = self.aggregation.merge
        timers, lateness = self.timers, self.lateness
        for s_start, s_end, s_acc, s_fired in sessions:
            if s_start <= end and start <= s_end:  # overlaps or touches: one session (Flink)
                start, end = min(start, s_start), max(end, s_end)
                acc = merge(s_acc, acc)
                fired = fired or s_fired
                if s_fired:
                    timers.to_drop.discard(lateness.cleanup_time(s_end), key, (s_start, s_end))
                else:
                    timers.to_fire.discard(s_end - 1, key, (s_start, s_end))
            else:
                kept.append((s_start, s_end, s_acc, s_fired))
        # a fired session that grew past the watermark fires again when its new end passes
        refire_now = fired and lateness.watermark >= end - 1
        if fired and not refire_now:
            fired = False
        kept.append((start, end, acc, fired))
        kept.sort()
        self.table[key] = tuple(kept)
        timers.keyed(key, start, end, fired, lateness)
        return [(key, start, end, acc)] if refire_now else []
