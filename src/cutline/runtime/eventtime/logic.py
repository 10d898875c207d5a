"""The window operator's logic: what the job graph holds of ``keyed.window(...)``, and which
operator (layout) it opens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cutline.runtime.eventtime.assigners import Session, Sliding
from cutline.runtime.eventtime.columnar_sessions import ColumnarSessionOperator
from cutline.runtime.eventtime.columnar_windows import ColumnarWindowOperator
from cutline.runtime.eventtime.keyed import WindowOperator
from cutline.runtime.eventtime.sliced_windows import SlicedWindowOperator
from cutline.runtime.eventtime.spec import WindowSpec
from cutline.runtime.operators import Logic, OperatorContext


@dataclass(frozen=True)
class WindowLogic(WindowSpec, Logic):
    """A keyed window operator (:class:`WindowSpec`): the columnar layout for a built-in of a
    key column on the memory backend (without ``early_records``), else the keyed one."""

    keyed = True

    def open(self, ctx: OperatorContext, state: Any) -> WindowOperator:
        if (
            self.aggregation.builtin
            and isinstance(self.key, str)
            and ctx.state.backend == "memory"
            and self.early_records is None  # (counts per key and window: the keyed layout)
        ):
            if isinstance(self.assigner, Session):
                return ColumnarSessionOperator(self, ctx, state)
            if isinstance(self.assigner, Sliding):
                return SlicedWindowOperator(self, ctx, state)
            return ColumnarWindowOperator(self, ctx, state)
        return WindowOperator(self, ctx, state)
