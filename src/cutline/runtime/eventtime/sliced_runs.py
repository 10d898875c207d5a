"""Sliding windows of a built-in on the disk backend: slices (:mod:`.slicing`) kept as runs:
the runs storage (:class:`~cutline.runtime.eventtime.run_windows.Runs`) under the shared
slices' bucketing (:class:`~cutline.runtime.eventtime.bucketing.SharedSlices`)."""

from __future__ import annotations

from cutline.runtime.eventtime.assigners import Sliding
from cutline.runtime.eventtime.bucketing import SharedSlices
from cutline.runtime.eventtime.run_windows import RunWindows
from cutline.runtime.eventtime.store import StoreContext


class SlicedRuns(RunWindows):
    """Sliding windows computing a built-in aggregate on the disk backend, by slicing: a
    batch's records are grouped by key and slice and appended to that slice as a run (a
    :class:`~cutline.runtime.eventtime.run_windows.WindowRuns`, as a tumbling window's), once
    each, whatever the number of windows a record is in; when a window fires, the runs of its
    slices merge per key (with those the window holds itself). Slices are spilled and
    compacted as the tumbling windows' runs are."""

    def __init__(self, context: StoreContext) -> None:
        assert isinstance(context.assigner, Sliding)
        super().__init__(context, SharedSlices(context.assigner))
