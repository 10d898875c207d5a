"""Timers of a keyed operator subtask: when to call back for which key.

A timer is ``(due, key, namespace)``: at ``due`` (epoch ms of event time, when the watermark
reaches it; or of processing time, when the clock does), call back for ``key``
(``namespace`` tells two timers of one key apart: a window's ``(start, end)``). Two parts:

* the timers themselves are **keyed state**: they go into checkpoints and savepoints with
  the rest of the operator's state, are redistributed by key group when the job is rescaled,
  and are readable with ``read_state`` (the state ``_timers`` of a process function: per key,
  its ``(domain, due)`` pairs). An operator whose state already says when things are due (a
  window: its end) keeps no second copy;
* a :class:`TimerIndex` orders them by due time, to find those due without looking at every
  key. It is built again from the state when the operator opens (never checkpointed). The
  memory backend's is a heap in memory; the disk backend's is a RocksDB database beside its
  state (:class:`DiskTimerIndex`), so that millions of timers do not live in memory.

The timer service a ``KeyedProcessFunction`` sees as ``ctx.timer_service`` is
:class:`~cutline.runtime.eventtime.timers.TimerService`, on these.
"""

from __future__ import annotations

import heapq
import pickle
import shutil
import struct
import tempfile
from collections.abc import Hashable, Iterator
from typing import Any

from cutline.runtime.state.keygroups import StateError

_DUE = struct.Struct(">Q")
_SHIFT = 2**63  # due times are signed: shifted so that their bytes sort as the numbers do


class TimerIndex:
    """Timers ordered by due time (earliest first); ``namespace`` tells a key's apart."""

    def add(self, due: int, key: Hashable, namespace: Any = None) -> None:
        raise NotImplementedError

    def discard(self, due: int, key: Hashable, namespace: Any = None) -> None:
        raise NotImplementedError

    def pop_due(self, upto: int) -> Iterator[tuple[int, Hashable, Any]]:
        """Remove and yield every timer due at or before ``upto``, earliest first (one added
        meanwhile, due by ``upto``, comes too)."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the index holds (files)."""


class MemoryTimerIndex(TimerIndex):
    """A heap of due times, with the timers of each (the memory backend's)."""

    def __init__(self) -> None:
        self._due: dict[int, set[tuple[Hashable, Any]]] = {}
        self._heap: list[int] = []
        self._count = 0

    def add(self, due: int, key: Hashable, namespace: Any = None) -> None:
        entries = self._due.get(due)
        if entries is None:
            entries = self._due[due] = set()
            heapq.heappush(self._heap, due)
        before = len(entries)
        entries.add((key, namespace))
        self._count += len(entries) - before

    def discard(self, due: int, key: Hashable, namespace: Any = None) -> None:
        entries = self._due.get(due)
        if entries is not None and (key, namespace) in entries:
            entries.remove((key, namespace))
            self._count -= 1

    def pop_due(self, upto: int) -> Iterator[tuple[int, Hashable, Any]]:
        heap = self._heap
        while heap and heap[0] <= upto:
            due = heapq.heappop(heap)
            entries = self._due.pop(due, None)
            if not entries:
                continue
            self._count -= len(entries)
            # a stable order among the timers due at once (keys of any type); one added for
            # this due time meanwhile goes into a new set, taken on the next round
            try:
                ordered = sorted(entries)
            except TypeError:  # keys of several types
                ordered = sorted(entries, key=_order)
            for key, namespace in ordered:
                yield due, key, namespace

    def __len__(self) -> int:
        return self._count


def _order(entry: tuple[Hashable, Any]) -> tuple[str, str]:
    return (repr(entry[0]), repr(entry[1]))


class DiskTimerIndex(TimerIndex):
    """Timers in a RocksDB database of their own (in ``folder``), keyed by due time: only
    RocksDB's caches are in memory."""

    def __init__(self, folder: str | None, name: str) -> None:
        import rocksdict

        try:
            self.path = tempfile.mkdtemp(prefix=f"timers-{name}-", dir=folder)
        except OSError as exc:
            raise StateError(f"cannot create the timers' database: {exc.strerror or exc}") from exc
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        self._db: Any = rocksdict.Rdict(self.path, options)
        writes = rocksdict.WriteOptions()
        writes.disable_wal = True  # type: ignore[method-assign,assignment]  # (a property)
        self._db.set_write_options(writes)
        self._count = 0
        self._cursor: bytes | None = None
        """While :meth:`pop_due` runs: the last key it took (it goes on after it, not from
        the first key over the tombstones of every timer taken)."""
        self._rewind = False
        """A timer was added before the cursor while :meth:`pop_due` ran: it looks again
        from the first key."""

    @staticmethod
    def _key(due: int, key: Hashable, namespace: Any) -> bytes:
        return _DUE.pack(due + _SHIFT) + pickle.dumps((key, namespace), protocol=4)

    def add(self, due: int, key: Hashable, namespace: Any = None) -> None:
        db_key = self._key(due, key, namespace)
        if self._db.get(db_key) is None:
            self._db.put(db_key, b"")
            self._count += 1
            if self._cursor is not None and db_key <= self._cursor:
                self._rewind = True

    def discard(self, due: int, key: Hashable, namespace: Any = None) -> None:
        db_key = self._key(due, key, namespace)
        if self._db.get(db_key) is not None:
            self._db.delete(db_key)
            self._count -= 1

    def pop_due(self, upto: int) -> Iterator[tuple[int, Hashable, Any]]:
        self._cursor, self._rewind = None, False
        try:
            while True:
                start: bytes | None = None if self._rewind else self._cursor
                self._rewind = False
                taken: list[tuple[bytes, int]] = []
                for db_key in self._db.keys(from_key=start):
                    due = _DUE.unpack_from(db_key)[0] - _SHIFT
                    if due > upto or len(taken) == 1000:
                        break
                    taken.append((db_key, due))
                if not taken:
                    return
                self._cursor = taken[-1][0]
                for db_key, due in taken:
                    if self._db.get(db_key) is None:
                        continue  # discarded meanwhile
                    self._db.delete(db_key)
                    self._count -= 1
                    key, namespace = pickle.loads(db_key[_DUE.size :])
                    yield due, key, namespace
        finally:
            self._cursor = None

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        try:
            self._db.close()
        finally:
            shutil.rmtree(self.path, ignore_errors=True)
