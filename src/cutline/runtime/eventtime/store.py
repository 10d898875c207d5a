"""What a window store is, and what it is given (:class:`StoreContext`): a store holds a window
operator's windows and never sees the operator.

The operator decides: it reads each record's time, keeps the lateness rule
(:class:`~cutline.runtime.eventtime.lateness.Lateness`: which watermark a key is late
against), pops the timers as the watermark goes, and emits what fires and what is late. A
store keeps what the windows hold, in one layout: it puts records into windows (asking the
lateness which are on time, the late ones into
:class:`~cutline.runtime.eventtime.output.LateRecords`), registers the timers of its windows,
and, told which timers are due, makes their results
(:class:`~cutline.runtime.eventtime.output.WindowOutput`). It is made from the context and
restores its windows from the context's restored handles.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cutline.runtime.eventtime.aggregations import Aggregation
from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.lateness import Lateness
from cutline.runtime.eventtime.output import LateRecords, WindowOutput
from cutline.runtime.eventtime.records import RecordColumns
from cutline.runtime.eventtime.spec import WindowSpec
from cutline.runtime.eventtime.timers import Timer, WindowTimers
from cutline.runtime.operators import Batch
from cutline.runtime.state.backend import KeyedSnapshot, KeyedStateBackend
from cutline.runtime.state.config import StateConfig
from cutline.runtime.state.segments import SegmentSource

if TYPE_CHECKING:
    from cutline.runtime.eventtime.early import EarlyRecords

Fired = tuple[Hashable, int, int, Any]
"""A window that fires: key, start, end, accumulator."""


@dataclass(frozen=True)
class Restored:
    """What a window operator was restored from: the keyed state handles of the old subtasks
    whose key groups it now owns (what their ``extra`` kept), where their segments are read
    from, and the checkpoint's id when later checkpoints may build on its chains."""

    handles: Sequence[Mapping[str, Any]] = ()
    store: SegmentSource | None = None
    checkpoint: int | None = None


@dataclass(frozen=True)
class StoreContext:
    """What a window store is given when it is made: what the windows compute, where their
    state and timers are, and whom it asks and tells (the lateness rule, the late records,
    the output). Nothing here is the operator."""

    spec: WindowSpec
    backend: KeyedStateBackend
    """The subtask's keyed state (its key groups)."""
    state: StateConfig
    """How the state is kept and checkpointed (the disk backend's memory)."""
    timers: WindowTimers
    lateness: Lateness
    late: LateRecords
    output: WindowOutput
    records: RecordColumns
    restored: Restored
    early: EarlyRecords | None = None
    """The counts of ``early_records`` (the keyed layout forgets a window's when it goes)."""

    @property
    def assigner(self) -> Tumbling | Sliding | Session:
        return self.spec.assigner

    @property
    def aggregation(self) -> Aggregation:
        return self.spec.aggregation


class WindowStore(Protocol):
    """What a window operator keeps of its windows, in one layout: made from a
    :class:`StoreContext` (restoring the windows of its restored handles), it puts records into
    windows, and is told which of its timers are due."""

    def add(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        """Records with their timestamps into their windows (the late ones to the context's
        :class:`~cutline.runtime.eventtime.output.LateRecords`); what fires again (a fired
        window updated within the lateness)."""
        ...

    def fire(self, due: Iterable[Timer]) -> Batch | None:
        """The windows of the due ``to_fire`` timers fire: their results (each dropped, or kept
        for the lateness: :attr:`~cutline.runtime.eventtime.lateness.Lateness.keeps_fired`)."""
        ...

    def drop(self, due: Iterable[Timer]) -> None:
        """The fired windows of the due ``to_drop`` timers are past: dropped."""
        ...

    def so_far(self) -> Batch | None:
        """The results so far of the windows not fired yet (``final`` false)."""
        ...

    def holds_windows(self) -> bool:
        """Whether any window waits to fire (the operator asks before it moves processing-time
        windows on; a store of windows by their start says so too while it keeps fired
        windows or slices to drop)."""
        ...

    @property
    def open_windows(self) -> int:
        """Windows not fired yet, per key (read from the thread that reports the figures)."""
        ...

    def attach(
        self, taken: KeyedSnapshot, checkpoint_id: int, base: int | None, savepoint: bool
    ) -> None:
        """What the snapshot writes of the windows beside the keyed state, if anything."""
        ...
