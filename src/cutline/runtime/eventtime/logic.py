"""The window operator's logic: what the job graph holds of ``keyed.window(...)``, and the
layout its windows are kept in (:meth:`WindowLogic.layout`: a bucketing kept in a storage)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, assert_never

from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.columnar_sessions import ColumnarSessions
from cutline.runtime.eventtime.columnar_windows import ColumnarWindows
from cutline.runtime.eventtime.keyed import KeyedWindows
from cutline.runtime.eventtime.operator import WindowOperator
from cutline.runtime.eventtime.run_windows import RunWindows
from cutline.runtime.eventtime.sliced_runs import SlicedRuns
from cutline.runtime.eventtime.sliced_windows import SlicedWindows
from cutline.runtime.eventtime.spec import WindowSpec
from cutline.runtime.eventtime.store import StoreContext, WindowStore
from cutline.runtime.operators import Logic, OperatorContext
from cutline.runtime.state.config import Backend


class Storage(enum.Enum):
    """Where a window store keeps what its windows hold."""

    KEYED = "keyed state"
    """In the state backend, per key (every window, aggregation and backend)."""
    COLUMNS = "columns in memory"
    """As columns beside the keyed state (a built-in of a key column, the memory backend)."""
    RUNS = "runs on disk"
    """As runs beside the keyed state, spilled to files (a built-in of a key column, the
    disk backend): larger than memory."""


@dataclass(frozen=True)
class WindowLogic(WindowSpec, Logic):
    """A keyed window operator (:class:`WindowSpec`)."""

    keyed = True

    def open(self, ctx: OperatorContext, state: Any) -> WindowOperator:
        return WindowOperator(self, ctx, state, self.layout(ctx.state.backend))

    def storage(self, backend: Backend) -> Storage:
        """Where the windows are kept on state backend ``backend``: as columns (memory) or runs
        (disk) for a built-in of a key column without ``early_records`` (its counts per key
        and window are keyed state), else in keyed state."""
        if not (
            self.aggregation.builtin and isinstance(self.key, str) and self.early_records is None
        ):
            return Storage.KEYED
        match Backend(backend):
            case Backend.DISK:
                return Storage.RUNS
            case Backend.MEMORY:
                return Storage.COLUMNS
            case unknown:
                assert_never(unknown)

    def layout(self, backend: Backend) -> Callable[[StoreContext], WindowStore]:
        """The window store, a bucketing (the assigner's: tumbling, sliding, sessions) kept in
        the storage :meth:`storage` chooses; sessions on disk are kept in keyed state."""
        storage, assigner = self.storage(backend), self.assigner
        match storage:
            case Storage.KEYED:
                return KeyedWindows
            case Storage.COLUMNS:
                match assigner:
                    case Tumbling():
                        return ColumnarWindows
                    case Sliding():
                        return SlicedWindows
                    case Session():
                        return ColumnarSessions
                    case _:
                        assert_never(assigner)
            case Storage.RUNS:
                match assigner:
                    case Tumbling():
                        return RunWindows
                    case Sliding():
                        return SlicedRuns
                    case Session():
                        return KeyedWindows
                    case _:
                        assert_never(assigner)
            case _:
                assert_never(storage)
