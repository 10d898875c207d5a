"""Windows by their start (tumbling, sliding) of a built-in kept as columns in memory (the
memory backend's storage, :class:`Columns`): each window (or slice) keeps its keys and their
accumulators as columns, merged a batch at a time (records grouped by key and window with
Arrow, each window's groups merged into its columns with ``index_in`` and NumPy), and fires as
one batch. No Python runs per record nor per key.

What the windows hold is checkpointed beside the (empty) keyed state as a chain of segments of
its own (:class:`~cutline.runtime.state.columns.ColumnChain`): incremental checkpoints write,
of each window, the keys whose accumulators changed since the checkpoint they build on (each
key's ``version`` says when it last did). Restored at another parallelism, each subtask keeps
the keys of its key groups. A window's arrays are shared with a snapshot being written and are
copied before they change.

:class:`ColumnarWindows` is this storage under a bucketing (:mod:`.bucketing`): tumbling
windows, each its one slice (and, as
:class:`~cutline.runtime.eventtime.sliced_windows.SlicedWindows`, sliding windows' shared
slices).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.runtime.eventtime.aggregations import (
    SAFE,
    UFUNCS,
    Aggregation,
    adds,
    grouped_parts,
    largest,
)
from cutline.runtime.eventtime.assigners import Session
from cutline.runtime.eventtime.bucketing import Bucketing, OneSlice
from cutline.runtime.eventtime.by_start import Result, WindowsByStart, joined
from cutline.runtime.eventtime.layouts import Slicing, WindowParts, WindowState, encode_windows
from cutline.runtime.eventtime.slicing import Part, restrict, window_result
from cutline.runtime.eventtime.store import StoreContext
from cutline.runtime.state.columns import ColumnChain


@dataclass
class WindowColumns:
    """One window (or slice) kept as :class:`Columns`: its keys and their accumulators, as
    columns."""

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


class Columns:
    """The storage of windows (and slices) by their start as columns in memory: a piece is a
    :class:`WindowColumns`."""

    def __init__(self, context: StoreContext) -> None:
        self.aggregation: Aggregation = context.aggregation
        self.kind: str = context.aggregation.kind
        self.chain = ColumnChain(context.state)

    # ------------------------------------------------------------------ pieces

    def restored(self, start: int, parts: list[WindowParts]) -> WindowColumns:
        """A restored window as columns (:func:`~.by_start.joined`). A window that fired for
        some of its keys only (the old subtasks' watermarks differed at the checkpoint, or a
        record within the lateness came for a new key) fires for the others when the watermark
        passes its end."""
        keys, acc, count, flags = joined(parts)
        columns = WindowColumns(
            start,
            keys,
            acc,
            count,
            version=np.zeros(len(flags), dtype=np.int64),
            fired=bool(flags.any()),
        )
        if columns.fired and not flags.all():
            columns.waiting = np.flatnonzero(~flags)
        return columns

    def parts(self, piece: WindowColumns) -> list[Part]:
        return [(piece.keys, piece.acc, piece.count)] if len(piece.keys) else []

    def waiting(self, piece: WindowColumns) -> pa.Array | None:
        return None if piece.waiting is None else piece.keys.take(pa.array(piece.waiting))

    def empty(self, start: int, like: Result | None) -> WindowColumns:
        keys = like[0].slice(0, 0) if like is not None else pa.array([], pa.null())
        return WindowColumns(
            start,
            keys,
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64) if self.aggregation.mean else None,
            version=np.zeros(0, dtype=np.int64),
            born=self.chain.generation,
        )

    def release(self, piece: WindowColumns | None) -> None:
        """(Nothing to give back but the memory.)"""

    def settle(self, pieces: Callable[[], list[WindowColumns]]) -> None:
        """(Columns stay in memory.)"""

    # ---------------------------------------------------------------- results

    def result(
        self,
        piece: WindowColumns,
        keys: pa.Array | None = None,
        positions: np.ndarray | None = None,
    ) -> Result | None:
        if positions is not None:
            assert keys is not None
            return keys, self._values(piece)[positions]
        if keys is not None:
            return window_result([restrict(part, keys) for part in self.parts(piece)], self.kind)
        if not len(piece.keys):
            return None
        return piece.keys, self._values(piece)

    def fire(self, piece: WindowColumns, keep: bool) -> Result | None:
        return self.result(piece)

    # ---------------------------------------------------------------- records

    def merge(
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

    # -------------------------------------------------------------- snapshots

    def encoder(
        self,
        windows: Iterable[WindowColumns],
        slices: Iterable[WindowColumns],
        slicing: Slicing | None,
    ) -> Callable[[int | None], bytes]:
        """What a snapshot holds of the windows and slices (their arrays, shared from now
        on), and how it is encoded as a segment
        (:func:`~cutline.runtime.eventtime.layouts.encode_windows`)."""
        held, sliced = frozen(windows), frozen(slices)
        return lambda since: encode_windows(held, since, sliced, slicing)


class ColumnarWindows(WindowsByStart[WindowColumns]):
    """Windows by their start computing a built-in aggregate (``count``, ``sum``, ``min``,
    ``max``, ``mean``) on the memory backend, as columns (:class:`Columns`) under a
    ``bucketing``: tumbling windows (:class:`~cutline.runtime.eventtime.bucketing.OneSlice`)
    unless told otherwise."""

    def __init__(self, context: StoreContext, bucketing: Bucketing | None = None) -> None:
        assert not isinstance(context.assigner, Session)
        super().__init__(context, Columns(context), bucketing or OneSlice(context.assigner))


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
