"""Sliding windows of a built-in kept as columns in memory, by slicing (:mod:`.slicing`): the
columns storage (:class:`~cutline.runtime.eventtime.columnar_windows.Columns`) under the shared
slices' bucketing (:class:`~cutline.runtime.eventtime.bucketing.SharedSlices`)."""

from __future__ import annotations

from cutline.runtime.eventtime.assigners import Sliding
from cutline.runtime.eventtime.bucketing import SharedSlices
from cutline.runtime.eventtime.columnar_windows import ColumnarWindows
from cutline.runtime.eventtime.store import StoreContext


class SlicedWindows(ColumnarWindows):
    """Sliding windows computing a built-in aggregate on the memory backend, by slicing: a
    batch's records are grouped by key and slice and merged into that slice's columns (a
    :class:`~cutline.runtime.eventtime.columnar_windows.WindowColumns`, as a tumbling
    window's), once each, whatever the number of windows a record is in; when a window fires,
    its slices merge per key (and with the columns the window keeps itself)."""

    def __init__(self, context: StoreContext) -> None:
        assert isinstance(context.assigner, Sliding)
        super().__init__(context, SharedSlices(context.assigner))
