"""Tumbling windows of a built-in in the columnar layout (the memory backend's), and the
columns of keys and accumulators that the sliced layout keeps too."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.eventtime.aggregations import SAFE, UFUNCS, adds, grouped_parts, largest
from cutline.runtime.eventtime.assigners import Session, assign, end_of, ends_of, starts_of
from cutline.runtime.eventtime.lateness import cleanup_time, in_time, is_past
from cutline.runtime.eventtime.layouts import (
    WINDOWS,
    WindowParts,
    WindowState,
    encode_windows,
    keyed_as_columns,
    read_windows,
)
from cutline.runtime.eventtime.operator import WindowOperator
from cutline.runtime.eventtime.timers import Timer
from cutline.runtime.operators import Batch, rows
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.columns import COLUMNS, ColumnChain
from cutline.runtime.state.segments import SegmentStore


@dataclass
class WindowColumns:
    """One window of :class:`ColumnarWindows` (or a slice of
    :class:`~cutline.runtime.eventtime.sliced_windows.SlicedWindows`): its keys and their
    accumulators, as columns."""

    start: int
    keys: pa.Array
    """Every key with records in the window, once each."""
    acc: np.ndarray
    """Per key: its count, sum, least or greatest value (mean: its sum)."""
    count: np.ndarray | None = None
    """Mean: per key, how many values its sum holds."""
    version: np.ndarray = field(kw_only=True)
    """Per key: the snapshot its accumulator last changed for (0: restored), so that an
    incremental checkpoint writes the keys changed since the one it builds on."""
    born: int = 0
    """The snapshot the window was made for (0: restored)."""
    fired: bool = False
    """Fired, and kept for the allowed lateness."""
    waiting: np.ndarray | None = None
    """Of a fired window, the positions of the keys it has not fired for yet (restored so):
    they fire when the watermark passes its end."""
    shared: bool = False
    """A snapshot holds its arrays: they are copied before they change."""
    index: dict[Any, int] | None = field(default=None, repr=False)
    """Each key's position, once the window is large beside the batches merged into it
    (:func:`key_positions`): a batch then looks its keys up instead of hashing all the window's."""


class WindowsByStart:
    """What the columnar layouts of windows by their start share (:class:`ColumnarWindows`,
    :class:`~cutline.runtime.eventtime.run_windows.RunWindows`, and the sliced layouts over
    them): the windows by start; a window fires through one timer for all its keys (the
    timer's key is ``None``, its namespace the window's start), is kept fired for the allowed
    lateness, then dropped; what fires goes out as one batch."""

    windows: dict[int, Any]
    """What each window holds, by its start (in the layout's own way)."""

    def __init__(self, op: WindowOperator) -> None:
        assert not isinstance(op.assigner, Session)
        self.op = op
        self.aggregation = op.aggregation
        self.lateness = op.lateness
        self.assigner = op.assigner
        """Their assigner (:func:`~cutline.runtime.eventtime.assigners.end_of` says where a
        window ends)."""
        self.fire_timers, self.cleanup_timers = op.timers.to_fire, op.timers.to_drop
        self.chain = ColumnChain(op.ctx.state)

    def _add_window(self, window: Any) -> None:
        """A window (its ``start``, whether it ``fired``, the keys ``waiting`` to) is held,
        with its timers."""
        self.windows[window.start] = window
        if window.fired:
            self._keep(window.start)
        if not window.fired or window.waiting is not None:
            self._schedule(window.start)

    def _schedule(self, window: int) -> None:
        """The window (of all its keys: the timer's key is ``None``) fires when the watermark
        reaches its last millisecond."""
        self.fire_timers.add(end_of(self.assigner, window) - 1, None, window)

    def _keep(self, window: int) -> None:
        """The fired window is kept for the allowed lateness, then dropped."""
        end = end_of(self.assigner, window)
        self.cleanup_timers.add(cleanup_time(end, self.lateness), None, window)

    def holds_windows(self) -> bool:
        return bool(self.windows)

    def drop(self, due: Iterable[Timer]) -> None:
        """The fired windows of the due ``to_drop`` timers are past: dropped."""
        for _, _, start in due:
            window = self.windows.get(start)
            if window is not None and window.fired:
                self._drop(start)

    def _drop(self, start: int) -> None:
        """The window at ``start`` is dropped."""
        raise NotImplementedError

    def _batch(
        self, fired: list[tuple[int, pa.Array, np.ndarray]], final: bool = True
    ) -> pa.RecordBatch:
        """The output of windows firing: per window its start, its keys and their results."""
        return fired_batch(self.op, fired, final)


