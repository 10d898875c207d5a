"""Session windows of a built-in in the columnar layout (the memory backend's)."""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.protocol.watermarks import MAX_WATERMARK
from cutline.runtime.eventtime.aggregations import UFUNCS, cut_sessions
from cutline.runtime.eventtime.assigners import Session
from cutline.runtime.eventtime.keyed import WindowOperator
from cutline.runtime.eventtime.lateness import in_time
from cutline.runtime.eventtime.layouts import (
    WINDOWS,
    concat_rows,
    encode_session_rows,
    read_session_rows,
    take_rows,
    windows_as_session_rows,
)
from cutline.runtime.eventtime.spec import WindowSpec
from cutline.runtime.operators import Batch, OperatorContext, rows
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.columns import COLUMNS, ColumnChain
from cutline.runtime.state.segments import SegmentStore


class ColumnarSessionOperator(WindowOperator):
    """Session windows computing a built-in aggregate on the memory backend, kept as columns:
    one row per open session (key, start, end, accumulator, fired). A batch's records are cut
    into sessions per key with NumPy, merged with the open sessions of the same keys in one
    sorted pass (a session ends where the next one starts at or after the greatest end before
    it), and the sessions whose end the watermark passed fire as one batch.

    The rows are checkpointed beside the (empty) keyed state as a chain of segments of their
    own (:class:`~cutline.runtime.state.columns.ColumnChain`): an incremental checkpoint
    writes the rows of the keys whose sessions changed since the checkpoint it builds on.
    Restored at another parallelism, each subtask keeps the rows of its key groups. Every
    change makes new arrays: a snapshot being written keeps the old ones."""

    def __init__(self, logic: WindowSpec, ctx: OperatorContext, state: Any) -> None:
        assert isinstance(logic.assigner, Session)
        self.gap = logic.assigner.gap
        self.rows: dict[str, Any] | None = None
        """The open sessions: ``keys`` (Arrow), ``start``, ``end``, ``acc``, ``count`` (mean),
        ``fired`` (NumPy); ``None``: none."""
        self.columns = ColumnChain(ctx.state)
        self._touched: list[tuple[int, pa.Array]] = []
        """(snapshot, keys) whose sessions changed: those an incremental checkpoint writes."""
        super().__init__(logic, ctx, state)  # (restores the sessions: _restore_windows)

    def _restore_windows(self) -> None:
        """Every restored session as a row: those kept as rows, and those the keyed layout
        wrote (a checkpoint of the disk backend), taken out of keyed state."""
        parts = []
        store = self.ctx.restore_store
        for handle in self.restored:
            rows = read_session_rows(handle, store) if store is not None else None
            if rows is None:
                continue
            start, stop = handle.get("key_groups", (0, 0))
            if range(start, stop) != self.backend.key_groups:  # rescaled: my key groups' rows
                rows = take_rows(rows, self._owned(rows["keys"]))
            if len(rows["keys"]):
                parts.append(rows)
        keyed = [(key, self.table.get(key)) for key in list(self.backend.keys(WINDOWS))]
        converted = windows_as_session_rows(keyed, self.aggregation.mean)
        if converted is not None:
            parts.append(converted)
        for key, _ in keyed:
            self.table.delete(key)
        self.rows = concat_rows(parts) if parts else None
        restored = self.ctx.restore_checkpoint
        if restored is not None and len(self.restored) == 1 and not keyed:
            handle = self.restored[0]
            groups = range(*handle.get("key_groups", (0, 0)))
            if groups == self.backend.key_groups and handle.get(COLUMNS):
                self.columns.adopt(restored, handle[COLUMNS])  # (later ones build on it)

    @property
    def open_windows(self) -> int:
        rows = self.rows  # (read from the thread that reports the figures: once)
        return 0 if rows is None else int((~rows["fired"]).sum())

    def figures(self) -> dict[str, int] | None:
        found = self.rows
        rows = 0 if found is None else len(found["keys"])
        return {"late": self.late_records, "windows": self.open_windows, "timers": rows}

    def snapshot(
        self, checkpoint_id: int, *, base: int | None = None, savepoint: bool = False
    ) -> KeyedSnapshot:
        taken = super().snapshot(checkpoint_id, base=base, savepoint=savepoint)
        rows, touched = self.rows, list(self._touched)  # (appended to from now on)
        ticket = self.columns.snapshot(checkpoint_id, base, savepoint)
        needed = self.columns.number_of(base)
        if needed is not None:  # (no later snapshot builds on an older one)
            self._touched = [(number, keys) for number, keys in touched if number > needed]

        def encode(since: int | None) -> bytes:
            keys = [k for number, k in touched if since is not None and number > since]
            return encode_session_rows(rows, keys, since)

        def write(store: SegmentStore, name: str) -> dict[str, Any]:
            return self.columns.write(ticket, store, name, encode)

        taken.attached.append(write)
        return taken

    def _touch(self, keys: pa.Array) -> None:
        """The sessions of ``keys`` changed (an incremental checkpoint writes them)."""
        if len(keys):
            self._touched.append((self.columns.generation, keys))

    def _records(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        gap = self.gap
        if (
            isinstance(batch, pa.RecordBatch)
            and self.watermark >= self._ceiling
            and self._vectorizable(batch)
        ):
            assert isinstance(self.key, str)
            kept = self._sessions_on_time(batch, ts, gap)
            if kept is None:
                return None
            batch, ts = kept
            keys = batch.column(self.key)
            values = None
            if self.aggregation.takes_values:
                assert self.aggregation.field is not None
                values = np.asarray(
                    batch.column(self.aggregation.field).to_numpy(zero_copy_only=False)
                )
            return self._merge(keys, ts, values)
        # record by record (Python records, nulls, or keys keeping a restored watermark)

        def own(key: Hashable, stamp: int) -> list[int]:
            return [] if self._late_window(stamp + gap, self._floor(key)) else [stamp]

        found = self._record_columns(rows(batch), ts, own)
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
        passed = merged_end - 1 <= self.watermark
        merged["fired"] = fired & ~(changed & ~passed)
        refire = changed & passed
        return merged, (refire if refire.any() else None)

    def _session_batch(self, rows: dict[str, Any], final: bool = True) -> pa.RecordBatch:
        acc = rows["acc"]
        if self.aggregation.mean:
            acc = acc.astype(float) / rows["count"]
        return self._builtin_batch(rows["keys"], rows["start"], rows["end"], acc, final)

    def _holds_windows(self) -> bool:
        return self.rows is not None

    def _so_far(self) -> Batch | None:
        rows = self.rows
        if rows is None or rows["fired"].all():
            return None
        return self._session_batch(take_rows(rows, ~rows["fired"]), final=False)

    def _fire_upto(self, watermark: int) -> Batch | None:
        watermark = self.watermark = max(self.watermark, watermark)
        rows = self.rows
        if rows is None:
            return None
        due = ~rows["fired"] & (rows["end"] - 1 <= watermark)
        keep = self.lateness > 0 and watermark != MAX_WATERMARK
        dropped = rows["fired"] & ~in_time(rows["end"], self.lateness, watermark)
        out = self._session_batch(take_rows(rows, due)) if due.any() else None
        if keep:
            if due.any():
                rows = {**rows, "fired": rows["fired"] | due}
            remove = dropped
        else:
            remove = due | rows["fired"]
        if due.any() or remove.any():
            self._touch(rows["keys"].filter(pa.array(due | remove)))
        if remove.any():
            rows = take_rows(rows, ~remove)
        self.rows = rows if len(rows["keys"]) else None
        return out
