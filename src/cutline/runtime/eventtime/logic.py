"""The window operator's logic: what the job graph holds of ``keyed.window(...)``, and the
layout its windows are kept in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cutline.runtime.eventtime.assigners import Session, Sliding
from cutline.runtime.eventtime.columnar_sessions import ColumnarSessions
from cutline.runtime.eventtime.columnar_windows import ColumnarWindows
from cutline.runtime.eventtime.keyed import KeyedWindows
from cutline.runtime.eventtime.operator import WindowOperator, WindowStore
from cutline.runtime.eventtime.run_windows import RunWindows
from cutline.runtime.eventtime.sliced_runs import SlicedRuns
from cutline.runtime.eventtime.sliced_windows import SlicedWindows
from cutline.runtime.eventtime.spec import WindowSpec
from cutline.runtime.operators import Logic, OperatorContext


@dataclass(frozen=True)
class WindowLogic(WindowSpec, Logic):
    """A keyed window operator (:class:`WindowSpec`)."""

    keyed = True

    def open(self, ctx: OperatorContext, state: Any) -> WindowOperator:
        return WindowOperator(self, ctx, state, self.layout(ctx.state.backend))

    def layout(self, backend: str) -> type[WindowStore]:
        """Where the windows are kept: as columns for a built-in of a key column (without
        ``early_records``: its counts per key and window are keyed state), on the disk backend
        as runs (tumbling and sliding windows), else in keyed state."""
        if self.aggregation.builtin and isinstance(self.key, str) and self.early_records is None:
            if backend == "disk":
                if isinstance(self.assigner, Session):
                    return KeyedWindows
                return SlicedRuns if isinstance(self.assigner, Sliding) else RunWindows
            if isinstance(self.assigner, Session):
                return ColumnarSessions
            if isinstance(self.assigner, Sliding):
                return SlicedWindows
            return ColumnarWindows
        return KeyedWindows
