"""The keyed layout of a window operator's windows (every window, aggregation and backend):
the storage in keyed state, under the assigner's bucketing. Per key, its windows in keyed
state ``windows`` (:class:`~cutline.runtime.eventtime.keyed_by_start.KeyedByStart`:
``{window start: (accumulator, fired)}``; or :class:`~.keyed_sessions.KeyedSessions`: a
sorted tuple of ``(start, end, accumulator, fired)``), and a timer per window in the
operator's :class:`~cutline.runtime.eventtime.timers.WindowTimers` (when it fires, and when a
fired one is dropped).

What a window keeps is keyed state of the operator (checkpointed, restored, and redistributed
by key group with the rest); the timers are registered again from it when the store is made.
Values in state are never changed in place: every update stores a new one.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Protocol, assert_never

import numpy as np

from cutline.runtime.eventtime.assigners import Session, Sliding, Tumbling
from cutline.runtime.eventtime.keyed_by_start import KeyedByStart
from cutline.runtime.eventtime.keyed_sessions import KeyedSessions
from cutline.runtime.eventtime.layouts import WINDOWS
from cutline.runtime.eventtime.store import Fired, StoreContext
from cutline.runtime.eventtime.timers import Timer
from cutline.runtime.operators import Batch
from cutline.runtime.state.backend import KeyedSnapshot
from cutline.runtime.state.keygroups import key_group
from cutline.runtime.state.segments import SegmentSource


class KeyedBucketing(Protocol):
    """The windows of one key in keyed state, as a bucketing keeps them (its value), and
    records into them."""

    def read(self, handle: Mapping[str, Any], store: SegmentSource) -> dict[Hashable, Any]:
        """The windows a restored handle holds (of either layout), per key."""
        ...

    def combined(self, old: Any, new: Any) -> Any:
        """A key's windows from two handles."""
        ...

    def windows_of(self, value: Any) -> Iterable[tuple[int, int, bool]]:
        """A key's windows: start, end, whether fired."""
        ...

    def open_of(self, key: Hashable, value: Any) -> list[Fired]:
        """A key's windows not fired yet, with their accumulators."""
        ...

    def fired(self, value: Any, start: int, end: int, keep: bool) -> tuple[Any, Any] | None:
        """A key's window fires: its windows after, and its accumulator (``None``: gone)."""
        ...

    def dropped(self, value: Any, start: int) -> Any:
        """A key's windows without the fired one starting at ``start``."""
        ...

    def add(self, batch: Batch, ts: np.ndarray) -> list[Fired]:
        """Records into their windows (the late ones to the late records); the fired windows
        (kept for the lateness) to fire again."""
        ...


def bucketing_of(context: StoreContext, table: Any) -> KeyedBucketing:
    """The bucketing of the context's assigner, on the keyed layout's ``table``."""
    assigner = context.assigner
    match assigner:
        case Session():
            return KeyedSessions(context, table)
        case Tumbling() | Sliding():
            return KeyedByStart(context, table)
        case _:
            assert_never(assigner)


class KeyedWindows:
    """The keyed layout of a window operator's windows (every window, aggregation and
    backend): per key, in keyed state, as the assigner's bucketing keeps them."""

    def __init__(self, context: StoreContext) -> None:
        self.context = context
        self.backend = context.backend
        self.table = context.backend.value_table(WINDOWS)
        self.timers = context.timers
        self.fire_timers = context.timers.to_fire
        """Windows not fired yet, by their last millisecond (namespace: start, end)."""
        self.bucketing = bucketing_of(context, self.table)
        self._restore_windows()

    def _restore_windows(self) -> None:
        """The restored windows in the keyed layout, whichever layout wrote them (a checkpoint
        of the memory backend keeps a built-in's windows as columns:
        :mod:`~cutline.runtime.eventtime.layouts`), and their timers."""
        mine, maximum = self.backend.key_groups, self.backend.max_parallelism
        restored = self.context.restored
        store = restored.store
        for handle in restored.handles:
            if store is None:
                break
            start, stop = handle.get("key_groups", (0, 0))
            whole = range(start, stop) == mine
            for key, value in self.bucketing.read(handle, store).items():
                if not whole and key_group(key, maximum) not in mine:
                    continue  # rescaled: the keys of my key groups only
                old = self.table.get(key)
                self.table[key] = value if old is None else self.bucketing.combined(old, value)
        # from the restored windows: each one not fired fires at its end, each fired one is
        # dropped after the lateness
        lateness = self.context.lateness
        for key in list(self.backend.keys(WINDOWS)):
            value = self.table.get(key)
            if value is None:
                continue
            for start, end, fired in self.bucketing.windows_of(value):
                self.timers.keyed(key, start, end, fired, lateness)

    @property
    def open_windows(self) -> int:
        """Windows not fired yet."""
        return len(self.fire_timers)

    def attach(
        self, taken: KeyedSnapshot, checkpoint_id: int, base: int | None, savepoint: bool
    ) -> None:
        """(The windows are keyed state: the backend's snapshot holds them.)"""

    def add(self, batch: Batch, ts: np.ndarray) -> Batch | None:
        refired = self.bucketing.add(batch, ts)
        return self.context.output.results(refired) if refired else None

    def holds_windows(self) -> bool:
        return bool(len(self.fire_timers))

    def so_far(self) -> Batch | None:
        found: list[Fired] = []
        for key in list(self.backend.keys(WINDOWS)):
            value = self.table.get(key)
            if value is not None:
                found += self.bucketing.open_of(key, value)
        return self.context.output.results(found, final=False) if found else None

    def fire(self, due: Iterable[Timer]) -> Batch | None:
        """Each due window of a key fires: its accumulator, dropped from state, or marked
        fired and kept for the lateness."""
        results: list[Fired] = []
        lateness, early = self.context.lateness, self.context.early
        keep = lateness.keeps_fired
        for _, key, (start, end) in due:
            if early is not None:
                early.forget(key, start, end)
            found = self.bucketing.fired(self.table.get(key), start, end, keep)
            if found is None:
                continue
            value, acc = found
            if keep:
                self.timers.keyed(key, start, end, True, lateness)
            self._store(key, value)
            results.append((key, start, end, acc))
        return self.context.output.results(results) if results else None

    def drop(self, due: Iterable[Timer]) -> None:
        for _, key, (start, _end) in due:
            value = self.table.get(key)
            if value is not None:
                self._store(key, self.bucketing.dropped(value, start))

    def _store(self, key: Hashable, value: Any) -> None:
        if value:
            self.table[key] = value
        else:
            self.table.delete(key)
