"""The lateness rule, in one place (and :class:`Lateness`, what a window store asks of it).

A window whose last millisecond is ``end - 1`` **fires** when the watermark reaches it, and is
kept for records up to ``allowed_lateness`` after that: it is **past** (dropped; a record of
it only late) once ``end - 1 + allowed_lateness`` is at or below the watermark. A record is
late when every window it belongs to is past; for a session: when the session it alone would
open (``[t, t + gap)``) is.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from cutline.protocol.watermarks import MAX_WATERMARK, MIN_WATERMARK
from cutline.runtime.state.keygroups import key_group


def cleanup_time(end: int, lateness: int) -> int:
    """When a window ending at ``end`` (exclusive) is past: ``end - 1 + lateness``, within the
    watermarks' range."""
    return min(MAX_WATERMARK, end - 1 + lateness)


def is_past(end: int, lateness: int, watermark: int) -> bool:
    """Whether a window ending at ``end`` is past at ``watermark``."""
    return cleanup_time(end, lateness) <= watermark


def in_time(ends: np.ndarray, lateness: int, watermark: int) -> np.ndarray:
    """Of windows ending at ``ends``, which are not past at ``watermark`` (a mask)."""
    return (ends - 1 + lateness if lateness else ends - 1) > watermark


class Lateness:
    """The lateness rule of one window operator's subtask, as its window store asks it: the
    watermark a record is late against (the operator's place on its subtask's clock, or, after
    a restore at another parallelism, the one each key's old subtask had reached) and whether
    a window is past. The operator makes it; a store only asks.

    :param allowed: the allowed lateness (ms).
    :param clock: the operator's context (its ``watermark``: its place on the clock).
    :param marks: the watermarks restored subtasks had reached, per range of key groups of
        this subtask (empty: none restored, or restored at the same parallelism).
    :param max_parallelism: the job's number of key groups (which group a key is in).
    """

    def __init__(
        self,
        allowed: int,
        clock: WatermarkClock,
        marks: Sequence[tuple[range, int]] = (),
        max_parallelism: int = 1,
    ) -> None:
        self.allowed = allowed
        self._clock = clock
        self._marks = tuple(marks)
        self._max_parallelism = max_parallelism
        self._ceiling = max((mark for _, mark in self._marks), default=MIN_WATERMARK)

    @property
    def watermark(self) -> int:
        """The operator's watermark (for processing-time windows, the wall clock's time it
        reached)."""
        return self._clock.watermark

    @property
    def floors_differ(self) -> bool:
        """Whether some keys are still late against a higher watermark than the operator's:
        the one their old subtask had reached at a restore at another parallelism
        (:meth:`floor`). Until the watermark passes them all, records take the per-record
        path."""
        return self._clock.watermark < self._ceiling

    def floor(self, key: Hashable) -> int:
        """The watermark a record of ``key`` is late against: the operator's, or, after a
        restore at another parallelism, that of the subtask whose state the key was in."""
        watermark = self._clock.watermark
        if watermark >= self._ceiling:
            return watermark
        group = key_group(key, self._max_parallelism)
        for groups, mark in self._marks:
            if group in groups:
                return max(watermark, mark)
        return watermark

    def is_past(self, end: int, floor: int | None = None) -> bool:
        """Whether a window ending at ``end`` is past (at ``floor``, or the watermark)."""
        return is_past(end, self.allowed, self._clock.watermark if floor is None else floor)

    def on_time(self, ends: np.ndarray) -> np.ndarray:
        """Of windows ending at ``ends``, which are not past at the watermark (a mask)."""
        return in_time(ends, self.allowed, self._clock.watermark)

    def cleanup_time(self, end: int) -> int:
        """When a window ending at ``end`` is past."""
        return cleanup_time(end, self.allowed)

    @property
    def keeps_fired(self) -> bool:
        """Whether a window that fires now is kept for the lateness (else dropped)."""
        return self.allowed > 0 and self._clock.watermark != MAX_WATERMARK


class WatermarkClock(Protocol):
    """Where the lateness reads the watermark: an operator's context (its place on its
    subtask's :class:`~cutline.runtime.eventtime.clock.EventClock`)."""

    @property
    def watermark(self) -> int: ...


def restored_marks(
    handles: Iterable[Mapping[str, Any]], mine: range
) -> tuple[list[tuple[range, int]], int]:
    """What an event-time operator restored from its old subtasks' keyed state handles (their
    ``extra``): per range of this subtask's key groups (``mine``), the watermark the old
    subtask that held them had reached (:class:`Lateness`'s ``marks``), and the late records
    they counted (each old subtask's counted once: by the new subtask that owns its first key
    group)."""
    marks: list[tuple[range, int]] = []
    late = 0
    for handle in handles:
        start, stop = handle.get("key_groups", (0, 0))
        if start in mine:
            late += int(handle.get("late", 0))
        groups = range(max(start, mine.start), min(stop, mine.stop))
        if len(groups) and "watermark" in handle:
            marks.append((groups, int(handle["watermark"])))
    return marks, late