class ColumnarWindows(WindowsByStart):
    """Tumbling windows computing a built-in aggregate (``count``, ``sum``, ``min``,
    ``max``, ``mean``) on the memory backend: each window keeps its keys and their
    accumulators as columns, merged a batch at a time (records grouped by key and window with
    Arrow, each window's groups merged into its columns with ``index_in`` and NumPy), and
    fires as one batch. No Python runs per record nor per key.

    What the windows hold is checkpointed beside the (empty) keyed state as a chain of
    segments of its own (:class:`~cutline.runtime.state.columns.ColumnChain`): incremental
    checkpoints write, of each window, the keys whose accumulators changed since the
    checkpoint they build on (each key's ``version`` says when it last did). Restored at
    another parallelism, each subtask keeps the keys of its key groups. A window's arrays are
    shared with a snapshot being written and are copied before they change.

    A window fires through one timer for all its keys (the timer's key is ``None``, its
    namespace the window's start)."""

    def __init__(self, op: WindowOperator) -> None:
        super().__init__(op)
        self.windows: dict[int, WindowColumns] = {}
        self._restore_windows()

    _adopts = True
    """Whether later checkpoints may build on the restored chain (it holds the windows as
    this operator does)."""  # (restores the windows: _restore_windows)

    def _restore_windows(self) -> None:
        """Every restored window as columns (:func:`restored_parts`). A window that fired for
        some of its keys only (the old subtasks' watermarks differed at the checkpoint, or a
        record within the lateness came for a new key) fires for the others when the
        watermark passes its end."""
        for window_start, pieces in restored_parts(self.op, self.chain, self._adopts).items():
            keys, acc, count, flags = joined(pieces)
            columns = WindowColumns(
                window_start,
                keys,
                acc,
                count,
                version=np.zeros(len(flags), dtype=np.int64),
                fired=bool(flags.any()),
            )
            if columns.fired and not flags.all():
                columns.waiting = np.flatnonzero(~flags)
            self._add_window(columns)

    # ---------------------------------------------------------------- figures

    @property
    def open_windows(self) -> int:
        return sum(  # (read from the thread that reports the figures: a copy of the list)
            len(p.keys) if not p.fired else len(p.waiting) if p.waiting is not None else 0
            for p in list(self.windows.values())
        )

    def attach(
        self, taken: KeyedSnapshot, checkpoint_id: int, base: int | None, savepoint: bool
    ) -> None:
        """The windows' chain of segments (:class:`ColumnChain`) takes a segment: the keys
        changed since ``base``, or all."""
        encode = self._frozen()
        ticket = self.chain.snapshot(checkpoint_id, base, savepoint)

        def write(store: SegmentStore, name: str) -> dict[str, Any]:
            return self.chain.write(ticket, store, name, encode)

        taken.attached.append(write)

    def _frozen(self) -> Callable[[int | None], bytes]:
        """What a snapshot holds of the windows (their arrays, shared from now on), and how
        it is encoded as a segment (:func:`~cutline.runtime.eventtime.layouts.encode_windows`)."""
        held = frozen(self.windows.values())
        return lambda since: encode_windows(held, since)

    # ---------------------------------------------------------------- records

    def add(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        found = window_triples(self.op, batch, ts)
        return None if found is None else self._merge(*found)

    def _merge(self, keys: pa.Array, starts: np.ndarray, values: np.ndarray | None) -> Batch | None:
        """Merge (key, window start, value) triples into the windows; the windows already
        fired that they update (allowed lateness) fire again."""
        refired: list[tuple[WindowColumns, pa.Array, np.ndarray]] = []
        merged = self._grouped_into(self.windows, self._add_window, keys, starts, values)
        for columns, these, positions in merged:
            if positions is not None and columns.fired:
                if columns.waiting is not None:  # (those fire when the watermark passes)
                    fresh = ~np.isin(positions, columns.waiting)
                    these, positions = these.filter(pa.array(fresh)), positions[fresh]
                refired.append((columns, these, positions))
        if not refired:
            return None
        return self._batch(
            [
                (columns.start, keys_, self._values(columns)[positions])
                for columns, keys_, positions in refired
            ]
        )

    def _grouped_into(
        self,
        into: dict[int, WindowColumns],
        add: Callable[[WindowColumns], None],
        keys: pa.Array,
        starts: np.ndarray,
        values: Any,
    ) -> list[tuple[WindowColumns, pa.Array, np.ndarray | None]]:
        """(key, start, value) triples grouped by key and start, each start's groups merged
        into its columns in ``into`` (new ones made and given to ``add``): per start, its
        columns, the keys, and their positions there (``None``: the columns are new)."""
        group_keys, group_starts, parts, counts = grouped_parts(
            keys, starts, values, self.aggregation.kind
        )
        found: list[tuple[WindowColumns, pa.Array, np.ndarray | None]] = []
        for start in np.unique(group_starts).tolist():
            mask = group_starts == start
            these = group_keys.filter(pa.array(mask))
            columns = into.get(start)
            if columns is None:
                generation = self.chain.generation
                columns = WindowColumns(
                    start,
                    these,
                    parts[mask].copy(),
                    None if counts is None else counts[mask].copy(),
                    version=np.full(len(these), generation, dtype=np.int64),
                    born=generation,
                )
                add(columns)
                found.append((columns, these, None))
                continue
            at = self._combine(
                columns, these, parts[mask], None if counts is None else counts[mask]
            )
            found.append((columns, these, at))
        return found

    def _combine(
        self, columns: WindowColumns, keys: pa.Array, parts: np.ndarray, counts: np.ndarray | None
    ) -> np.ndarray:
        """Merge one window's groups into its columns; their positions in it."""
        if keys.type != columns.keys.type:
            if not len(columns.keys):  # (a window fired empty of keys of its own)
                columns.keys, columns.index = keys.slice(0, 0), None
            else:
                keys = keys.cast(columns.keys.type)
        found = key_positions(columns, keys)
        old = found >= 0
        if columns.shared:  # a snapshot holds the arrays
            columns.acc = columns.acc.copy()
            columns.count = None if columns.count is None else columns.count.copy()
            columns.version = columns.version.copy()
            columns.shared = False
        generation = self.chain.generation
        kind = self.aggregation.kind
        if old.any():
            at, add = found[old], parts[old]
            if (
                adds(kind)
                and columns.acc.dtype.kind in "iu"
                and (largest(add) >= SAFE or largest(columns.acc[at]) >= SAFE)
            ):
                columns.acc = columns.acc.astype(object)  # (Python ints: no overflow)
            columns.acc[at] = UFUNCS[kind](columns.acc[at], add)
            columns.version[at] = generation
            if columns.count is not None and counts is not None:
                columns.count[at] = columns.count[at] + counts[old]
        positions = found.copy()
        new = ~old
        if new.any():
            size = len(columns.keys)
            added_keys = keys.filter(pa.array(new))
            if columns.index is not None:
                columns.index.update(
                    zip(added_keys.to_pylist(), range(size, size + len(added_keys)), strict=True)
                )
            columns.keys = pa.concat_arrays([columns.keys, added_keys])
            added = parts[new]
            if columns.acc.dtype != added.dtype:
                common = np.result_type(columns.acc.dtype, added.dtype)
                columns.acc = columns.acc.astype(common)
            columns.acc = np.concatenate([columns.acc, added])
            columns.version = np.concatenate(
                [columns.version, np.full(len(added), generation, dtype=np.int64)]
            )
            if columns.count is not None and counts is not None:
                columns.count = np.concatenate([columns.count, counts[new]])
            positions[new] = np.arange(size, size + int(new.sum()))
        return positions

    def _values(self, columns: WindowColumns) -> np.ndarray:
        """A window's results per key (the mean divides)."""
        if self.aggregation.mean:
            assert columns.count is not None
            means: np.ndarray = columns.acc.astype(float) / columns.count
            return means
        return columns.acc

    # ----------------------------------------------------------------- firing

    def so_far(self) -> Batch | None:
        open_ = [(p.start, p.keys, self._values(p)) for p in self.windows.values() if not p.fired]
        return self._batch(open_, final=False) if open_ else None

    def fire(self, due: Iterable[Timer]) -> Batch | None:
        fired: list[tuple[int, pa.Array, np.ndarray]] = []
        keep = self.op.keeps_fired
        for _, _, start in due:
            columns = self.windows.get(start)
            if columns is None:
                continue
            if columns.fired:  # (restored fired for some keys: now for the others)
                if columns.waiting is not None:
                    waiting, columns.waiting = columns.waiting, None
                    fired.append(
                        (
                            start,
                            columns.keys.take(pa.array(waiting)),
                            self._values(columns)[waiting],
                        )
                    )
                continue
            fired.append((start, columns.keys, self._values(columns)))
            if keep:
                columns.fired = True
                self._keep(start)
            else:
                self._drop(start)
        return self._batch(fired) if fired else None

    def _drop(self, start: int) -> None:
        self.windows.pop(start, None)


def frozen(held: Iterable[WindowColumns]) -> list[WindowState]:
    """Windows (or slices) as a snapshot holds them: their arrays, shared from now on (they
    are copied before they change)."""
    found: list[WindowState] = []
    for p in held:
        p.shared = True
        found.append((p.start, p.keys, p.acc, p.count, p.version, p.fired, p.waiting, p.born))
    return found


INDEXED = 8
"""A window at least this many times larger than a batch's keys for it keeps an index of
its keys (:attr:`WindowColumns.index`)."""


def key_positions(columns: WindowColumns, keys: pa.Array) -> np.ndarray:
    """Where each of ``keys`` is among the window's keys (-1: not there). A window much
    larger than the batch looks them up in its index of keys (made once, kept as keys come):
    hashing every key of the window again for each batch would cost as much as the window;
    a small one is hashed whole (Arrow's ``index_in``)."""
    indexable = (
        pa.types.is_integer(keys.type)
        or pa.types.is_string(keys.type)
        or pa.types.is_large_string(keys.type)
    )
    if columns.index is None and (not indexable or len(columns.keys) < INDEXED * len(keys) + 1024):
        found = pc.fill_null(pc.index_in(keys, value_set=columns.keys), -1)
        return np.asarray(found.to_numpy(zero_copy_only=False))
    if columns.index is None:
        columns.index = dict(zip(columns.keys.to_pylist(), range(len(columns.keys)), strict=True))
    get = columns.index.get
    return np.fromiter((get(k, -1) for k in keys.to_pylist()), dtype=np.int64, count=len(keys))


def restored_parts(
    op: WindowOperator, chain: ColumnChain, adopts: bool
) -> dict[int, list[WindowParts]]:
    """Every restored window of a columnar layout, per start its parts (one per old subtask
    whose handle held it): those kept as columns, and those the keyed layout wrote, taken out
    of keyed state. Restored at another parallelism, the keys of this subtask's key groups
    only. With ``adopts``, and exactly one handle of exactly this subtask's key groups, later
    checkpoints of ``chain`` may build on the restored chain."""
    parts: dict[int, list[WindowParts]] = {}
    mine = op.backend.key_groups
    store = op.ctx.restore_store
    for handle in op.restored:
        start, stop = handle.get("key_groups", (0, 0))
        whole = range(start, stop) == mine
        for window_start, keys, acc, count, flags in (
            read_windows(handle, store) if store is not None else ()
        ):
            if not whole:  # rescaled: the keys of my key groups only
                keep = op.owned(keys)
                if not keep.any():
                    continue
                keys, acc, flags = keys.filter(pa.array(keep)), acc[keep], flags[keep]
                count = count[keep] if count is not None else None
            parts.setdefault(window_start, []).append((window_start, keys, acc, count, flags))
    table = op.backend.value_table(WINDOWS)
    keyed = [(key, table.get(key)) for key in list(op.backend.keys(WINDOWS))]
    for found in keyed_as_columns(keyed, op.aggregation.mean):
        parts.setdefault(found[0], []).append(found)
    for key, _ in keyed:
        table.delete(key)
    restored = op.ctx.restore_checkpoint
    if restored is not None and len(op.restored) == 1 and not keyed and adopts:
        handle = op.restored[0]
        if range(*handle.get("key_groups", (0, 0))) == mine and handle.get(COLUMNS):
            chain.adopt(restored, handle[COLUMNS])  # (later ones build on it)
    return parts


def joined(pieces: list[WindowParts]) -> tuple[pa.Array, np.ndarray, np.ndarray | None, np.ndarray]:
    """The parts of one restored window (of old subtasks: disjoint keys) one after another:
    its keys, accumulators, counts (a mean's) and each key's ``fired`` flag."""
    first = pieces[0][1].type
    counts = [piece[3] for piece in pieces if piece[3] is not None]
    return (
        pa.concat_arrays([piece[1].cast(first) for piece in pieces]),
        np.concatenate([piece[2] for piece in pieces]),
        np.concatenate(counts) if counts else None,
        np.concatenate([piece[4] for piece in pieces]),
    )


def window_triples(
    op: WindowOperator, batch: Batch, ts: np.ndarray
) -> tuple[pa.Array, np.ndarray, np.ndarray | None] | None:
    """A batch's records as (key, window start, value) columns, once per window each is in
    (a tumbling assigner: one) that is not past; the late ones go to the side output. Arrow
    batches of a key column take the vectorized path; Python records, nulls, or keys keeping
    a restored watermark the per-record one. ``None``: nothing is left."""
    assigner, lateness = op.assigner, op.lateness
    assert not isinstance(assigner, Session)
    if isinstance(batch, pa.RecordBatch) and not op.floors_differ and op.vectorizable(batch):
        assert isinstance(op.key, str)
        index, starts = assign(assigner, ts)
        on_time = in_time(ends_of(assigner, starts), lateness, op.watermark)
        op.note_late(batch, index, on_time)
        if not on_time.all():
            index, starts = index[on_time], starts[on_time]
        if not len(index):
            return None
        taken = pa.array(index)
        keys = batch.column(op.key).take(taken)
        values = None
        if op.aggregation.takes_values:
            assert op.aggregation.field is not None
            column = batch.column(op.aggregation.field).take(taken)
            values = np.asarray(column.to_numpy(zero_copy_only=False))
        return keys, starts, values

    def windows(key: Hashable, stamp: int) -> list[int]:
        floor = op.floor(key)
        return [
            s
            for s in starts_of(assigner, stamp)
            if not is_past(end_of(assigner, s), lateness, floor)
        ]

    return op.record_columns(rows(batch), ts, windows)


def fired_batch(
    op: WindowOperator, fired: list[tuple[int, pa.Array, np.ndarray]], final: bool = True
) -> pa.RecordBatch:
    """The output of windows (of a start each) firing: per window its start, its keys and
    their results."""
    lengths = [len(keys) for _, keys, _ in fired]
    starts = np.repeat(np.array([start for start, _, _ in fired], dtype=np.int64), lengths)
    keys = pa.concat_arrays([k.cast(fired[0][1].type) for _, k, _ in fired])
    values = np.concatenate([v for _, _, v in fired])
    assert not isinstance(op.assigner, Session)
    return op.builtin_batch(keys, starts, ends_of(op.assigner, starts), values, final)
