"""The timer services, on the state backend's
:class:`~cutline.runtime.state.timers.TimerIndex` (Flink's ``InternalTimerService``):

* :class:`TimerService`: a process function's timers for its current key, on event time or
  processing time, kept as keyed state;
* :class:`WindowTimers`: a window operator's, whatever its layout: when a window fires, when a
  fired one is dropped, and when a part several windows share (a slice) is dropped. They are
  not kept twice: each layout registers them again from its windows when it is restored."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Any

from cutline.runtime.eventtime.lateness import Lateness
from cutline.runtime.state.keygroups import StateError
from cutline.runtime.state.timers import TimerIndex

EVENT = "event"
PROCESSING = "processing"
TIMERS = "_timers"
"""The keyed state of a process function's timers: per key, a tuple of ``(domain, due)``."""


class TimerService:
    """A process function's timers (``ctx.timer_service``), for the key of the record (or
    timer) being processed.

    ``register_event_time_timer(t)`` calls ``on_timer(t, ctx)`` once the watermark reaches
    ``t``; ``register_processing_time_timer(t)`` once the clock does (epoch milliseconds). A
    key has at most one timer per time and domain (registering it again does nothing);
    ``delete_*`` removes one. Timers are keyed state: checkpointed, restored, rescaled."""

    def __init__(self, backend: Any, watermark: Callable[[], int]) -> None:
        self._backend = backend
        self._watermark = watermark
        self._table = backend.value_table(TIMERS)
        self.indexes = {
            EVENT: backend.timer_index(EVENT),
            PROCESSING: backend.timer_index(PROCESSING),
        }
        for key in list(backend.keys(TIMERS)):
            for domain, due in self._table.get(key) or ():
                self.indexes[domain].add(due, key)

    def current_watermark(self) -> int:
        """The watermark this operator has reached (epoch ms; very negative before any)."""
        return self._watermark()

    def current_processing_time(self) -> int:
        """The wall clock, in epoch milliseconds."""
        import time

        return int(time.time() * 1000)

    def register_event_time_timer(self, timestamp: int) -> None:
        self._add(EVENT, _ms(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._add(PROCESSING, _ms(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._remove(EVENT, _ms(timestamp))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._remove(PROCESSING, _ms(timestamp))

    def _add(self, domain: str, due: int) -> None:
        key = self._backend.current_key
        timers = self._table.get(key) or ()
        if (domain, due) in timers:
            return
        self._table[key] = (*timers, (domain, due))
        self.indexes[domain].add(due, key)

    def _remove(self, domain: str, due: int) -> None:
        key = self._backend.current_key
        timers = self._table.get(key) or ()
        if (domain, due) not in timers:
            return
        left = tuple(t for t in timers if t != (domain, due))
        if left:
            self._table[key] = left
        else:
            self._table.delete(key)
        self.indexes[domain].discard(due, key)

    def due(self, domain: str, upto: int) -> Iterator[tuple[int, Hashable]]:
        """Every timer of ``domain`` due by ``upto``, earliest first, taken out of state as it
        fires (one the callback registers, due by ``upto``, fires too)."""
        for due, key, _ in self.indexes[domain].pop_due(upto):
            timers = self._table.get(key) or ()
            left = tuple(t for t in timers if t != (domain, due))
            if left:
                self._table[key] = left
            else:
                self._table.delete(key)
            yield due, key

    def __len__(self) -> int:
        return sum(len(index) for index in self.indexes.values())

    def close(self) -> None:
        for index in self.indexes.values():
            index.close()


Timer = tuple[int, Hashable, Any]
"""A timer that is due: when, for which key (``None``: a timer of every key of a window kept as
columns), and its namespace (which window: its ``(start, end)``, or its start)."""


class WindowTimers:
    """The timer service of a window operator: three indexes of the state backend, by due
    time (event time, or for processing-time windows the clock's):

    * ``to_fire``: the windows not fired yet, at their last millisecond;
    * ``to_drop``: the fired windows kept for the allowed lateness, when they are past;
    * ``parts``: the parts several windows share (slices), when the last of them is past
      (made on first use).

    The operator pops ``to_fire`` then ``to_drop`` as the watermark goes; its window store
    says what they name."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.to_fire: TimerIndex = backend.timer_index("window-fire")
        self.to_drop: TimerIndex = backend.timer_index("window-clean")
        self._parts: TimerIndex | None = None

    @property
    def parts(self) -> TimerIndex:
        if self._parts is None:
            self._parts = self._backend.timer_index("window-slices")
        return self._parts

    def keyed(self, key: Hashable, start: int, end: int, fired: bool, lateness: Lateness) -> None:
        """The timer of a window ``[start, end)`` of ``key`` (kept in keyed state): not fired,
        it fires at its last millisecond; fired, it is dropped when it is past."""
        if fired:
            self.to_drop.add(lateness.cleanup_time(end), key, (start, end))
        else:
            self.to_fire.add(end - 1, key, (start, end))

    def parts_due(self, upto: int) -> Iterator[Timer]:
        """The ``parts`` timers due by ``upto`` (none if no part was ever registered)."""
        if self._parts is None:
            return iter(())
        return self._parts.pop_due(upto)

    @property
    def pending(self) -> bool:
        """Whether any timer waits (of windows, or of parts)."""
        parts = self._parts
        return bool(len(self.to_fire) or len(self.to_drop) or (parts is not None and len(parts)))

    def __len__(self) -> int:
        """The timers of windows (those of parts are not windows')."""
        return len(self.to_fire) + len(self.to_drop)


def _ms(timestamp: Any) -> int:
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise StateError(
            f"a timer's time is an integer of epoch milliseconds, not {timestamp!r} "
            f"({type(timestamp).__name__})"
        )
    return timestamp
