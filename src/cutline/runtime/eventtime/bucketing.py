"""The bucketing of windows by their start, one of the two axes of a window store (the other
is its storage: columns in memory, runs on disk): which piece of state a record goes into,
which windows a piece belongs to, and which pieces a window is made of.

* :class:`OneSlice` (tumbling): a window is its one slice, unshared; a record goes into its
  window itself.
* :class:`SharedSlices` (sliding): time is cut into slices of ``gcd(size, slide)`` ms
  (:mod:`.slicing`), each in ``size / gcd`` windows; a record goes into its one slice, and a
  window is the merge of its slices (and of what it holds itself: a window restored whole).

As Flink's table runtime does (its ``SliceAssigner``: tumbling windows the unshared case of
slicing). A bucketing keeps nothing: it answers. It reads records through the store's context
(:class:`~cutline.runtime.eventtime.store.StoreContext`), asks its lateness which are on time,
and puts the late ones into its late records.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.assigners import (
    Sliding,
    Tumbling,
    assign,
    end_of,
    ends_of,
    starts_of,
)
from cutline.runtime.eventtime.lateness import Lateness
from cutline.runtime.eventtime.layouts import Slicing
from cutline.runtime.eventtime.slicing import last_window_of, slices_in, slices_of
from cutline.runtime.eventtime.store import StoreContext
from cutline.runtime.operators import Batch, rows

Placed = tuple[pa.Array, np.ndarray, Any]
"""Records as (key, start, value) columns: the start of the piece each goes into (a window's,
or a slice's), once per piece; the values (NumPy or Arrow; ``None`` for ``count``)."""


class Bucketing(Protocol):
    """Which pieces records go into, and which pieces a window is made of."""

    adopts: bool
    """Whether a store's later checkpoints may build on the chain it was restored from (it
    holds the windows as the chain does)."""

    def place(self, context: StoreContext, batch: Batch, ts: Any) -> tuple[Placed | None, bool]:
        """A batch's records that are on time as (key, piece start, value) columns (the late
        ones to the context's late records), and whether the pieces are slices shared by windows (else windows
        themselves); ``None``: nothing is left."""
        ...

    def windows_of(self, piece: int) -> Sequence[int]:
        """The starts of the windows a slice starting at ``piece`` belongs to."""
        ...

    def slices_in(self, window: int) -> range:
        """The starts of the slices shared by the window starting at ``window`` (none: it
        holds its records itself)."""
        ...

    def slice_past(self, lateness: Lateness, piece: int) -> int:
        """When a slice starting at ``piece`` is past: the last window holding it is."""
        ...

    def slicing(self, kind: str, live: tuple[int, ...]) -> Slicing | None:
        """What a checkpoint says of the slices besides them (``None``: no slices)."""
        ...


class OneSlice:
    """Tumbling windows: a window is its one slice (unshared), and a record goes into its
    window itself (``assigner``: tumbling; or sliding windows whose records go into each of
    their windows: :class:`SharedSlices` while keys keep a restored watermark)."""

    adopts = True

    def __init__(self, assigner: Tumbling | Sliding) -> None:
        self.assigner = assigner

    def place(
        self, context: StoreContext, batch: Batch, ts: np.ndarray
    ) -> tuple[Placed | None, bool]:
        return window_triples(self.assigner, context, batch, ts), False

    def windows_of(self, piece: int) -> Sequence[int]:
        return (piece,)

    def slices_in(self, window: int) -> range:
        return range(0)

    def slice_past(self, lateness: Lateness, piece: int) -> int:
        return lateness.cleanup_time(end_of(self.assigner, piece))

    def slicing(self, kind: str, live: tuple[int, ...]) -> Slicing | None:
        return None


class SharedSlices:
    """Sliding windows kept as slices of ``gcd(size, slide)`` ms: a record goes into one
    slice, whatever the number of windows it is in, and a window's result is the merge of its
    slices' (and of what it holds itself) when it fires. While keys keep a restored watermark
    (a restore at another parallelism), their records go into their windows themselves
    (:class:`OneSlice`: each key's lateness apart). The first checkpoint after a restore is a
    full one (the restored chain held slices; the store holds those windows whole)."""

    adopts = False

    def __init__(self, assigner: Sliding) -> None:
        self.sliding = assigner
        self._windows = OneSlice(assigner)
        """Where records go while keys keep a restored watermark."""

    def place(
        self, context: StoreContext, batch: Batch, ts: np.ndarray
    ) -> tuple[Placed | None, bool]:
        if context.lateness.floors_differ:  # (into the windows themselves: each key's lateness)
            return self._windows.place(context, batch, ts)
        return slice_triples(self.sliding, context, batch, ts), True

    def windows_of(self, piece: int) -> Sequence[int]:
        return starts_of(self.sliding, piece)

    def slices_in(self, window: int) -> range:
        return slices_in(self.sliding, window)

    def slice_past(self, lateness: Lateness, piece: int) -> int:
        return lateness.cleanup_time(last_window_of(self.sliding, piece) + self.sliding.size)

    def slicing(self, kind: str, live: tuple[int, ...]) -> Slicing | None:
        return Slicing(self.sliding, kind, live)


def window_triples(
    assigner: Tumbling | Sliding,
    context: StoreContext,
    batch: Batch,
    ts: np.ndarray,
) -> Placed | None:
    """A batch's records as (key, window start, value) columns, once per window each is in
    that is not past; the late ones go to the context's late records. Arrow batches of a key
    column take the vectorized path; Python records, nulls, or keys keeping a restored
    watermark the per-record one. ``None``: nothing is left."""
    records, lateness, late = context.records, context.lateness, context.late
    if (
        isinstance(batch, pa.RecordBatch)
        and not lateness.floors_differ
        and records.vectorizable(batch)
    ):
        assert isinstance(records.key, str)
        index, starts = assign(assigner, ts)
        on_time = lateness.on_time(ends_of(assigner, starts))
        late.note(batch, index, on_time)
        if not on_time.all():
            index, starts = index[on_time], starts[on_time]
        if not len(index):
            return None
        taken = pa.array(index)
        return batch.column(records.key).take(taken), starts, records.values(batch, taken)

    def windows(key: Hashable, stamp: int) -> list[int]:
        floor = lateness.floor(key)
        return [
            s
            for s in starts_of(assigner, stamp)
            if not lateness.is_past(end_of(assigner, s), floor)
        ]

    return records.one_by_one(rows(batch), ts, windows)


def slice_triples(
    sliding: Sliding,
    context: StoreContext,
    batch: Batch,
    ts: np.ndarray,
) -> Placed | None:
    """A batch's records as (key, slice start, value) columns, each record once, in its
    slice, unless its last window is past (then late). Arrow batches of a key column take
    the vectorized path, Python records or nulls the per-record one. ``None``: nothing is
    left."""
    records, lateness, late = context.records, context.lateness, context.late
    if not isinstance(batch, pa.RecordBatch) or not records.vectorizable(batch):

        def own(key: Hashable, stamp: int) -> list[int]:
            last = last_window_of(sliding, stamp) + sliding.size
            if lateness.is_past(last, lateness.floor(key)):
                return []
            return [int(slices_of(sliding, np.array([stamp]))[0])]

        return records.one_by_one(rows(batch), ts, own)
    assert isinstance(records.key, str)
    kept = late.on_time(batch, ts, lateness.on_time(last_window_of(sliding, ts) + sliding.size))
    if kept is None:
        return None
    batch, ts = kept
    values = None
    if records.aggregation.takes_values:
        assert records.aggregation.field is not None
        values = batch.column(records.aggregation.field)
    return batch.column(records.key), slices_of(sliding, ts), values
