"""Session windows of a built-in in the columnar layout (the memory backend's)."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.eventtime.aggregations import UFUNCS, cut_sessions
from cutline.runtime.eventtime.assigners import Session
from cutline.runtime.eventtime.layouts import (
    WINDOWS,
    concat_rows,
    encode_session_rows,
    read_session_rows,
    take_rows,
    windows_as_session_rows,
)
from cutline.runtime.eventtime.store import Restored, StoreContext
from cutline.runtime.eventtime.timers import Timer
from cutline.runtime.operators import Batch, rows
from cutline.runtime.state.backend import KeyedSnapshot, KeyedStateBackend
from cutline.runtime.state.columns import COLUMNS, ColumnChain
from cutline.runtime.state.segments import SegmentStore


class ColumnarSessions:
    """Session windows computing a built-in aggregate on the memory backend, kept as columns:
    one row per open session (key, start, end, accumulator, fired). A batch's records are cut
    into sessions per key with NumPy, merged with the open sessions of the same keys in one
    sorted pass (a session ends where the next one starts at or after the greatest end before
    it), and the sessions whose end the watermark passed fire as one batch.

    They fire through the operator's timers as the other layouts do, but with one timer for
    the earliest: a ``to_fire`` timer at the last millisecond of the first session to end, a
    ``to_drop`` one when the first fired session is past (key and namespace ``None``). When one
    is due, every session it finds due goes, and the next earliest is registered. A session
    only grows as it merges, so a timer found early costs a look and no more.

    The rows are checkpointed beside the (empty) keyed state as a chain of segments of their
    own (:class:`~cutline.runtime.state.columns.ColumnChain`): an incremental checkpoint
    writes the rows of the keys whose sessions changed since the checkpoint it builds on.
    Restored at another parallelism, each subtask keeps the rows of its key groups. Every
    change makes new arrays: a snapshot being written keeps the old ones."""

    def __init__(self, context: StoreContext) -> None:
        assert isinstance(context.assigner, Session)
        self.aggregation = context.aggregation
        self.lateness = context.lateness
        self.late = context.late
        self.output = context.output
        self.records = context.records
        self.gap = context.assigner.gap
        self.rows: dict[str, Any] | None = None
        """The open sessions: ``keys`` (Arrow), ``start``, ``end``, ``acc``, ``count`` (mean),
        ``fired`` (NumPy); ``None``: none."""
        self.chain = ColumnChain(context.state)
        self._touched: list[tuple[int, pa.Array]] = []
        """(snapshot, keys) whose sessions changed: those an incremental checkpoint writes."""
        self.fire_timers, self.cleanup_timers = context.timers.to_fire, context.timers.to_drop
        self._fires_at = MAX_WATERMARK
        """The earliest ``to_fire`` timer registered (a session due then or later)."""
        self._drops_at = MAX_WATERMARK
        """The earliest ``to_drop`` timer registered."""
        self._restore_windows(context.backend, context.restored)
        self._schedule(self.rows)

    def _restore_windows(self, backend: KeyedStateBackend, restored: Restored) -> None:
        """Every restored session as a row: those kept as rows, and those the keyed layout
        wrote (a checkpoint of the disk backend), taken out of keyed state."""
        parts = []
        store = restored.store
        for handle in restored.handles:
            rows = read_session_rows(handle, store) if store is not None else None
            if rows is None:
                continue
            start, stop = handle.get("key_groups", (0, 0))
            if range(start, stop) != backend.key_groups:  # rescaled: my key groups' rows
                rows = take_rows(rows, self.records.owned(rows["keys"]))
            if len(rows["keys"]):
                parts.append(rows)
        table = backend.value_table(WINDOWS)
        keyed = [(key, table.get(key)) for key in list(backend.keys(WINDOWS))]
        converted = windows_as_session_rows(keyed, self.aggregation.mean)
        if converted is not None:
            parts.append(converted)
        for key, _ in keyed:
            table.delete(key)
        self.rows = concat_rows(parts) if parts else None
        checkpoint = restored.checkpoint
        if checkpoint is not None and len(restored.handles) == 1 and not keyed:
            handle = restored.handles[0]
            groups = range(*handle.get("key_groups", (0, 0)))
            if groups == backend.key_groups and handle.get(COLUMNS):
                self.chain.adopt(checkpoint, handle[COLUMNS])  # (later ones build on it)

    @property
    def open_windows(self) -> int:
        rows = self.rows  # (read from the thread that reports the figures: once)
        return 0 if rows is None else int((~rows["fired"]).sum())

    def attach(
        self, taken: KeyedSnapshot, checkpoint_id: int, base: int | None, savepoint: bool
    ) -> None:
        """The rows' chain of segments (:class:`ColumnChain`) takes a segment: the rows of the
        keys whose sessions changed since ``base``, or all."""
        rows, touched = self.rows, list(self._touched)  # (appended to from now on)
        ticket = self.chain.snapshot(checkpoint_id, base, savepoint)
        needed = self.chain.number_of(base)
        if needed is not None:  # (no later snapshot builds on an older one)
            self._touched = [(number, keys) for number, keys in touched if number > needed]

        def encode(since: int | None) -> bytes:
            keys = [k for number, k in touched if since is not None and number > since]
            return encode_session_rows(rows, keys, since)

        def write(store: SegmentStore, name: str) -> dict[str, Any]:
            return self.chain.write(ticket, store, name, encode)

        taken.attached.append(write)

    def _touch(self, keys: pa.Array) -> None:
        """The sessions of ``keys`` changed (an incremental checkpoint writes them)."""
        if len(keys):
            self._touched.append((self.chain.generation, keys))

    def add(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        gap, lateness, records = self.gap, self.lateness, self.records
        if (
            isinstance(batch, pa.RecordBatch)
            and not lateness.floors_differ
            and records.vectorizable(batch)
        ):
            assert isinstance(records.key, str)
            kept = self.late.on_time(batch, ts, lateness.on_time(ts + gap))
            if kept is None:
                return None
            batch, ts = kept
            return self._merge(batch.column(records.key), ts, records.values(batch))
        # record by record (Python records, nulls, or keys keeping a restored watermark)

        def own(key: Hashable, stamp: int) -> list[int]:
            return [] if lateness.is_past(stamp + gap, lateness.floor(key)) else [stamp]

        found = records.one_by_one(rows(batch), ts, own)
        return None if found is None else self._merge(*found)

    def _merge(self, keys: Any, ts: np.ndarray, values: np.ndarray | None) -> Batch | None:
        """Cut the records into sessions per key and merge them with the open ones."""
        kind = self.aggregation.kind
        cut, start, end, acc, counts = cut_sessions(keys, ts, values, kind, self.gap)
        local = {
            "keys": cut,
            "start": start,
            "end": end,
            "acc": acc,
            "count": counts if self.aggregation.mean else None,
            "fired": np.zeros(len(start), dtype=bool),
        }
        self._touch(cut)
        self._schedule(local)  # (merged, a session only ends later)
        if self.rows is None:
            self.rows = local
            return None
        state = self.rows
        if local["keys"].type != state["keys"].type:
            local["keys"] = local["keys"].cast(state["keys"].type)
        touched = np.asarray(
            pc.is_in(state["keys"], value_set=local["keys"]).to_numpy(zero_copy_only=False)
        )
        if not touched.any():
            self.rows = concat_rows([state, local])
            return None
        merged, refire = self._merge_sessions(take_rows(state, touched), local)
        self._schedule(merged)  # (a fired one made open again, or kept longer)
        self.rows = concat_rows([take_rows(state, ~touched), merged])
        if refire is None:
            return None
        return self._session_batch(take_rows(merged, refire))

    def _merge_sessions(
        self, old: dict[str, Any], local: dict[str, Any]
    ) -> tuple[dict[str, Any], np.ndarray | None]:
        """Open sessions of the batch's keys and the batch's sessions, merged where they
        overlap; and which merged ones fired already and must fire again now."""
        kind = self.aggregation.kind
        both = concat_rows([old, local])
        fresh = np.r_[np.zeros(len(old["keys"]), bool), np.ones(len(local["keys"]), bool)]
        encoded = pc.dictionary_encode(both["keys"])
        codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False)).astype(np.int64)
        order = np.lexsort((both["start"], codes))
        codes, start, end = codes[order], both["start"][order], both["end"][order]
        # the greatest end so far within each key: shifted apart per key, so one running
        # maximum over the whole array never crosses from a key to the next
        low = int(min(start.min(), end.min()))
        span = int(end.max()) - low + 1
        if (int(codes.max()) + 1) * span < 2**62:
            running = np.maximum.accumulate(codes * span + (end - low)) - codes * span + low
        else:  # (keys times the span of time would overflow: one key at a time)
            running = end.copy()
            firsts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
            for a, b in itertools.pairwise([*firsts.tolist(), len(codes)]):
                running[a:b] = np.maximum.accumulate(end[a:b])
        new = np.ones(len(order), dtype=bool)
        new[1:] = (codes[1:] != codes[:-1]) | (start[1:] > running[:-1])
        at = np.flatnonzero(new)
        acc = both["acc"][order]
        summed = UFUNCS[kind].reduceat(acc, at)
        fired = np.maximum.reduceat(both["fired"][order], at).astype(bool)
        touched = np.maximum.reduceat(fresh[order], at).astype(bool)
        merged_end = np.maximum.reduceat(end, at)
        merged = {
            "keys": both["keys"].take(pa.array(order[at])),
            "start": start[at],
            "end": merged_end,
            "acc": summed,
            "count": None
            if not self.aggregation.mean
            else np.add.reduceat(both["count"][order], at),
            "fired": fired,
        }
        # a fired session that a late record (within the lateness) changed fires again now
        # if its end is still passed, else when it is
        changed = fired & touched
        if not changed.any():
            return merged, None
        passed = merged_end - 1 <= self.lateness.watermark
        merged["fired"] = fired & ~(changed & ~passed)
        refire = changed & passed
        return merged, (refire if refire.any() else None)

    def _session_batch(self, rows: dict[str, Any], final: bool = True) -> pa.RecordBatch:
        acc = rows["acc"]
        if self.aggregation.mean:
            acc = acc.astype(float) / rows["count"]
        return self.output.builtin_batch(rows["keys"], rows["start"], rows["end"], acc, final)

    def _schedule(self, rows: dict[str, Any] | None) -> None:
        """Timers for the earliest of ``rows`` (sessions new or changed) to fire, and to be
        dropped once fired, if earlier than those registered."""
        if rows is None or not len(rows["keys"]):
            return
        fired = rows["fired"]
        if not fired.all():
            first = int(rows["end"][~fired].min()) - 1
            if first < self._fires_at:
                self._fires_at = first
                self.fire_timers.add(first, None, None)
        if fired.any():
            past = self.lateness.cleanup_time(int(rows["end"][fired].min()))
            if past < self._drops_at:
                self._drops_at = past
                self.cleanup_timers.add(past, None, None)

    def holds_windows(self) -> bool:
        return self.rows is not None

    def so_far(self) -> Batch | None:
        rows = self.rows
        if rows is None or rows["fired"].all():
            return None
        return self._session_batch(take_rows(rows, ~rows["fired"]), final=False)

    def fire(self, due: Iterable[Timer]) -> Batch | None:
        """The sessions whose last millisecond the watermark reached fire (kept for the
        lateness, or dropped)."""
        if not list(due):  # (taken whole: what they name is found by the watermark)
            return None
        self._fires_at = MAX_WATERMARK  # (the next earliest: registered below)
        rows, watermark = self.rows, self.lateness.watermark
        if rows is None:
            return None
        fired = rows["fired"]
        ready = ~fired & (rows["end"] - 1 <= watermark)
        out = self._session_batch(take_rows(rows, ready)) if ready.any() else None
        if ready.any():
            self._touch(rows["keys"].filter(pa.array(ready)))
            if self.lateness.keeps_fired:
                rows = {**rows, "fired": fired | ready}
            else:
                rows = take_rows(rows, ~ready)
        self.rows = rows if len(rows["keys"]) else None
        self._schedule(self.rows)
        return out

    def drop(self, due: Iterable[Timer]) -> None:
        """The fired sessions past the lateness are dropped."""
        if not list(due):
            return
        self._drops_at = MAX_WATERMARK
        rows = self.rows
        if rows is None:
            return
        past = rows["fired"] & ~self.lateness.on_time(rows["end"])
        if past.any():
            self._touch(rows["keys"].filter(pa.array(past)))
            rows = take_rows(rows, ~past)
        self.rows = rows if len(rows["keys"]) else None
        self._schedule(self.rows)
