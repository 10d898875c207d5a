"""Sliding windows of a built-in in the columnar layout, by slicing (:mod:`.slicing`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.columnar_windows import ColumnarWindows, WindowColumns, frozen
from cutline.runtime.eventtime.layouts import Slicing, encode_windows
from cutline.runtime.eventtime.operator import WindowOperator
from cutline.runtime.eventtime.slicing import Part
from cutline.runtime.eventtime.sliding import SlidingBySlices
from cutline.runtime.operators import Batch


class SlicedWindows(SlidingBySlices, ColumnarWindows):
    """Sliding windows computing a built-in aggregate on the memory backend, by slicing
    (:class:`~cutline.runtime.eventtime.sliding.SlidingBySlices`): a batch's records are
    grouped by key and slice and merged into that slice's columns (a
    :class:`WindowColumns`, as a tumbling window's), once each, whatever the number of
    windows a record is in; when a window fires, its slices merge per key (and with the
    columns the window keeps itself)."""

    def __init__(self, op: WindowOperator) -> None:
        self._slicing(op)
        super().__init__(op)

    def _own_parts(self, own: WindowColumns) -> list[Part]:
        return [(own.keys, own.acc, own.count)] if len(own.keys) else []

    def _slice_parts(self, piece: WindowColumns) -> list[Part]:
        return [(piece.keys, piece.acc, piece.count)]

    def _waiting(self, own: WindowColumns) -> pa.Array | None:
        return None if own.waiting is None else own.keys.take(pa.array(own.waiting))

    def _frozen(self) -> Callable[[int | None], bytes]:
        held, slices = frozen(self.windows.values()), frozen(self.slices.values())
        slicing = Slicing(
            self.sliding,
            self.aggregation.kind,
            tuple(sorted(self._scheduled | set(self.windows))),
        )
        return lambda since: encode_windows(held, since, slices, slicing)

    def _into_windows(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        return ColumnarWindows.add(self, batch, ts)

    def _into_slices(self, keys: pa.Array, starts: np.ndarray, values: Any) -> list[Any]:
        """Merge (key, slice start, value) triples into the slices' columns."""
        found = self._grouped_into(self.slices, self._add_slice, keys, starts, values)
        return [(piece.start, these) for piece, these, _ in found]

    def _drop_slice(self, start: int) -> None:
        self.slices.pop(start, None)

    def _empty(self, window: int, result: tuple[pa.Array, Any] | None) -> WindowColumns:
        """A window without columns of its own (it fired, and keeps the flag)."""
        keys = result[0].slice(0, 0) if result is not None else pa.array([], pa.null())
        mean = self.aggregation.mean
        return WindowColumns(
            window,
            keys,
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64) if mean else None,
            version=np.zeros(0, dtype=np.int64),
            born=self.chain.generation,
        )
