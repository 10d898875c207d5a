"""Sliding windows of a built-in on the disk backend: slices (:mod:`.slicing`) kept as runs
(:mod:`.run_windows`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from cutline.runtime.eventtime.layouts import Slicing, encode_runs
from cutline.runtime.eventtime.operator import WindowOperator
from cutline.runtime.eventtime.run_windows import RunWindows, WindowRuns, grouped_runs, runs_of
from cutline.runtime.eventtime.slicing import Part
from cutline.runtime.eventtime.sliding import SlidingBySlices
from cutline.runtime.operators import Batch


class SlicedRuns(SlidingBySlices, RunWindows):
    """Sliding windows computing a built-in aggregate on the disk backend, by slicing
    (:class:`~cutline.runtime.eventtime.sliding.SlidingBySlices`): a batch's records are
    grouped by key and slice and appended to that slice as a run (a :class:`WindowRuns`, as
    a tumbling window's), once each, whatever the number of windows a record is in; when a
    window fires, the runs of its slices merge per key (with those the window holds itself).
    Slices are spilled and compacted as the tumbling windows' runs are."""

    def __init__(self, op: WindowOperator) -> None:
        self._slicing(op)
        super().__init__(op)

    def _holders(self) -> list[WindowRuns]:
        return [*self.windows.values(), *self.slices.values()]

    def _own_parts(self, own: WindowRuns) -> list[Part]:
        return [run.part for run in own.runs]

    def _slice_parts(self, piece: WindowRuns) -> list[Part]:
        return [run.part for run in piece.runs]

    def _waiting(self, own: WindowRuns) -> pa.Array | None:
        return own.waiting

    def _frozen(self) -> Callable[[int | None], bytes]:
        held, slices = runs_of(self.windows.values()), runs_of(self.slices.values())
        kind = str(self.aggregation.kind)
        slicing = Slicing(self.sliding, kind, tuple(sorted(self._scheduled | set(self.windows))))
        return lambda since: encode_runs(held, since, kind, slices, slicing)

    def _into_windows(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        return RunWindows.add(self, batch, ts)

    def _into_slices(self, keys: pa.Array, starts: np.ndarray, values: Any) -> list[Any]:
        """Each slice's groups of (key, slice start, value) triples appended to it as a run."""
        found = []
        for start, run in grouped_runs(keys, starts, values, self.aggregation.kind, self.chain):
            self.held += run.held
            piece = self.slices.get(start)
            if piece is None:
                self._add_slice(WindowRuns(start, (run,), born=run.number))
            else:
                self._append(piece, run)
            found.append((start, run.keys))
        self._spill_if_full()
        return found

    def _drop_slice(self, start: int) -> None:
        self._release(self.slices.pop(start, None))

    def _empty(self, window: int, result: tuple[pa.Array, Any] | None) -> WindowRuns:
        return WindowRuns(window, (), born=self.chain.generation)
