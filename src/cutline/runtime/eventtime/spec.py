"""What a keyed window operator is asked to do (the fields of
:class:`~cutline.runtime.eventtime.logic.WindowLogic`, which the operators read)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from cutline.runtime.eventtime.aggregations import Aggregation
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.timestamps import TimeColumn


@dataclass(frozen=True)
class WindowSpec:
    """``assigner`` windows of records keyed by ``key``, on event time ``event_time``,
    computing ``aggregation``; a window is kept ``allowed_lateness`` ms after it fires."""

    assigner: Tumbling | Sliding | Session
    aggregation: Aggregation
    key: str | Callable[[Any], Hashable]
    event_time: TimeColumn
    allowed_lateness: int = 0
    time: str = "event"
    """``"event"``: windows of the records' event time, fired by watermarks;
    ``"processing"``: of the time each record arrives here, fired by the clock."""
    early: int | None = None
    """Every this many milliseconds of processing time, each open window's result so far
    (``final`` false), before the final one (``final`` true); ``None``: only the final."""
    early_records: int | None = None
    """Every this many records of a window (per key), its result so far (``final`` false:
    :mod:`~cutline.runtime.eventtime.early`)."""
    keyless: bool = False
    """Windows of the whole stream (``window_all``): one key for every record, which the
    results leave out (a ``process`` function is given ``None`` for it)."""

    @property
    def fires_early(self) -> bool:
        """Whether windows give results before their final one (a ``final`` column says
        which is which)."""
        return self.early is not None or self.early_records is not None

    @property
    def key_column(self) -> str:
        """What the output calls the key: the key's column, or ``key``."""
        return self.key if isinstance(self.key, str) else "key"
